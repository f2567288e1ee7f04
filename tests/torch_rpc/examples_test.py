#!/usr/bin/python3
"""torch's "simple end-to-end" distributed autograd program and a parameter server
(examples/python/) give the same results on the TIDE backend as on TensorPipe: the
same printed gradients count, tensors after the optimizer step, losses and weights,
to the last digit (the same arithmetic runs on both; only the transport differs).

    PYTHONPATH=build/python /usr/bin/python3 tests/torch_rpc/examples_test.py examples/python
"""
import os
import subprocess
import sys
import unittest

EXAMPLES = sys.argv.pop(1) if len(sys.argv) > 1 else os.path.join(
    os.path.dirname(__file__), "..", "..", "examples", "python")


def run(example, backend):
    out = subprocess.run([sys.executable, os.path.join(EXAMPLES, example), "--backend", backend],
                         capture_output=True, text=True, timeout=240)
    if out.returncode != 0:
        raise AssertionError(f"{example} --backend {backend} failed ({out.returncode}):\n"
                             f"{out.stderr[-3000:]}")
    return out.stdout.splitlines()


class ExamplesTest(unittest.TestCase):
    def check(self, example, expect_lines):
        tide = run(example, "tide")
        tensorpipe = run(example, "tensorpipe")
        self.assertEqual(len(tide), expect_lines, tide)
        self.assertEqual(tide, tensorpipe)

    def test_dist_autograd_end_to_end(self):
        self.check("dist_autograd_e2e.py", 3)

    def test_parameter_server(self):
        self.check("parameter_server.py", 5)


if __name__ == "__main__":
    unittest.main()
