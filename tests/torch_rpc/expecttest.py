"""The part of the expecttest package that torch's test utilities use.

torch.testing._internal.common_utils imports expecttest, which Debian 12 does
not package: its TestCase is unittest's, with inline expectations compared as
plain strings (no rewriting of the test's source).
"""
import unittest

ACCEPT = False


class TestCase(unittest.TestCase):
    def assertExpectedInline(self, actual, expect, skip=0):
        self.assertEqual(actual, expect)

    def assertExpectedRaisesInline(self, exc_type, callable, expect, *args, **kwargs):
        with self.assertRaises(exc_type) as caught:
            callable(*args, **kwargs)
        self.assertEqual(str(caught.exception), expect)
