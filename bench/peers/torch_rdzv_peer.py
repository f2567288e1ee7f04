#!/usr/bin/python3
"""torch's c10d dynamic rendezvous as a benchmark peer: time for N participants to finish a round.

    torch_rdzv_peer.py --n N [--procs P] [--reps R] [--timeout S]

Every rep has a fresh store and run id. P worker processes are forked first, while this
process has no other thread (torch's store server is a C++ thread; forking after it
starts could copy a held lock), then this process hosts a torch.distributed.TCPStore on
127.0.0.1 (port 0, the kernel picks the port) as the torchrun agent does. Each worker runs
about N/P threads; each thread is one participant with its own handler, so its own
C10dRendezvousBackend and its own store connection:

    get_rendezvous_handler(RendezvousParameters(backend="c10d", endpoint="127.0.0.1:PORT",
        run_id=RUN, min_nodes=N, max_nodes=N, is_host=False, join_timeout=S, read_timeout=S))

Once every handler exists, one "go" (end of file on a pipe all workers read) releases all
participants into next_rendezvous(). One JSON line per rep on stdout:

  {"impl": "torch-c10d", "n": N, "procs": P, "rep": I, "ok": true,
   "round_s": go -> the last participant returns, "median_s": go -> the median return,
   "connect_s": port handed to the workers -> the last worker has all its handlers}
  {"impl": "torch-c10d", "n": N, "procs": P, "rep": I, "ok": false, "error": "..."}

A rep is ok only if the ranks are a permutation of 0..N-1 and every world size is N.
It fails if a participant raises, a worker dies, setup takes over SETUP_S, or the round
is not complete within --timeout seconds of go; then every worker is killed (SIGKILL)
and reaped, so each rep ends within timeout + SETUP_S + a few seconds. Log lines go to
stderr. The exit status is 0 once every rep has its line, failed or not.

torch 1.13's handler sleeps a random 0-0.3 s before its first join and re-reads the
state every 1 s while it waits (dynamic_rendezvous.py); that is measured as it is, torch
is not patched. Run with /usr/bin/python3 (Debian's python3-torch): the python3 first on
PATH may lack torch.
"""

import argparse
import ctypes
import datetime
import json
import math
import os
import select
import signal
import statistics
import sys
import threading
import time

# Imported once here, before any fork, so workers start without paying for it.
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

PR_SET_PDEATHSIG = 1
SETUP_S = 30.0  # fork, start the store, create every handler
EXIT_S = 5.0  # for workers to leave on their own once done, before SIGKILL


def log(msg):
    print(f"torch_rdzv_peer: {msg}", file=sys.stderr, flush=True)


def thread_count():
    return len(os.listdir("/proc/self/task"))


def write_msg(fd, obj):
    """One JSON line; each is written whole (small, and one writer thread at a time)."""
    os.write(fd, (json.dumps(obj) + "\n").encode())


def worker(n, count, run_id, timeout_s, port_r, go_r, out_w):
    """Body of a forked worker: `count` participants, each one thread with its own handler."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    if os.getppid() == 1:
        return 1
    write_lock = threading.Lock()

    def send(obj):
        with write_lock:
            write_msg(out_w, obj)

    line = b""
    while not line.endswith(b"\n"):
        chunk = os.read(port_r, 64)
        if not chunk:
            return 1  # the parent gave up before starting its store
        line += chunk
    port = int(line)
    join_s = max(1, math.ceil(timeout_s))
    handlers = []
    try:
        for _ in range(count):
            params = RendezvousParameters(
                backend="c10d",
                endpoint=f"127.0.0.1:{port}",
                run_id=run_id,
                min_nodes=n,
                max_nodes=n,
                is_host=False,
                join_timeout=join_s,
                read_timeout=join_s,
            )
            handlers.append(get_rendezvous_handler(params))
    except Exception as e:
        send({"error": f"creating a handler: {type(e).__name__}: {e}"})
        return 1

    go = threading.Event()

    def participant(handler):
        go.wait()
        try:
            _, rank, world_size = handler.next_rendezvous()
            done = time.monotonic()
            send({"rank": rank, "world_size": world_size, "t": done})
        except Exception as e:
            send({"error": f"next_rendezvous: {type(e).__name__}: {e}"})

    threads = [threading.Thread(target=participant, args=(h,), daemon=True) for h in handlers]
    for t in threads:
        t.start()
    send({"ready": True})
    while os.read(go_r, 64):  # "go" is end of file: the parent closed its end
        pass
    go.set()
    for t in threads:
        t.join()  # a hang here is ended by the parent's SIGKILL
    return 0


class Workers:
    """Forked workers; close() kills (SIGKILL) and reaps whatever is still there."""

    def __init__(self):
        self.pids = []

    def fork(self, body, close_fds):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                for fd in close_fds:
                    os.close(fd)
                code = body()
            except BaseException as e:  # never return into the parent's code
                log(f"worker {os.getpid()}: {type(e).__name__}: {e}")
            finally:
                os._exit(code)
        self.pids.append(pid)
        return pid

    def wait_all(self, timeout_s):
        give_up = time.monotonic() + timeout_s
        while self.pids and time.monotonic() < give_up:
            for pid in list(self.pids):
                if os.waitpid(pid, os.WNOHANG)[0]:
                    self.pids.remove(pid)
            time.sleep(0.01)

    def close(self):
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in self.pids:
            os.waitpid(pid, 0)
        self.pids = []


class Lines:
    """Reads JSON lines from the workers' pipes; expected[fd] is how many that worker owes."""

    def __init__(self, expected):
        self.expected = dict(expected)
        self.bufs = {fd: b"" for fd in expected}

    def read(self, deadline):
        """[message] as they come; None at the deadline; raises if a worker left owing lines."""
        left = deadline - time.monotonic()
        if left <= 0:
            return None
        ready = select.select(list(self.bufs), [], [], left)[0]
        if not ready:
            return None
        out = []
        for fd in ready:
            chunk = os.read(fd, 65536)
            if not chunk:
                if self.expected[fd] > 0:
                    raise RuntimeError("a worker exited early")
                del self.bufs[fd]  # done and gone
                continue
            self.bufs[fd] += chunk
            *lines, self.bufs[fd] = self.bufs[fd].split(b"\n")
            for x in lines:
                if x:
                    self.expected[fd] -= 1
                    out.append(json.loads(x))
        return out


def one_rep(n, procs, rep, timeout_s):
    """Runs one rendezvous round; returns the result fields, raises if the rep failed."""
    if thread_count() != 1:
        log(f"warning: forking with {thread_count()} threads in this process")
    run_id = f"torch_rdzv_peer_{os.getpid()}_{rep}_{time.time_ns()}"
    counts = [n // procs + (1 if i < n % procs else 0) for i in range(procs)]
    workers = Workers()
    go_r, go_w = os.pipe()
    parent_fds = [go_w]  # the parent's pipe ends; a worker closes those it inherits
    port_ws, out_rs = [], []
    server = None
    try:
        for count in counts:
            port_r, port_w = os.pipe()
            out_r, out_w = os.pipe()
            workers.fork(
                lambda c=count, p=port_r, o=out_w: worker(n, c, run_id, timeout_s, p, go_r, o),
                close_fds=parent_fds + [port_w, out_r],
            )
            os.close(port_r)
            os.close(out_w)
            port_ws.append(port_w)
            out_rs.append(out_r)
            parent_fds += [port_w, out_r]
        os.close(go_r)
        go_r = -1

        setup_deadline = time.monotonic() + SETUP_S
        server = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False,
                          timeout=datetime.timedelta(seconds=max(1, math.ceil(timeout_s))))
        port = server.port
        t_port = time.monotonic()
        for fd in port_ws:
            os.write(fd, f"{port}\n".encode())
        lines = Lines({fd: 1 + c for fd, c in zip(out_rs, counts)})
        ready = 0
        while ready < procs:
            got = lines.read(setup_deadline)
            if got is None:
                raise RuntimeError(f"setup: {ready}/{procs} workers had their handlers "
                                   f"after {SETUP_S:.0f} s")
            for msg in got:
                if "error" in msg:
                    raise RuntimeError(msg["error"])
                ready += 1
        connect_s = time.monotonic() - t_port

        t_go = time.monotonic()
        os.close(go_w)  # go: every worker sees end of file at once
        parent_fds.remove(go_w)
        go_w = -1
        deadline = t_go + timeout_s
        results = []
        while len(results) < n:
            got = lines.read(deadline)
            if got is None:
                raise RuntimeError(f"timeout: {len(results)}/{n} participants returned "
                                   f"within {timeout_s:g} s")
            for msg in got:
                if "error" in msg:
                    raise RuntimeError(f"after {time.monotonic() - t_go:.2f} s, with "
                                       f"{len(results)}/{n} returned: {msg['error']}")
                results.append(msg)
        ranks = sorted(r["rank"] for r in results)
        if ranks != list(range(n)):
            raise RuntimeError(f"ranks are not a permutation of 0..{n - 1}: {ranks}")
        sizes = sorted({r["world_size"] for r in results})
        if sizes != [n]:
            raise RuntimeError(f"world sizes {sizes}, expected {n}")
        done = sorted(r["t"] - t_go for r in results)
        workers.wait_all(EXIT_S)
        return {"round_s": done[-1], "median_s": statistics.median(done),
                "connect_s": connect_s}
    finally:
        workers.close()
        for fd in parent_fds + ([go_r] if go_r >= 0 else []):
            os.close(fd)
        del server  # stops torch's server thread before the next rep forks


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, required=True, help="participants")
    p.add_argument("--procs", type=int, help="worker processes; default min(N, 8)")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--timeout", type=float, default=60.0,
                   help="a round not complete this long after go fails, s")
    a = p.parse_args()
    procs = min(a.n, 8) if a.procs is None else a.procs
    if a.n < 1 or not 1 <= procs <= a.n or a.reps < 1 or a.timeout <= 0:
        p.error("need N >= 1, 1 <= P <= N, R >= 1 and S > 0")
    for rep in range(a.reps):
        head = {"impl": "torch-c10d", "n": a.n, "procs": procs, "rep": rep}
        log(f"rep {rep}: N={a.n} in {procs} processes")
        try:
            fields = one_rep(a.n, procs, rep, a.timeout)
            out = {**head, "ok": True, **{k: round(v, 6) for k, v in fields.items()}}
            log(f"rep {rep}: round {fields['round_s']:.3f} s, median {fields['median_s']:.3f} s,"
                f" connect {fields['connect_s']:.3f} s")
        except Exception as e:  # a failed rep is a result, not a crash
            out = {**head, "ok": False, "error": str(e)}
            log(f"rep {rep}: failed: {e}")
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
