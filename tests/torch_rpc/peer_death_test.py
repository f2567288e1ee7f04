#!/usr/bin/python3
"""A peer SIGKILLed in the middle of calls fails the Python calls pending to it at
once, not after the rpc timeout; so do later calls to it.

worker0 is this process; worker1 a child process serving calls that block. The child
prints a line when the first call is running; the test kills it on that line.

    PYTHONPATH=build/python /usr/bin/python3 tests/torch_rpc/peer_death_test.py
"""
import os
import socket
import subprocess
import sys
import threading
import time
import unittest

import torch
import torch.distributed.rpc as rpc

import tide.torch_rpc

RPC_TIMEOUT = 60.0  # seconds; the calls must fail long before it
PROMPT = 5.0  # seconds: what "at once" allows on a loaded 2-core machine


def block_forever():
    # One write: print() writes the newline apart, and the three calls' lines
    # would interleave.
    sys.stdout.write("in call\n")
    sys.stdout.flush()
    threading.Event().wait()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def options(port):
    return tide.torch_rpc.TideRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=RPC_TIMEOUT)


def child(port):
    rpc.init_rpc("worker1", rank=1, world_size=2, backend=rpc.BackendType.TIDE,
                 rpc_backend_options=options(port))
    rpc.shutdown()


class PeerDeathTest(unittest.TestCase):
    def test_sigkilled_peer_fails_pending_calls_promptly(self):
        port = free_port()
        peer = subprocess.Popen([sys.executable, __file__, "--child", str(port)],
                                stdout=subprocess.PIPE, text=True)
        try:
            rpc.init_rpc("worker0", rank=0, world_size=2, backend=rpc.BackendType.TIDE,
                         rpc_backend_options=options(port))
            pending = [rpc.rpc_async("worker1", block_forever) for _ in range(3)]
            self.assertEqual(peer.stdout.readline().strip(), "in call")
            killed = time.monotonic()
            peer.kill()
            for fut in pending:
                with self.assertRaisesRegex(RuntimeError, "connection to worker 'worker1'.* lost"):
                    fut.wait()
            took = time.monotonic() - killed
            print(f"pending calls failed {took * 1000:.1f} ms after the SIGKILL", file=sys.stderr)
            self.assertLess(took, PROMPT)
            began = time.monotonic()
            with self.assertRaisesRegex(RuntimeError, "worker1"):
                rpc.rpc_sync("worker1", torch.add, args=(torch.ones(1), 1))
            self.assertLess(time.monotonic() - began, PROMPT)
        finally:
            peer.kill()
            peer.wait()
            rpc.shutdown(graceful=False)


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--child":
        child(int(sys.argv[2]))
    else:
        unittest.main()
