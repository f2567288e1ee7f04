#!/usr/bin/python3
"""tide.elastic's TCPStore against torch's own TCPStore server and against
tide's, in torch's two dialects. By default it speaks the dialect of the torch
this interpreter has (torch < 2.2: legacy; >= 2.2: modern), so it works
against that torch's server with nothing set; tide's server serves both; a
bad dialect is refused with the choices.

    PYTHONPATH=build/python /usr/bin/python3 tests/elastic_py/store_test.py
"""
import importlib.metadata
import unittest
from datetime import timedelta

import torch.distributed as dist

from tide.elastic.store import TCPStore


def this_torchs_dialect():
    major, minor = (int(part) for part in importlib.metadata.version("torch").split(".")[:2])
    return "modern" if (major, minor) >= (2, 2) else "legacy"


def torch_server():
    """torch's own TCPStore server on a free port (its pure TCP server where
    torch would pick libuv: Debian's torch 2.x is built without it)."""
    extra = {"use_libuv": False} if "use_libuv" in (dist.TCPStore.__init__.__doc__ or "") else {}
    return dist.TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=30),
                         wait_for_workers=False, **extra)


class StoreTest(unittest.TestCase):
    def check_every_call(self, store, peer, prefix):
        """store's calls, seen by peer (another client of the same server)."""
        a, n, late = f"{prefix}/a", f"{prefix}/n", f"{prefix}/late"
        store.set(a, b"1")
        self.assertEqual(peer.get(a), b"1")
        self.assertEqual(store.add(n, 2), 2)
        self.assertEqual(peer.add(n, 3), 5)
        self.assertEqual(store.compare_set(a, b"1", b"2"), b"2")
        self.assertEqual(peer.get(a), b"2")
        peer.set(late, b"x")
        store.wait([late], timedelta(seconds=10))
        self.assertTrue(store.check([a, late]))
        self.assertTrue(store.delete_key(late))
        self.assertFalse(store.check([late]))
        with self.assertRaises(TimeoutError):
            store.wait([f"{prefix}/never"], timedelta(milliseconds=200))

    def test_by_default_this_torchs_dialect_against_this_torchs_server(self):
        server = torch_server()
        client = TCPStore("127.0.0.1", server.port, timeout=timedelta(seconds=30))
        self.assertEqual(client.dialect, this_torchs_dialect())
        self.check_every_call(client, server, "default")

    def test_either_dialect_against_tides_server(self):
        host = TCPStore("127.0.0.1", 0, is_master=True, timeout=timedelta(seconds=30))
        for dialect in ("legacy", "modern"):
            with self.subTest(dialect=dialect):
                client = TCPStore("127.0.0.1", host.port, timeout=timedelta(seconds=30),
                                  dialect=dialect)
                self.assertEqual(client.dialect, dialect)
                self.check_every_call(client, host, dialect)

    def test_a_bad_dialect_names_the_choices(self):
        with self.assertRaisesRegex(ValueError, "'legacy'.*'modern'.*None.*not 'v2'"):
            TCPStore("127.0.0.1", 1, dialect="v2")


if __name__ == "__main__":
    unittest.main()
