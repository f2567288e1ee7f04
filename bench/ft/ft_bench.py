#!/usr/bin/python3
"""tide.ft against restarting the whole job, in one run on this machine.

1. Survivors' stop: three replica groups of two ranks (tests/apps/ft/worker.py,
   one tiderun per group, a tide-store); a rank of one group is SIGKILLed
   after step 20; the time from the kill to the next step every surviving
   group commits. Beside it, the same model as one 6-rank DDP job that
   restarts every rank (bench/launch/ddp_restart_bench.py's run: tiderun
   --prestart and torchrun): from the failure to the first step of the new
   attempt.
2. Healing: the killed group, restarted, takes the state of a healthy group
   with STATE_MB of extra state (64 MB and 1 GB): from the moment it asks
   to join to its first committed step, and the transfer alone.

    /usr/bin/python3 bench/ft/ft_bench.py [--reps 5] [--tiderun build/apps/tiderun]
"""
import argparse
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(ROOT, "tests", "apps", "ft", "worker.py")
sys.path.insert(0, os.path.join(ROOT, "bench", "launch"))
import ddp_restart_bench  # noqa: E402

GROUPS = ["g0", "g1", "g2"]
LIMIT_S = 180


class Job:
    def __init__(self, tiderun, scratch, state_mb):
        self.dir = tempfile.mkdtemp(dir=scratch)
        self.store = subprocess.Popen(
            [os.path.join(os.path.dirname(tiderun), "tide-store"), "--port", "0"],
            stdout=subprocess.PIPE, text=True)
        address = self.store.stdout.readline().split()[-1] + "/bench"
        env = dict(os.environ, OUT=self.dir, STATE_MB=str(state_mb),
                   PYTHONPATH=os.path.join(os.path.dirname(tiderun), "..", "python"),
                   PYTHON_EXEC="/usr/bin/python3", TIDE_LOG_LEVEL="warning")
        self.runs = [subprocess.Popen(
            [tiderun, "--standalone", "--nproc-per-node=2", "--max-restarts=1",
             f"--ft-store={address}", f"--replica-group-id={g}",
             f"--num-replica-groups={len(GROUPS)}", WORKER],
            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) for g in GROUPS]
        self.t0 = time.monotonic()

    def kill(self):
        """A run that failed: nothing of it may go on beside the next."""
        for p in self.runs:
            if p.poll() is None:
                p.terminate()  # tiderun stops its workers
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        if self.store.poll() is None:
            self.store.kill()
            self.store.wait()

    def lines(self, g, r):
        try:
            with open(os.path.join(self.dir, f"{g}-{r}.log")) as f:
                return [json.loads(x) for x in f if x.endswith("\n")]
        except FileNotFoundError:
            return []

    def until(self, condition):
        while not condition():
            if time.monotonic() - self.t0 > LIMIT_S:
                raise RuntimeError("ft_bench: a run made no progress in time")
            time.sleep(0.02)  # reading files other processes write

    def end(self):
        step = max(x["step"] for x in self.lines("g0", 0) if x["event"] == "commit") + 5
        with open(os.path.join(self.dir, "stop_at.tmp"), "w") as f:
            f.write(str(step))
        os.rename(os.path.join(self.dir, "stop_at.tmp"), os.path.join(self.dir, "stop_at"))
        for p in self.runs:
            p.wait(timeout=LIMIT_S)
        self.store.kill()
        self.store.wait()
        if any(p.returncode for p in self.runs):
            raise RuntimeError("ft_bench: a group failed")


def ft_run(tiderun, scratch, state_mb):
    job = Job(tiderun, scratch, state_mb)
    try:
        return measure(job)
    finally:
        job.kill()


def measure(job):
    commits = lambda g, r: [x for x in job.lines(g, r) if x["event"] == "commit"]  # noqa: E731
    job.until(lambda: all(len(commits(g, r)) >= 20 for g in GROUPS for r in (0, 1)))
    victim = commits("g1", 1)[-1]["pid"]
    os.kill(victim, signal.SIGKILL)
    killed = time.time()
    job.until(lambda: all(any(x["t"] > killed for x in commits(g, r))
                          for g in ("g0", "g2") for r in (0, 1)))
    stop = max(min(x["t"] for x in commits(g, r) if x["t"] > killed)
               for g in ("g0", "g2") for r in (0, 1)) - killed
    old = {commits("g1", r)[-1]["pid"] for r in (0, 1)}
    job.until(lambda: all(any(x["pid"] not in old for x in commits("g1", r))
                          for r in (0, 1)))
    heal = []
    for r in (0, 1):
        healed = [x for x in job.lines("g1", r) if x["event"] == "healed"][-1]
        first = min(x["t"] for x in commits("g1", r) if x["t"] > healed["t"])
        heal.append((first - healed["since"], first - healed["heal"]["started"],
                     healed["heal"]["seconds"]))
    job.end()
    return stop, *(max(h[i] for h in heal) for i in range(3))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--tiderun", default=os.path.join(ROOT, "build", "apps", "tiderun"))
    p.add_argument("--heal-mb", type=int, nargs="+", default=[64, 1024])
    args = p.parse_args()
    ms = lambda xs: f"{statistics.median(xs) * 1e3:.0f} ms" if xs else "-"  # noqa: E731
    with tempfile.TemporaryDirectory() as scratch:
        stops = {"tide.ft": [], "tiderun --prestart": [], "torchrun@0.1": []}
        heals = {mb: ([], [], []) for mb in args.heal_mb}
        for rep in range(args.reps):
            s, _, _, _ = ft_run(args.tiderun, scratch, 0)
            stops["tide.ft"].append(s)
            print(f"RESULT case=tide.ft stop_ms={s * 1e3:.0f}", flush=True)
            for case in ("tiderun --prestart", "torchrun@0.1"):
                try:
                    r = ddp_restart_bench.one_run(case, args.tiderun, 6, scratch)
                except ddp_restart_bench.RunFailed as e:
                    print(f"FAILED case={case}: {str(e)[-300:]}", flush=True)
                    continue
                stops[case].append(r["failure -> step1"] / 1e3)
                print(f"RESULT case={case.replace(' ', '')} stop_ms={r['failure -> step1']}",
                      flush=True)
            for mb in args.heal_mb:
                _, joined, healing, transfer = ft_run(args.tiderun, scratch, mb)
                for i, v in enumerate((joined, healing, transfer)):
                    heals[mb][i].append(v)
                print(f"RESULT case=heal mb={mb} join_to_commit_ms={joined * 1e3:.0f} "
                      f"heal_to_commit_ms={healing * 1e3:.0f} "
                      f"transfer_ms={transfer * 1e3:.0f}", flush=True)
        print(f"\n| survivors stopped, 3 groups x 2 ranks, median of {args.reps} | "
              + " | ".join(stops) + " |")
        print("|---|" + "--:|" * len(stops))
        print("| kill -> next step of every survivor | "
              + " | ".join(ms(v) for v in stops.values()) + " |")
        print(f"| runs | " + " | ".join(str(len(v)) for v in stops.values()) + " |")
        print("\n| heal, per rank, 2 ranks at once, median | asking to join -> first commit "
              "| heal begins -> first commit | the heal itself |")
        print("|---|--:|--:|--:|")
        for mb, (joined, healing, transfer) in heals.items():
            print(f"| {mb} MB | {ms(joined)} | {ms(healing)} | {ms(transfer)} |")


if __name__ == "__main__":
    main()
