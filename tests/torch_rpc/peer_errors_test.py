#!/usr/bin/python3
"""What a TIDE worker tells a peer about an error is the error, not its process.

torch's C++ errors (c10::Error) carry a backtrace with this process's code
addresses and library paths; TensorPipe sends them to the caller as they are.
The TIDE backend sends the message alone.

    PYTHONPATH=build/python /usr/bin/python3 tests/torch_rpc/peer_errors_test.py
"""
import socket
import unittest

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp

import tide.torch_rpc


def worker(rank, port, results):
    opts = tide.torch_rpc.TideRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=60)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, backend=rpc.BackendType.TIDE,
                 rpc_backend_options=opts)
    try:
        if rank == 1:
            calls = {
                "rpc_sync": lambda: rpc.rpc_sync(
                    "w0", torch.add, args=(torch.ones(2), torch.ones(3))),
                "remote": lambda: rpc.remote(
                    "w0", torch.add, args=(torch.ones(2), torch.ones(3))).to_here(),
            }
            for name, call in calls.items():
                try:
                    call()
                    results[name] = "no error"
                except RuntimeError as e:
                    results[name] = str(e)
    finally:
        rpc.shutdown()


class PeerErrorsTest(unittest.TestCase):
    def test_a_c10_error_reaches_the_caller_without_its_backtrace(self):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        with mp.Manager() as manager:
            results = manager.dict()
            mp.spawn(worker, args=(port, results), nprocs=2, join=True)
            results = dict(results)
        self.assertEqual(set(results), {"rpc_sync", "remote"})
        for name, text in results.items():
            with self.subTest(call=name):
                self.assertIn("must match the size of tensor b", text)
                self.assertNotIn("Exception raised from", text)
                self.assertNotIn("frame #", text)
                self.assertNotIn(" + 0x", text)


if __name__ == "__main__":
    unittest.main()
