#!/usr/bin/python3
"""torch.distributed.rpc (TensorPipe) as a benchmark peer: call latency and rate, tensor echo.

    torch_rpc_peer.py [--calls N] [--transport uv|shm|default] [--channel NAME]
    torch_rpc_peer.py --rank 0|1 --init-method tcp://HOST:PORT [...]
    torch_rpc_peer.py --backend tide [...]

With --backend tide the same program runs on tide's backend of torch.distributed.rpc
(tide.torch_rpc, from build/python or wherever PYTHONPATH finds it): the lines then say
"impl":"tide-py", and --transport uv|shm maps to its transports ["tcp"] and ["shm","tcp"].

Two ranks, "worker0" (the driver) and "worker1" (the server), each initialised with
TensorPipeRpcBackendOptions(init_method=..., num_worker_threads=16, rpc_timeout=120).
With --rank, this process is that one rank and HOST:PORT is where rank 0 hosts the
store, so the two ranks can run in different network namespaces. Without --rank, both
ranks are spawned here (torch.multiprocessing, "spawn") on 127.0.0.1, on a port the
kernel picked. --transport sets TensorPipe's _transports (uv is its TCP transport, shm
its shared-memory one; default lets it choose, which means shm on one host) and
--channel its _channels (how tensor data moves: basic rides the transport, cma is
process_vm_readv, mpt_uv is several TCP connections; default lets it choose).

The driver measures, each after a warm-up, and prints one JSON line per figure:

  {"impl":"torch","metric":"sync_rtt_us","median":...,"p99":...,"n":N}
      rpc_sync of a no-op taking one int, N round trips, microseconds.
  {"impl":"torch","metric":"async_calls_per_s","window":W,"value":...,"calls":M}
      rpc_async of the same no-op, at most W outstanding (W = 64 and 256): a new call
      starts as soon as one completes; M calls over the wall time from the first start
      to the last completion.
  {"impl":"torch","metric":"echo","size_bytes":B,"rtt_ms_median":...,
   "bytes_each_way_per_s":...,"n":R}
      rpc_sync of a function returning its float32 tensor argument, B = 1 MiB (200 reps)
      and 64 MiB (12 reps); bytes_each_way_per_s = B / median round trip. The echoed
      tensor is checked to equal the one sent (once per size, after the warm-up).

p99 is the nearest-rank percentile: the ceil(0.99 n)-th smallest. With --transport or
--channel set, the lines also carry "transport" and "channel". Nothing else goes to
stdout; logs go to stderr. The exit status is 0 once every figure is printed, 1 if a
call failed, the echo came back different, or init_rpc did not complete within
--init-timeout seconds (torch itself would wait 30 minutes for a missing rank).

Run with /usr/bin/python3 (Debian's python3-torch 1.13.1): the python3 first on PATH may
lack torch. Across network namespaces torch picks its own listen addresses: set
TP_SOCKET_IFNAME (TensorPipe's TCP transport) and GLOO_SOCKET_IFNAME (the Gloo group
init_rpc creates) to the interface the other rank can reach, else it binds to whatever
the host name resolves to, or to lo. Left to choose, TensorPipe moves tensors between
two namespaces of one machine with its cma channel (process_vm_readv: one kernel, one
PID namespace), not over the network; between two hosts it would pick --transport uv
--channel mpt_uv, so pass those to measure that.
"""

import argparse
import ctypes
import faulthandler
import json
import math
import os
import signal
import socket
import statistics
import sys
import threading
import time

import torch
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp

PR_SET_PDEATHSIG = 1
SERVER = "worker1"
WINDOWS = (64, 256)
ECHO_SIZES = ((1 << 20, 200), (64 << 20, 12))  # (bytes, reps)
ECHO_WARMUP = 3


def log(msg):
    print(f"torch_rpc_peer: {msg}", file=sys.stderr, flush=True)


def noop(x):
    return None


def echo(t):
    return t


def echo_clone(t):
    return t.clone()


def value(x):
    return x


class Box:
    """What an RRef proxy reaches: a value with a method, living on the server."""

    def __init__(self, v):
        self.v = v

    def get(self):
        return self.v


def take_rref(r):
    return None


def bench_forward(rref, x):
    return rref.local_value()(x)


def bench_param_rrefs(rref):
    return [rpc.RRef(p) for p in rref.local_value().parameters()]


def bench_weight(rref):
    return rref.local_value().weight.detach().clone()


def p99(xs):
    xs = sorted(xs)
    return xs[max(0, math.ceil(0.99 * len(xs)) - 1)]


def emit(head, **fields):
    print(json.dumps({**head, **fields}, separators=(",", ":")), flush=True)


def measure_sync(head, calls, warmup):
    for _ in range(warmup):
        rpc.rpc_sync(SERVER, noop, args=(1,))
    clock = time.perf_counter_ns
    rtts = []
    for _ in range(calls):
        t0 = clock()
        rpc.rpc_sync(SERVER, noop, args=(1,))
        rtts.append((clock() - t0) / 1e3)
    emit(head, metric="sync_rtt_us", median=round(statistics.median(rtts), 2),
         p99=round(p99(rtts), 2), n=calls)


def measure_async(head, window, calls, warmup):
    """Sliding window: a slot frees when a call completes, and the next call takes it."""
    slots = threading.BoundedSemaphore(window)
    errors = []

    def completed(fut):
        try:
            fut.wait()
        except Exception as e:  # recorded here: this runs on one of torch's threads
            errors.append(e)
        slots.release()

    for _ in range(warmup):
        rpc.rpc_async(SERVER, noop, args=(1,)).wait()
    t0 = time.perf_counter()
    for _ in range(calls):
        slots.acquire()
        rpc.rpc_async(SERVER, noop, args=(1,)).add_done_callback(completed)
    for _ in range(window):  # every slot back: every call completed
        slots.acquire()
    elapsed = time.perf_counter() - t0
    if errors:
        raise RuntimeError(f"{len(errors)} of {calls} async calls failed, the first: "
                           f"{type(errors[0]).__name__}: {errors[0]}")
    emit(head, metric="async_calls_per_s", window=window, value=round(calls / elapsed, 1),
         calls=calls)


def measure_echo(head, size, reps, fn=echo, metric="echo"):
    sent = torch.rand(size // 4, dtype=torch.float32)
    for _ in range(ECHO_WARMUP):
        got = rpc.rpc_sync(SERVER, fn, args=(sent,))
    if not torch.equal(got, sent):
        raise RuntimeError(f"the echo of a {size}-byte tensor came back different")
    rtts = []
    for _ in range(reps):
        t0 = time.perf_counter()
        rpc.rpc_sync(SERVER, fn, args=(sent,))
        rtts.append(time.perf_counter() - t0)
    median = statistics.median(rtts)
    emit(head, metric=metric, size_bytes=size, rtt_ms_median=round(median * 1e3, 3),
         bytes_each_way_per_s=round(size / median, 1), n=reps)


def timed_us(fn, calls, warmup):
    """Median and p99 of fn()'s wall time, in microseconds."""
    for _ in range(warmup):
        fn()
    clock = time.perf_counter_ns
    times = []
    for _ in range(calls):
        t0 = clock()
        fn()
        times.append((clock() - t0) / 1e3)
    return round(statistics.median(times), 2), round(p99(times), 2)


def measure_rrefs(head, calls, warmup):
    """remote()+to_here(), a proxy call, and an RRef passed user -> user (to this
    rank itself: a fork request to the owner, then the child's accept)."""
    def remote_to_here():
        rpc.remote(SERVER, value, args=(1,)).to_here()
    median, tail = timed_us(remote_to_here, calls, warmup)
    emit(head, metric="remote_to_here_us", median=median, p99=tail, n=calls)
    box = rpc.remote(SERVER, Box, args=(1,))
    median, tail = timed_us(lambda: box.rpc_sync().get(), calls, warmup)
    emit(head, metric="proxy_rtt_us", median=median, p99=tail, n=calls)
    held = rpc.remote(SERVER, value, args=(1,))
    held.to_here()
    me = rpc.get_worker_info().name
    median, tail = timed_us(lambda: rpc.rpc_sync(me, take_rref, args=(held,)), calls, warmup)
    emit(head, metric="rref_pass_us", median=median, p99=tail, n=calls)


def measure_dist_autograd(head, steps, warmup, batch=16, dim=64):
    """The model-parallel step of shared/peers/rpc/dist_autograd_bench.py: a local
    Linear, a Linear on the server (reached with an RRef, or as a RemoteModule), loss,
    distributed backward and a DistributedOptimizer(SGD) step, in one context."""
    import torch.distributed.autograd as dist_autograd
    from torch.distributed.nn import RemoteModule
    from torch.distributed.optim import DistributedOptimizer
    torch.manual_seed(0)
    x = torch.randn(batch, dim, requires_grad=True)
    local = torch.nn.Linear(dim, dim)
    for variant in ("rref", "remotemod"):
        if variant == "rref":
            lin = rpc.remote(SERVER, torch.nn.Linear, args=(dim, dim))
            params = rpc.rpc_sync(SERVER, bench_param_rrefs, args=(lin,))

            def forward(h):
                return rpc.rpc_sync(SERVER, bench_forward, args=(lin, h))
        else:
            module = RemoteModule(f"{SERVER}/cpu", torch.nn.Linear, args=(dim, dim))
            params = module.remote_parameters()
            forward = module.forward
        opt = DistributedOptimizer(
            torch.optim.SGD, params + [rpc.RRef(p) for p in local.parameters()], lr=0.001)

        def step():
            with dist_autograd.context() as ctx:
                y = forward(local(x))
                dist_autograd.backward(ctx, [y.sum()])
                opt.step(ctx)

        if variant == "rref":
            w0 = rpc.rpc_sync(SERVER, bench_weight, args=(lin,))
            expect = w0 - 0.001 * torch.ones(batch, dim).t().mm(local(x).detach())
            step()
            w1 = rpc.rpc_sync(SERVER, bench_weight, args=(lin,))
            emit(head, metric="dist_autograd_check",
                 ok=bool(torch.allclose(w1, expect, atol=1e-5)))
        median, tail = timed_us(step, steps, warmup)
        emit(head, metric="dist_autograd_step_us", variant=variant, batch=batch, dim=dim,
             median=median, p99=tail, n=steps)


def drive(a):
    head = {"impl": "tide-py" if a.backend == "tide" else "torch"}
    if a.transport != "default":
        head["transport"] = a.transport
    if a.channel != "default":
        head["channel"] = a.channel
    measure_sync(head, a.calls, a.warmup)
    for window in WINDOWS:
        calls = a.async_calls if a.async_calls else max(4 * a.calls, 20 * window)
        measure_async(head, window, calls, a.warmup)
    for size, reps in ECHO_SIZES:
        measure_echo(head, size, reps)
    # The server returns a new tensor (a copy of what came), not the one it
    # received.
    for size, reps in ECHO_SIZES:
        measure_echo(head, size, reps, echo_clone, "echo_clone")
    measure_rrefs(head, max(a.calls // 5, 1), max(a.warmup // 5, 1))
    measure_dist_autograd(head, max(a.calls // 25, 1), max(a.warmup // 25, 1))


def die_with(parent):
    """A spawned rank is killed when its parent goes (killed, say) instead of running on."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() != parent:  # it went before prctl
        os._exit(1)


def run_rank(rank, a, init_method, parent=None):
    """One rank from init_rpc to shutdown; raises if the driver's measurement failed."""
    if parent is not None:
        die_with(parent)
    torch.set_num_threads(1)  # no intra-op pool: two ranks share the cores
    options = {"init_method": init_method, "num_worker_threads": 16, "rpc_timeout": 120}
    if a.backend == "tide":
        import tide.torch_rpc
        if a.transport != "default":
            options["transports"] = ["tcp"] if a.transport == "uv" else ["shm", "tcp"]
        backend_options = tide.torch_rpc.TideRpcBackendOptions(**options)
        backend = rpc.BackendType.TIDE
    else:
        if a.transport != "default":
            options["_transports"] = [a.transport]
        if a.channel != "default":
            options["_channels"] = [a.channel]
        backend_options = rpc.TensorPipeRpcBackendOptions(**options)
        backend = rpc.BackendType.TENSORPIPE
    t0 = time.perf_counter()
    # init_rpc waits in C++ holding the GIL, where no Python timer or signal handler
    # runs; faulthandler's watchdog is a C thread: it prints where this process is
    # stuck ("Timeout (0:01:00)!") and exits with status 1.
    faulthandler.dump_traceback_later(a.init_timeout, exit=True)
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2,
                 backend=backend, rpc_backend_options=backend_options)
    faulthandler.cancel_dump_traceback_later()
    log(f"rank {rank}: init_rpc({init_method}) took {time.perf_counter() - t0:.2f} s")
    try:
        if rank == 0:
            drive(a)
    finally:
        # Graceful: waits for the other rank's outstanding work, so the server stays up
        # until the driver is done.
        rpc.shutdown()
    log(f"rank {rank}: done")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rank", type=int, choices=(0, 1),
                   help="run only this rank (0 drives, 1 serves); needs --init-method")
    p.add_argument("--init-method", help="tcp://HOST:PORT where rank 0 hosts the store")
    p.add_argument("--calls", type=int, default=5000, help="rpc_sync round trips measured")
    p.add_argument("--async-calls", type=int,
                   help="rpc_async calls per window; default max(4 x calls, 20 x window)")
    p.add_argument("--warmup", type=int, default=500, help="calls before each measurement")
    p.add_argument("--init-timeout", type=float, default=60.0,
                   help="give up if init_rpc has not completed after this long, s")
    p.add_argument("--backend", default="tensorpipe", choices=("tensorpipe", "tide"))
    p.add_argument("--transport", default="default", choices=("default", "uv", "shm"))
    p.add_argument("--channel", default="default",
                   help="TensorPipe channel: basic, cma, mpt_uv, ... (default: its choice)")
    a = p.parse_args()
    if (a.calls < 1 or a.warmup < 0 or a.init_timeout <= 0
            or (a.async_calls is not None and a.async_calls < 1)):
        p.error("need --calls >= 1, --async-calls >= 1, --warmup >= 0 and --init-timeout > 0")
    if (a.rank is None) != (a.init_method is None):
        p.error("--rank and --init-method go together")
    try:
        if a.rank is not None:
            run_rank(a.rank, a, a.init_method)
        else:
            init_method = f"tcp://127.0.0.1:{free_port()}"
            mp.start_processes(run_rank, args=(a, init_method, os.getpid()), nprocs=2, join=True,
                               start_method="spawn")
    except Exception as e:
        log(f"failed: {type(e).__name__}: {e}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
