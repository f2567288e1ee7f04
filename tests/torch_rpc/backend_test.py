#!/usr/bin/python3
"""The TIDE backend as torch's registry and init_rpc see it: BackendType.TIDE and
BackendType.TENSORPIPE both work after the import, options are built and checked, and
what the backend does not do is refused with an error saying so. One worker each.

    PYTHONPATH=build/python /usr/bin/python3 tests/torch_rpc/backend_test.py
"""
import socket
import unittest

import torch
import torch.distributed.rpc as rpc

import tide.torch_rpc
from tide.torch_rpc import TideRpcBackendOptions


def init_method():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"tcp://127.0.0.1:{s.getsockname()[1]}"


def one_worker(backend, options):
    rpc.init_rpc("solo", rank=0, world_size=1, backend=backend, rpc_backend_options=options)
    try:
        return rpc.rpc_sync("solo", torch.add, args=(torch.ones(3), 1)), rpc.api._get_current_rpc_agent()
    finally:
        rpc.shutdown()


class BackendTest(unittest.TestCase):
    def test_both_members_of_the_refreshed_enum_work(self):
        self.assertIs(rpc.BackendType, rpc.backend_registry.BackendType)
        self.assertEqual(rpc.BackendType.TIDE, tide.torch_rpc.BACKEND)
        self.assertTrue(rpc.backend_registry.backend_registered("TIDE"))
        result, agent = one_worker(rpc.BackendType.TIDE, TideRpcBackendOptions(init_method=init_method()))
        self.assertTrue(torch.equal(result, torch.full((3,), 2.0)))
        self.assertIsInstance(agent, tide.torch_rpc.TideAgent)
        opts = rpc.TensorPipeRpcBackendOptions(init_method=init_method())
        result, agent = one_worker(rpc.BackendType.TENSORPIPE, opts)
        self.assertTrue(torch.equal(result, torch.full((3,), 2.0)))
        self.assertNotIsInstance(agent, tide.torch_rpc.TideAgent)

    def test_the_backend_is_inferred_from_its_options(self):
        rpc.init_rpc("solo", rank=0, world_size=1,
                     rpc_backend_options=TideRpcBackendOptions(init_method=init_method()))
        try:
            self.assertIsInstance(rpc.api._get_current_rpc_agent(), tide.torch_rpc.TideAgent)
        finally:
            rpc.shutdown()

    def test_options_from_the_registry(self):
        o = rpc.backend_registry.construct_rpc_backend_options(
            rpc.BackendType.TIDE, rpc_timeout=7, init_method="tcp://1.2.3.4:5",
            num_worker_threads=3, transports=["tcp"], lanes=4, token="s3cret")
        self.assertIsInstance(o, rpc.RpcBackendOptions)
        self.assertEqual((o.rpc_timeout, o.init_method, o.num_worker_threads), (7, "tcp://1.2.3.4:5", 3))
        self.assertEqual((o.transports, o.lanes, o.token, o.poll_us), (["tcp"], 4, "s3cret", 300))
        self.assertEqual(o.device_maps, {})

    def test_what_the_backend_does_not_do_is_refused(self):
        with self.assertRaisesRegex(ValueError, "CPU tensors only"):
            TideRpcBackendOptions(device_maps={"w1": {0: 1}})
        with self.assertRaisesRegex(ValueError, "CPU tensors only"):
            TideRpcBackendOptions().set_device_map("w1", {0: 1})
        with self.assertRaisesRegex(ValueError, "rpc_timeout"):
            TideRpcBackendOptions(rpc_timeout=-1)
        with self.assertRaisesRegex(RuntimeError, "transports must include tcp"):
            one_worker(rpc.BackendType.TIDE,
                       TideRpcBackendOptions(init_method=init_method(), transports=["shm"]))
        with self.assertRaisesRegex(RuntimeError, "unknown rpc transport 'ib'"):
            one_worker(rpc.BackendType.TIDE,
                       TideRpcBackendOptions(init_method=init_method(), transports=["ib", "tcp"]))
        with self.assertRaisesRegex(TypeError, "TideRpcBackendOptions"):
            rpc.backend_registry.init_backend(rpc.BackendType.TIDE, store=torch.distributed.HashStore(),
                                              name="x", rank=0, world_size=1,
                                              rpc_backend_options=rpc.TensorPipeRpcBackendOptions())
        with self.assertRaisesRegex(ValueError, "needs world_size"):
            rpc.backend_registry.init_backend(rpc.BackendType.TIDE, store=torch.distributed.HashStore(),
                                              name="x", rank=0, world_size=None,
                                              rpc_backend_options=TideRpcBackendOptions())
        self.assertFalse(rpc.api._is_current_rpc_agent_set())


if __name__ == "__main__":
    unittest.main()
