#!/usr/bin/python3
"""Python launchers with a function entrypoint: tide.elastic's LocalElasticAgent
against torch's own torch.distributed.elastic (Debian's python3-torch), in one run.

The same launcher (c10d rendezvous, 4 workers, max_restarts=1) runs a function
whose rank 0 raises in attempt 0 once all four are in, while the others work, so the agent restarts
the group and attempt 1 returns. torch runs at its fastest monitor interval
(0.01 s) and at its default (30 s, WorkerSpec's); tide's agent sees exits at
once and uses 0.1 s (it only paces the "are nodes waiting?" question).

Times are wall-clock stamps written by the launcher and the workers: "up" when
a worker's interpreter has started (a sitecustomize module on the workers'
path, before any import of theirs), "entered" when the worker function runs.

    launch -> entered         agent.run() called to the workers' function entered
                              (first / last of 4)
    failure -> started        rank 0 raising to attempt 1's processes started: the
                              agent noticing, stopping the group, the rendezvous,
                              starting 4 processes (tide's worker events, stamped
                              at the spawn; torch's multiprocessing Popen, timed)
    failure -> up             ... to attempt 1's interpreters up (first / last)
    failure -> entered        ... to attempt 1's function entered (first / last)
    up -> entered             attempt 1, per worker: the interpreter's imports and
                              unpickling before the function runs (median)

    PYTHONPATH=build/python /usr/bin/python3 bench/launch/py_agent_bench.py [--reps 3]

Prints a Markdown table of medians and one RESULT line per run.
"""
import argparse
import os
import socket
import statistics
import subprocess
import sys
import tempfile

LAUNCHER = r'''
import os
import socket
import sys
import time

IMPL, INTERVAL, STAMPS = sys.argv[1], float(sys.argv[2]), sys.argv[3]
if IMPL == "tide":
    from tide.elastic.agent.server.api import WorkerSpec
    from tide.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from tide.elastic.rendezvous import RendezvousParameters
    from tide.elastic.rendezvous.registry import get_rendezvous_handler
else:
    from torch.distributed.elastic.agent.server.api import WorkerSpec
    from torch.distributed.elastic.agent.server.local_elastic_agent import LocalElasticAgent
    from torch.distributed.elastic.rendezvous import RendezvousParameters
    from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler


def stamp(name, text=""):
    with open(os.path.join(STAMPS, name), "w") as f:
        f.write(f"{time.time()!r} {text}")


def trainer():
    attempt, rank = os.environ["TORCHELASTIC_RESTART_COUNT"], os.environ["RANK"]
    stamp(f"entered.{attempt}.{rank}", str(os.getpid()))
    if attempt == "0":
        if rank == "0":
            # Fail once every worker of the attempt is in: a failure while
            # some still start would not be one of a running group.
            names = [f"entered.0.{r}" for r in range(4)]
            while not all(os.path.exists(os.path.join(STAMPS, n)) for n in names):
                time.sleep(0.001)
            stamp("failure")
            raise RuntimeError("injected failure")
        time.sleep(300)  # working, until the agent stops the group
    return rank


if __name__ == "__main__":
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    handler = get_rendezvous_handler(RendezvousParameters(
        backend="c10d", endpoint=f"127.0.0.1:{port}", run_id="bench", min_nodes=1,
        max_nodes=1))
    spec = WorkerSpec(role="trainer", local_world_size=4, entrypoint=trainer,
                      rdzv_handler=handler, max_restarts=1, monitor_interval=INTERVAL)
    # When each worker process was started: tide's agent says so in its
    # worker events (stamped at the spawn); torch's start goes through
    # multiprocessing's spawn Popen, timed here once it returns.
    if IMPL == "tide":
        from tide.elastic import events

        class Started(events.EventHandler):
            def record(self, e):
                name = None
                if e.name == "torchelastic.worker.status.HEALTHY":
                    name = f"started.{e.metadata['agent_restarts']}.{e.metadata['global_rank']}"
                elif e.name == "torchelastic.worker.status.FAILED":
                    name = "exited"  # the failed worker's exit, as the agent saw it
                if name:
                    with open(os.path.join(STAMPS, name), "w") as f:
                        f.write(repr(e.timestamp / 1000))  # ms since the epoch

        events.configure(Started())
    else:
        import multiprocessing.popen_spawn_posix as popen

        launch_process = popen.Popen._launch

        def timed_launch(self, process_obj):
            launch_process(self, process_obj)
            stamp(f"spawned.{self.pid}")

        popen.Popen._launch = timed_launch
    agent = LocalElasticAgent(spec, start_method="spawn")
    stamp("launch")
    result = agent.run()
    sys.exit(1 if result.is_failed() else 0)
'''

# Imported by every interpreter started with BENCH_STAMPS set, before its
# own imports: when it came up, by pid.
SITECUSTOMIZE = r'''
import os
import time
if os.environ.get("BENCH_STAMPS"):
    with open(os.path.join(os.environ["BENCH_STAMPS"], f"up.{os.getpid()}"), "w") as f:
        f.write(repr(time.time()))
'''

CASES = [("tide", 0.1), ("torch", 0.01), ("torch", 30.0)]


def read(directory, name):
    with open(os.path.join(directory, name)) as f:
        return f.read().split()


def one_run(impl, interval, scratch, timeout):
    stamps = tempfile.mkdtemp(dir=scratch)
    site = tempfile.mkdtemp(dir=scratch)
    launcher = os.path.join(site, "launcher.py")
    with open(launcher, "w") as f:
        f.write(LAUNCHER)
    with open(os.path.join(site, "sitecustomize.py"), "w") as f:
        f.write(SITECUSTOMIZE)
    env = dict(os.environ, BENCH_STAMPS=stamps, TMPDIR=scratch,
               PYTHONPATH=os.pathsep.join(p for p in (site, os.environ.get("PYTHONPATH"))
                                          if p))
    out = subprocess.run(["/usr/bin/python3", launcher, impl, str(interval), stamps], env=env,
                         capture_output=True, text=True, timeout=timeout)
    if out.returncode != 0:
        raise RuntimeError(f"{impl} ({interval} s) failed: {out.stderr[-2000:]}")
    t = lambda name: float(read(stamps, name)[0])  # noqa: E731
    entered = {a: [read(stamps, f"entered.{a}.{r}") for r in range(4)] for a in (0, 1)}
    launch, failure = t("launch"), t("failure")
    enter0 = [float(e[0]) for e in entered[0]]
    enter1 = [float(e[0]) for e in entered[1]]
    up1 = [t(f"up.{e[1]}") for e in entered[1]]
    if impl == "tide":
        started1 = [t(f"started.1.{r}") for r in range(4)]
    else:
        started1 = [t(f"spawned.{e[1]}") for e in entered[1]]
    ms = lambda x: round(x * 1000, 1)  # noqa: E731
    return {
        "failure -> the failed worker's exit (tide: its event)":
            ms(t("exited") - failure) if impl == "tide" else None,
        "launch -> entered, first": ms(min(enter0) - launch),
        "launch -> entered, last": ms(max(enter0) - launch),
        "failure -> started, first": ms(min(started1) - failure),
        "failure -> started, last": ms(max(started1) - failure),
        "failure -> up, first": ms(min(up1) - failure),
        "failure -> up, last": ms(max(up1) - failure),
        "failure -> entered, first": ms(min(enter1) - failure),
        "failure -> entered, last": ms(max(enter1) - failure),
        "up -> entered (attempt 1)": ms(statistics.median(
            e - u for e, u in zip(enter1, up1))),
    }


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=3, help="runs per case (torch at 30 s: 1)")
    p.add_argument("--timeout", type=float, default=180)
    args = p.parse_args()
    results = {case: [] for case in CASES}
    with tempfile.TemporaryDirectory() as scratch:
        for rep in range(args.reps):
            order = CASES[rep % len(CASES):] + CASES[:rep % len(CASES)]
            for impl, interval in order:
                if interval >= 30 and results[(impl, interval)]:
                    continue
                r = one_run(impl, interval, scratch, args.timeout)
                results[(impl, interval)].append(r)
                print(f"RESULT impl={impl} monitor_interval={interval} " +
                      " ".join(f"{k.replace(' ', '_')}={v}" for k, v in r.items()), flush=True)
    names = list(next(iter(results.values()))[0])
    head = [f"{impl} ({interval} s)" for impl, interval in CASES]
    print(f"\n| ms, median | {' | '.join(head)} | torch (0.01 s) / tide |")
    print("|---|" + "--:|" * (len(CASES) + 1))
    for name in names:
        med = [statistics.median(r[name] for r in results[c]) if results[c][0][name] is not None
               else None for c in CASES]
        ratio = f"{med[1] / med[0]:.1f}x" if None not in med[:2] and med[0] > 0 else "-"
        cells = " | ".join("-" if m is None else str(m) for m in med)
        print(f"| {name} | {cells} | {ratio} |")
    print(f"\n({args.reps} runs of tide and of torch at 0.01 s, 1 of torch at 30 s; "
          f"4 workers, 2 cores)")


if __name__ == "__main__":
    main()
