#!/usr/bin/python3
"""Each call a TIDE worker serves starts from its thread's torch state as found.

torch 1.13's profiled requests leave a RecordFunction callback on the thread
that served them: the next profiled request that thread serves records each op
twice, and the caller's profiler drops both copies ("no remote events"). The
backend puts the thread's torch state back after each request, so the remote
events of every profiled call arrive, however often a thread is reused; so does
grad mode that a function turns off and does not turn back on.

Two processes; w0 has two threads, so each serves many of w1's calls.

    PYTHONPATH=build/python /usr/bin/python3 tests/torch_rpc/thread_state_test.py
"""
import socket
import unittest

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch.autograd.profiler_legacy import profile

import tide.torch_rpc

CALLS = 12  # six times each of w0's two threads


def grad_off():
    torch.set_grad_enabled(False)


def grad_on():
    return torch.is_grad_enabled()


def remote_ops(prof):
    return [e.name for e in prof.function_events if e.node_id == 0]


def profiled(rank, port, mode):
    opts = tide.torch_rpc.TideRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=60,
        num_worker_threads=2 if rank == 0 else 4)
    rpc.init_rpc(f"w{rank}", rank=rank, world_size=2, backend=rpc.BackendType.TIDE,
                 rpc_backend_options=opts)
    try:
        if rank == 1:
            globals()[mode]()
    finally:
        rpc.shutdown()


def profile_sync():
    for i in range(CALLS):
        with profile() as prof:
            rpc.rpc_sync("w0", torch.mul, args=(torch.ones(1), torch.ones(1)))
        ops = remote_ops(prof)
        assert len([n for n in ops if n.endswith("aten::mul")]) == 1, (i, ops)


def profile_remote():
    for i in range(CALLS):
        with profile() as prof:
            rref = rpc.remote("w0", torch.mul, args=(torch.ones(1), torch.ones(1)))
            rref.to_here()
            rref._get_profiling_future().wait()
        ops = remote_ops(prof)
        assert len([n for n in ops if n.endswith("aten::mul")]) == 1, (i, ops)


def grad_mode():
    for i in range(CALLS):
        rpc.rpc_sync("w0", grad_off)
        assert rpc.rpc_sync("w0", grad_on), f"call {i}: grad mode stayed off on w0's thread"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class ThreadStateTest(unittest.TestCase):
    def start_workers(self, mode):
        # Forked: each worker a copy of this process, torch already imported.
        mp.start_processes(profiled, args=(free_port(), mode), nprocs=2, join=True,
                           start_method="fork")

    def test_every_profiled_sync_call_brings_its_remote_events(self):
        self.start_workers("profile_sync")

    def test_every_profiled_remote_call_brings_its_remote_events(self):
        self.start_workers("profile_remote")

    def test_grad_mode_a_function_turns_off_is_not_left_on_the_thread(self):
        self.start_workers("grad_mode")


if __name__ == "__main__":
    unittest.main()
