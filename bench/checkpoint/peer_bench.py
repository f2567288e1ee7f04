#!/usr/bin/python3
"""The restore of a lost node's snapshots from its peer, between two hosts
(network namespaces on a private bridge, as tests/support/netns.h builds
them), against a TCP stream of the same bytes between the same hosts and a
memcpy.

A two-node job (tiderun in host 1 and host 2, one rank each, DDP-like
barrier per step) saves --mb MiB per rank every step; once rank 1 has
saved a few steps and 9 s have passed, host 2's tiderun and worker are
SIGKILLed (the node and its memory lost) and a new tiderun starts in host
2. Each rep runs the job twice: cold restarts, and every tiderun with
--prestart. Its agent fetches rank
1's snapshots from host 1's agent before its worker starts: the agent's log
says how many bytes in how long. Needs root (ip netns). Medians of --reps.

    /usr/bin/python3 bench/checkpoint/peer_bench.py --mb 512 --reps 3
"""
import argparse
import ctypes
import json
import os
import random
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")

WORKER = r"""
import os, time, torch, torch.distributed as dist
import tide.checkpoint as ck
rank, out, mb = int(os.environ["RANK"]), os.environ["BENCH_OUT"], int(os.environ["BENCH_MB"])
dist.init_process_group("gloo", init_method="env://")
n = (mb << 20) // 4 // 8
state = {f"layer{i}": torch.full((n,), float(rank + i)) for i in range(8)}
loaded = ck.load(state)
if loaded.step is not None:
    ok = all(bool((t == float(rank + i)).all()) for i, t in enumerate(state.values()))
    with open(os.path.join(out, f"loaded.{rank}"), "w") as f:
        f.write(f"{loaded.source} {loaded.step} {ok}")
    dist.barrier()
    raise SystemExit(0)
for step in range(1000):
    ck.save(state, step=step)
    with open(os.path.join(out, f"progress.{rank}.tmp"), "w") as f:
        f.write(str(step))
    os.rename(os.path.join(out, f"progress.{rank}.tmp"), os.path.join(out, f"progress.{rank}"))
    dist.barrier()
"""

SENDER = r"""
import socket, sys, time
n = int(sys.argv[2])
data = bytearray(n)
s = socket.create_connection((sys.argv[1], 29611))
t = time.perf_counter()
s.sendall(data)
s.shutdown(socket.SHUT_WR)
s.recv(1)
print(time.perf_counter() - t)
"""

RECEIVER = r"""
import socket, sys
n = int(sys.argv[2])
buf = bytearray(n)
view = memoryview(buf)
srv = socket.socket()
srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
srv.bind((sys.argv[1], 29611))
srv.listen(1)
print("ready", flush=True)
c, _ = srv.accept()
got = 0
while got < n:
    got += c.recv_into(view[got:], n - got)
c.sendall(b"k")
"""


def sh(*cmd):
    subprocess.run(cmd, check=True, capture_output=True)


class Hosts:
    """Two hosts, 10.R.0.1 and 10.R.0.2, on a bridge in a switch namespace."""

    def __init__(self):
        self.net = random.randrange(16, 240)
        self.tag = f"tideck{os.getpid()}"
        self.sw = f"{self.tag}-sw"
        self.names = [f"{self.tag}-h{i}" for i in (1, 2)]
        sh("ip", "netns", "add", self.sw)
        sh("ip", "-n", self.sw, "link", "add", "br0", "type", "bridge")
        sh("ip", "-n", self.sw, "link", "set", "br0", "up")
        for i, ns in enumerate(self.names, 1):
            sh("ip", "netns", "add", ns)
            sh("ip", "link", "add", f"v{self.tag[-6:]}{i}", "netns", ns, "type", "veth",
               "peer", "name", f"sw{i}", "netns", self.sw)
            sh("ip", "-n", ns, "link", "set", f"v{self.tag[-6:]}{i}", "name", "eth0")
            sh("ip", "-n", ns, "addr", "add", f"{self.addr(i - 1)}/24", "dev", "eth0")
            sh("ip", "-n", ns, "link", "set", "lo", "up")
            sh("ip", "-n", ns, "link", "set", "eth0", "up")
            sh("ip", "-n", self.sw, "link", "set", f"sw{i}", "master", "br0")
            sh("ip", "-n", self.sw, "link", "set", f"sw{i}", "up")

    def addr(self, i):
        return f"10.{self.net}.0.{i + 1}"

    def run(self, i, cmd, **kw):
        return subprocess.Popen(["ip", "netns", "exec", self.names[i], *cmd], **kw)

    def close(self):
        for ns in self.names + [self.sw]:
            pids = subprocess.run(["ip", "netns", "pids", ns], capture_output=True,
                                  text=True).stdout.split()
            for pid in pids:
                try:
                    os.kill(int(pid), signal.SIGKILL)
                except ProcessLookupError:
                    pass
            subprocess.run(["ip", "netns", "del", ns], capture_output=True)


def tcp_stream(hosts, nbytes):
    """Seconds to send nbytes from host 1 to host 2 over one TCP stream."""
    rx = hosts.run(1, ["/usr/bin/python3", "-c", RECEIVER, hosts.addr(1), str(nbytes)],
                   stdout=subprocess.PIPE, text=True)
    assert rx.stdout.readline().strip() == "ready"
    tx = hosts.run(0, ["/usr/bin/python3", "-c", SENDER, hosts.addr(1), str(nbytes)],
                   stdout=subprocess.PIPE, text=True)
    seconds = float(tx.communicate(timeout=300)[0])
    rx.wait(timeout=60)
    return seconds


def memcpy(nbytes):
    src = (ctypes.c_char * nbytes)()
    dst = (ctypes.c_char * nbytes)()
    ctypes.memset(dst, 1, nbytes)
    t = time.perf_counter()
    ctypes.memmove(dst, src, nbytes)
    return time.perf_counter() - t


def node_loss(hosts, args, top, prestart):
    """One job, node 2 lost and replaced (every tiderun with --prestart when
    prestart): the agent's fetch (bytes, seconds) and what the replacement's
    worker loaded."""
    out = tempfile.mkdtemp(dir=top)
    worker = os.path.join(top, "worker.py")
    with open(worker, "w") as f:
        f.write(WORKER)
    # Five slots per rank with a peer, and room for the state's meta.
    memory = f"{5 * (args.mb + 1) + 1}M"
    common = [args.tiderun, "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
              f"--rdzv-endpoint={hosts.addr(0)}:29612", "--rdzv-id=peerbench",
              f"--checkpoint-memory={memory}", "--max-restarts=1", "--monitor-interval=0.05",
              *(["--prestart"] if prestart else [])]
    conf = "--rdzv-conf=join_timeout=120,last_call_timeout=1,keep_alive_interval=1," \
           "keep_alive_max_attempt=3,is_host="
    env = dict(os.environ, BENCH_OUT=out, BENCH_MB=str(args.mb), PYTHON_EXEC="/usr/bin/python3",
               GLOO_SOCKET_IFNAME="eth0",
               PYTHONPATH=os.path.join(ROOT, "python"))
    logs = {}

    def start(i, name, is_host):
        logs[name] = os.path.join(top, f"{name}.log")
        return hosts.run(i, [*common, f"--local-addr={hosts.addr(i)}", conf + is_host, worker],
                         env=env, stdout=open(logs[name], "w"), stderr=subprocess.STDOUT,
                         start_new_session=True)

    a = start(0, "a", "true")
    b = start(1, "b", "false")
    progress = os.path.join(out, "progress.1")
    # Node 2 is lost once its rank saved a few steps and the job has run a
    # while (--prestart's pool refills 5 s into an attempt).
    started = time.time()
    deadline = started + 300
    while not (os.path.exists(progress) and int(open(progress).read()) >= 3
               and time.time() > started + 9):
        if a.poll() is not None or b.poll() is not None or time.time() > deadline:
            raise SystemExit("the job ended early:\n" + open(logs["a"]).read()[-3000:]
                             + open(logs["b"]).read()[-3000:])
        time.sleep(0.05)
    os.killpg(b.pid, signal.SIGKILL)
    b.wait()
    c = start(1, "c", "false")
    if a.wait(timeout=600) != 0 or c.wait(timeout=600) != 0:
        raise SystemExit("the job failed:\n" + "".join(
            f"--- {name}\n" + "".join(ln for ln in open(logs[name]) if "[tide]" in ln)
            for name in ("a", "b", "c")))
    log = open(logs["c"]).read()
    m = re.search(r"rank 1: snapshots of steps ([\d, ]+) \(([\d.]+) (MiB|GiB)\) from node 0 "
                  r"in (\d+) ms", log)
    if not m:
        raise SystemExit("no fetch in the new node's log:\n" + log[-3000:])
    nbytes = float(m.group(2)) * (1 << (20 if m.group(3) == "MiB" else 30))
    with open(os.path.join(out, "loaded.1")) as f:
        loaded = f.read()
    return nbytes, int(m.group(4)) / 1e3, m.group(1), loaded


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--mb", type=int, default=512, help="MiB of state per rank")
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tiderun", default=os.path.join(ROOT, "build", "apps", "tiderun"))
    p.add_argument("--json", help="write the results here too")
    args = p.parse_args()
    if os.geteuid() != 0:
        sys.exit("peer_bench needs root (ip netns)")
    top = tempfile.mkdtemp(prefix="tide-peer-bench-")
    hosts = Hosts()
    try:
        fetches, warm, streams, copies = [], [], [], []
        for rep in range(args.reps):
            for prestart, into in ((False, fetches), (True, warm)):
                nbytes, seconds, steps, loaded = node_loss(hosts, args, top, prestart)
                into.append((nbytes, seconds))
                print(f"rep {rep}{' --prestart' if prestart else ''}: fetched steps {steps}: "
                      f"{nbytes / 2**20:.0f} MiB in {seconds * 1e3:.0f} ms "
                      f"({nbytes / seconds / 1e9:.2f} GB/s); the new worker loaded: {loaded}",
                      flush=True)
            streams.append(tcp_stream(hosts, int(nbytes)))
            copies.append(memcpy(int(nbytes)))
    finally:
        hosts.close()
        shutil.rmtree(top, ignore_errors=True)
    # Each rep's bytes are what the survivor held of the lost rank (one to
    # three snapshots): rates, not times, are what compare.
    rate = {
        "peer fetch (agent to agent, tide's transport)":
            statistics.median(n / s for n, s in fetches),
        "peer fetch, tiderun --prestart": statistics.median(n / s for n, s in warm),
        "one TCP stream, Python sendall/recv_into":
            statistics.median(n / s for (n, _), s in zip(fetches, streams)),
        "memcpy": statistics.median(n / s for (n, _), s in zip(fetches, copies)),
    }
    tcp = rate["one TCP stream, Python sendall/recv_into"]
    print(f"\n| restore of a lost node's snapshots ({args.mb} MiB per snapshot), median of "
          f"{args.reps} | GB/s | vs TCP stream |")
    print("|---|--:|--:|")
    for name, r in rate.items():
        print(f"| {name} | {r / 1e9:.2f} | {r / tcp:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({name: r / 1e9 for name, r in rate.items()}, f)


if __name__ == "__main__":
    main()
