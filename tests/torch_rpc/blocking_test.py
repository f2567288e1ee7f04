#!/usr/bin/python3
"""Functions that block on a worker of the TIDE backend never stall its other calls.

torch's contract: up to num_worker_threads functions run at once on a worker, blocking
or not, while it goes on reading and answering calls. Three processes (torch's
multiprocessing, as users start them): w0 serves functions that wait on a
threading.Condition, w1 and w2 call it. Each wait gives up after 20 s and returns
False; a worker that stops reading while its functions block lets no release in.

    PYTHONPATH=build/python /usr/bin/python3 tests/torch_rpc/blocking_test.py
"""
import socket
import threading
import unittest

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch.distributed.optim import DistributedOptimizer

import tide.torch_rpc

WAIT = 20  # seconds a blocked function waits before it gives up

# ---- w0's state and functions ----

_cond = threading.Condition()
_state = {"released": 0, "waiting": 0, "readers": 0, "writer": False}
_model = None


def wait_fn(k):
    """Blocks until k releases have happened."""
    with _cond:
        _state["waiting"] += 1
        _cond.notify_all()
        ok = _cond.wait_for(lambda: _state["released"] >= k, timeout=WAIT)
        _state["waiting"] -= 1
        return ok


def rel_fn():
    with _cond:
        _state["released"] += 1
        _cond.notify_all()


def waiters(n):
    """Blocks until n calls wait in wait_fn."""
    with _cond:
        return _cond.wait_for(lambda: _state["waiting"] >= n, timeout=WAIT)


def acquire_read():
    with _cond:
        ok = _cond.wait_for(lambda: not _state["writer"], timeout=WAIT)
        _state["readers"] += ok
        return ok


def release_read():
    with _cond:
        _state["readers"] -= 1
        _cond.notify_all()


def acquire_write():
    with _cond:
        ok = _cond.wait_for(lambda: not _state["writer"] and _state["readers"] == 0, timeout=WAIT)
        _state["writer"] |= ok
        return ok


def release_write():
    with _cond:
        _state["writer"] = False
        _cond.notify_all()


def parameter_rrefs():
    global _model
    if _model is None:
        torch.manual_seed(0)
        _model = torch.nn.Linear(4, 1)
    return [rpc.RRef(p) for p in _model.parameters()]


def forward(x):
    return _model(x)


def weights():
    return _model.weight.detach().clone()


def bounce_then_wait():
    """Waits for a release that comes back to this worker through w2."""
    with _cond:
        target = _state["released"] + 1
    bounced = rpc.rpc_async("w2", call_back_release)
    ok = wait_fn(target)
    bounced.wait()
    # And a call to itself while this one runs.
    return ok and rpc.rpc_sync("w0", torch.add, args=(torch.ones(1), 1)).item() == 2


def call_back_release():
    rpc.rpc_sync("w0", rel_fn)


def add_one_over_rpc(x):
    return rpc.rpc_sync("w0", torch.add, args=(x, 1))


@rpc.functions.async_execution
def add_two_via_w2(x):
    # The chain's callback blocks in another call.
    return rpc.rpc_async("w2", torch.add, args=(x, 1)).then(
        lambda f: rpc.rpc_sync("w2", torch.add, args=(f.wait(), 1)))


def probe_w0(timeout):
    """From w2: a call to w0 whose threads are all blocked; its error message."""
    try:
        rpc.rpc_sync("w0", torch.add, args=(torch.ones(1), 1), timeout=timeout)
        return "no error"
    except RuntimeError as e:
        return str(e)


# ---- the three processes ----

def run(rank, port, threads, scenario, n):
    name = f"w{rank}"
    opts = tide.torch_rpc.TideRpcBackendOptions(
        init_method=f"tcp://127.0.0.1:{port}", rpc_timeout=60,
        num_worker_threads=threads if rank == 0 else 16)
    rpc.init_rpc(name, rank=rank, world_size=3, backend=rpc.BackendType.TIDE,
                 rpc_backend_options=opts)
    try:
        globals()[scenario](rank, n, threads)
    finally:
        rpc.shutdown()


def release_lock(rank, n, threads):
    """The reproduction: w1 makes n calls that wait, w2 releases them one by one."""
    if rank == 1:
        futs = [rpc.rpc_async("w0", wait_fn, args=(i + 1,)) for i in range(n)]
        results = [f.wait() for f in futs]
        assert results == [True] * n, f"waits returned {results}"
    elif rank == 2:
        assert rpc.rpc_sync("w0", waiters, args=(n,)), f"{n} waits never ran at once on w0"
        for _ in range(n):
            rpc.rpc_sync("w0", rel_fn)


def parameter_server(rank, n, threads):
    """Two trainers take a readers-writer lock on w0 around a distributed autograd
    backward (read) and a DistributedOptimizer step (write)."""
    if rank == 0:
        return
    params = rpc.rpc_sync("w0", parameter_rrefs)
    before = rpc.rpc_sync("w0", weights)
    opt = DistributedOptimizer(torch.optim.SGD, params, lr=0.05)
    for step in range(n):
        x = torch.full((8, 4), float(rank + step))
        with dist_autograd.context() as ctx:
            assert rpc.rpc_sync("w0", acquire_read), "read lock not granted"
            loss = rpc.rpc_sync("w0", forward, args=(x,)).pow(2).mean()
            dist_autograd.backward(ctx, [loss])
            rpc.rpc_sync("w0", release_read)
            assert rpc.rpc_sync("w0", acquire_write), "write lock not granted"
            opt.step(ctx)
            rpc.rpc_sync("w0", release_write)
    assert not torch.equal(rpc.rpc_sync("w0", weights), before), "no step changed the weights"


def nested(rank, n, threads):
    """A function that blocks while its worker serves calls back to it."""
    if rank == 1:
        assert all(f.wait() for f in [rpc.rpc_async("w0", bounce_then_wait) for _ in range(n)])


def past_the_threads(rank, n, threads):
    """threads + 1 blocked functions: the extra one waits; the worker still reads,
    completes its own calls, and callers time out; getMetrics() counts the threads."""
    if rank == 1:
        futs = [rpc.rpc_async("w0", wait_fn, args=(k,)) for k in range(1, threads + 2)]
        assert [f.wait() for f in futs] == [True] * (threads + 1)
    elif rank == 0:
        assert waiters(threads), "the functions never ran"
        metrics = rpc.api._get_current_rpc_agent().get_metrics()
        assert metrics["agent.thread_pool_size"] == str(threads), metrics
        assert metrics["agent.num_idle_threads"] == "0", metrics
        # w2's call needs a thread of w0: it times out.
        message = rpc.rpc_sync("w2", probe_w0, args=(0.5,))
        assert "RPC ran for more than" in message, message
        # This worker's own call completes: its loop reads the reply.
        assert rpc.rpc_sync("w2", torch.add, args=(torch.ones(1), 2)).item() == 3
        for _ in range(threads + 1):
            rel_fn()


def blocking_callbacks(rank, n, threads):
    """Callbacks that block in another call stall no reply: a then() on the caller,
    an async_execution chain on the callee."""
    if rank == 1:
        futs = []
        for i in range(n):
            x = torch.full((2,), float(i))
            futs.append(rpc.rpc_async("w0", torch.add, args=(x, 0)).then(
                lambda f: rpc.rpc_sync("w0", torch.add, args=(f.wait(), 100))))
            futs.append(rpc.rpc_async("w0", add_two_via_w2, args=(x,)))
            futs.append(rpc.rpc_async("w0", add_one_over_rpc, args=(x,)))
        for i in range(n):
            x = torch.full((2,), float(i))
            assert torch.equal(futs[3 * i].wait(), x + 100)
            assert torch.equal(futs[3 * i + 1].wait(), x + 2)
            assert torch.equal(futs[3 * i + 2].wait(), x + 1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class BlockingTest(unittest.TestCase):
    def start_workers(self, scenario, n, threads=16):
        # Forked: each worker a copy of this process, torch already imported.
        mp.start_processes(run, args=(free_port(), threads, scenario, n), nprocs=3,
                           join=True, start_method="fork")

    def test_releases_reach_a_worker_whose_functions_wait(self):
        for n in (1, 2, 6, 16):
            with self.subTest(n=n):
                self.start_workers("release_lock", n, threads=max(16, n + 1))

    def test_parameter_server_lock_around_backward_and_optimizer_step(self):
        self.start_workers("parameter_server", 4)

    def test_a_function_waits_while_its_worker_serves_calls_back_to_it(self):
        self.start_workers("nested", 3, threads=4)

    def test_the_function_past_the_threads_waits_and_nothing_else_stalls(self):
        self.start_workers("past_the_threads", 0, threads=2)

    def test_callbacks_that_block_stall_no_reply(self):
        self.start_workers("blocking_callbacks", 8)


if __name__ == "__main__":
    unittest.main()
