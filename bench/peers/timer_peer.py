#!/usr/bin/python3
"""torch's FileTimerServer/FileTimerClient as a benchmark peer (bench/timer/timer_bench.cpp).

Two modes, one case per run, each printing lines that start with RESULT:

  --mode throughput --clients C --pairs N [--reps R] [--max-interval 0.1]
      torch's FileTimerServer runs in this process (its watchdog thread); C client processes,
      forked once the server is up, each do N acquire+release pairs with a FileTimerClient
      from the same start signal. A run lasts from the start signal until the server has
      registered every request (its _request_count, as torch's own tests use), so it counts
      the server's work too. One line per run:
        RESULT torch throughput clients=C pairs=C*N rep=I seconds=S pairs_per_s=P
               client_pairs_per_s=Q send_retries=K

  --mode expiry --max-interval I [--reps R] [--after 0.05]
      After a random pause of up to I (so that the timer is armed at a random point of the
      server's cycle, not in step with the previous kill), a forked child arms a SIGKILL timer
      expiring `after` s ahead, reports the exact expiration time and sleeps; this process
      waits for its death on a pidfd. Latency = time.time() when the pidfd fires - the
      expiration time. One line per rep:
        RESULT torch expiry max_interval=I rep=R latency_s=L

torch's FileTimerClient opens the FIFO with O_NONBLOCK for every request, so a request that
finds the 64 KiB pipe full (the server sleeps up to max_interval between reads) raises
BlockingIOError. RetryingClient counts such failures and sends again after 1 ms; the
count is reported as send_retries.

Every child gets PR_SET_PDEATHSIG(SIGKILL) and every wait a timeout; children still alive
when a run ends (or fails) are killed and reaped. Run with /usr/bin/python3 (Debian's
python3-torch): the python3 first on PATH may lack torch.
"""

import argparse
import ctypes
import json
import os
import random
import select
import signal
import statistics
import sys
import tempfile
import time

from torch.distributed.elastic.timer import FileTimerClient, FileTimerServer

PR_SET_PDEATHSIG = 1


class RetryingClient(FileTimerClient):
    """torch's FileTimerClient; a request that fails to send is counted and sent again."""

    def __init__(self, path, timeout_s):
        super().__init__(path, signal=signal.SIGKILL)
        self.retries = 0
        self._timeout_s = timeout_s

    def _send_request(self, request):
        give_up = time.monotonic() + self._timeout_s
        while True:
            try:
                return super()._send_request(request)
            except OSError:  # BlockingIOError (pipe full), BrokenPipeError (no reader yet)
                self.retries += 1
                if time.monotonic() > give_up:
                    raise
                time.sleep(0.001)


def die_with_parent():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)


def read_line(fd, deadline):
    """One line from a pipe, or None at end of file or when the monotonic deadline passes."""
    data = b""
    while not data.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return None
        chunk = os.read(fd, 4096)
        if not chunk:
            return None
        data += chunk
    return data.decode()


class Children:
    """Forked children, killed (SIGKILL) and reaped on close() unless they exited."""

    def __init__(self):
        self.pids = []

    def fork(self, body):
        pid = os.fork()
        if pid == 0:
            code = 1
            try:
                die_with_parent()
                code = body()
            except BaseException as e:  # the child must never return into the parent's code
                print(f"timer_peer child: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            finally:
                os._exit(code)
        self.pids.append(pid)
        return pid

    def wait(self, pid, timeout_s):
        """The wait status of pid, or None if it is still running after timeout_s."""
        give_up = time.monotonic() + timeout_s
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                self.pids.remove(pid)
                return status
            if time.monotonic() > give_up:
                return None
            time.sleep(0.002)

    def close(self):
        for pid in self.pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            os.waitpid(pid, 0)
        self.pids = []


def run_throughput(a, workdir):
    per_client = a.pairs
    total = per_client * a.clients
    for rep in range(a.reps):
        path = os.path.join(workdir, f"tp_{a.clients}_{rep}")
        server = FileTimerServer(path, max_interval=a.max_interval)
        children = Children()
        go_r, go_w = os.pipe()
        out_r, out_w = os.pipe()
        try:
            def client():
                os.close(go_w)
                os.close(out_r)
                c = RetryingClient(path, a.timeout)
                os.write(out_w, b"ready\n")
                if read_line(go_r, time.monotonic() + a.timeout) is not None:
                    return 2  # the start signal is end of file; anything else is a bug
                t0 = time.perf_counter()
                for _ in range(per_client):
                    c.acquire("s", time.time() + 60)
                    c.release("s")
                dt = time.perf_counter() - t0
                os.write(out_w, (json.dumps({"s": dt, "retries": c.retries}) + "\n").encode())
                return 0

            for _ in range(a.clients):
                children.fork(client)
            os.close(go_r)
            os.close(out_w)
            go_r = out_w = -1
            server.start()
            deadline = time.monotonic() + a.timeout
            # Wait for the clients to be up, and for the watchdog to open the FIFO (it blocks in
            # open() until a client opens it; a client's open succeeds while a reader waits).
            lines = []
            while len(lines) < a.clients:
                line = read_line(out_r, deadline)
                if line is None:
                    raise RuntimeError("a client did not start")
                lines += [x for x in line.splitlines() if x]
            time.sleep(0.2)
            target = 2 * total
            t0 = time.perf_counter()
            os.close(go_w)
            go_w = -1
            while server._request_count < target:
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"the server registered {server._request_count} of {target} requests "
                        f"in {a.timeout} s")
                time.sleep(0.001)
            seconds = time.perf_counter() - t0
            results = []
            while len(results) < a.clients:
                line = read_line(out_r, deadline)
                if line is None:
                    raise RuntimeError("a client did not report")
                results += [json.loads(x) for x in line.splitlines() if x]
            for pid in list(children.pids):
                status = children.wait(pid, max(0.0, deadline - time.monotonic()))
                if status is None or os.waitstatus_to_exitcode(status) != 0:
                    raise RuntimeError(f"client {pid} failed (wait status {status})")
            client_s = max(r["s"] for r in results)
            retries = sum(r["retries"] for r in results)
            print(f"RESULT torch throughput clients={a.clients} pairs={total} rep={rep} "
                  f"seconds={seconds:.6f} pairs_per_s={total / seconds:.1f} "
                  f"client_pairs_per_s={total / client_s:.1f} send_retries={retries}",
                  flush=True)
        finally:
            children.close()
            for fd in (go_r, go_w, out_r, out_w):
                if fd >= 0:
                    os.close(fd)
            server.stop()


def run_expiry(a, workdir):
    path = os.path.join(workdir, f"exp_{a.max_interval}")
    server = FileTimerServer(path, max_interval=a.max_interval)
    server.start()
    children = Children()
    lats = []
    rng = random.Random(a.seed)
    try:
        time.sleep(0.2)
        for rep in range(a.reps):
            time.sleep(rng.uniform(0, a.max_interval))
            out_r, out_w = os.pipe()
            try:
                def child():
                    os.close(out_r)
                    c = RetryingClient(path, a.timeout)
                    expiration = time.time() + a.after
                    c.acquire("expiring", expiration)
                    os.write(out_w, f"{expiration!r}\n".encode())
                    time.sleep(a.timeout)  # the server should kill us long before
                    return 3

                pid = children.fork(child)
                os.close(out_w)
                out_w = -1
                pidfd = os.pidfd_open(pid)
                try:
                    line = read_line(out_r, time.monotonic() + a.timeout)
                    if line is None:
                        raise RuntimeError("the expiring child did not report")
                    expiration = float(line)
                    wait_s = a.after + a.max_interval + a.timeout
                    dead = select.select([pidfd], [], [], wait_s)[0]
                    observed = time.time()
                    if not dead:
                        raise RuntimeError(f"the child outlived its timer by {wait_s} s")
                finally:
                    os.close(pidfd)
                status = children.wait(pid, 10)
                if status is None or os.waitstatus_to_exitcode(status) != -signal.SIGKILL:
                    raise RuntimeError(f"the child was not killed by the timer (status {status})")
                lat = observed - expiration
                lats.append(lat)
                print(f"RESULT torch expiry max_interval={a.max_interval} rep={rep} "
                      f"latency_s={lat:.6f}", flush=True)
            finally:
                for fd in (out_r, out_w):
                    if fd >= 0:
                        os.close(fd)
    finally:
        children.close()
        server.stop()
    print(f"torch expiry max_interval={a.max_interval}: median {statistics.median(lats):.4f} s "
          f"over {len(lats)} reps", file=sys.stderr)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--mode", choices=("throughput", "expiry"), required=True)
    p.add_argument("--clients", type=int, default=1)
    p.add_argument("--pairs", type=int, default=10000, help="pairs per client and run")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--max-interval", type=float, default=0.1)
    p.add_argument("--after", type=float, default=0.05)
    p.add_argument("--workdir", help="for the FIFOs (the caller removes it); default a temporary one")
    p.add_argument("--seed", type=int, default=1, help="of the random pauses")
    p.add_argument("--timeout", type=float, default=120.0, help="bound on every wait, s")
    a = p.parse_args()
    run = run_throughput if a.mode == "throughput" else run_expiry
    if a.workdir:
        run(a, a.workdir)
    else:
        with tempfile.TemporaryDirectory(prefix="timer_peer_") as workdir:
            run(a, workdir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
