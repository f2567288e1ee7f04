#!/usr/bin/python3
"""A DDP training script restarted after a failure: tiderun against torchrun
(Debian's python3-torch: 1.13.1, or 2.6 in Debian 13 with USE_LIBUV=0;
through bench/peers/torchrun.py), in one
run: from the failure to the first completed training step of the next
attempt, and where that time goes.

bench/launch/ddp_step.py (gloo, CPU, a small MLP) runs under each launcher
with --max-restarts=1; rank 1 raises in attempt 0 once the job has trained
9 s (after its third step at least), the launcher stops the group and starts
attempt 1. Stamps (wall clock, per rank):
"up" when the script starts running, before its imports; "imported" after
`import torch`; "pg" once init_process_group("gloo") returns; "step1" when
the first training step completes. For attempt 1, from the failure:

    failure -> up        the launcher noticing, stopping the group and starting
                         it again, then the interpreter starting (last rank)
    up -> imported       import torch (median rank)
    imported -> pg       the process group (median rank)
    pg -> step1          DDP's wrap and the first step (median rank)
    failure -> step1     the whole: training again (last rank)

Cases: tiderun (--monitor-interval 0.1), tiderun --prestart (interpreters
started beforehand with torch imported, when the build has it), torchrun at
its fastest monitor interval (0.1 s) and at its default (as its parser says:
5 s in 1.13, 0.1 s in 2.x), 2 and 4 ranks.

    PYTHONPATH= /usr/bin/python3 bench/launch/ddp_restart_bench.py [--reps 3] [--tiderun build/apps/tiderun]

Prints a Markdown table of medians and a RESULT line per run. A run whose job
does not finish (torchrun 2.6 restarting onto the previous attempt's store keys)
is counted, not timed: the table says how many of each case trained again.
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
SCRIPT = os.path.join(HERE, "ddp_step.py")
TORCHRUN = os.path.join(ROOT, "bench", "peers", "torchrun.py")
# A run takes 5-15 s; one still going after this hangs (gloo waiting on a
# previous attempt's address).
HUNG_S = 120


def command(case, tiderun, nproc):
    if case.startswith("tiderun"):
        cmd = [tiderun, "--standalone", f"--nproc-per-node={nproc}", "--max-restarts=1",
               "--monitor-interval=0.1"]
        if case == "tiderun --prestart":
            cmd.append("--prestart")
        return cmd + [SCRIPT]
    interval = case.split("@")[1]
    return ["/usr/bin/python3", TORCHRUN, "--standalone", f"--nproc_per_node={nproc}",
            "--max_restarts=1", f"--monitor_interval={interval}", SCRIPT]


class RunFailed(Exception):
    """The job did not finish: counted, shown in the table, and the run goes on."""


def one_run(case, tiderun, nproc, scratch):
    stamps = tempfile.mkdtemp(dir=scratch)
    env = dict(os.environ, BENCH_STAMPS=stamps, PYTHON_EXEC="/usr/bin/python3",
               TMPDIR=scratch, BENCH_FAIL_RANK="1")
    try:
        out = subprocess.run(command(case, tiderun, nproc), env=env, capture_output=True,
                             text=True, timeout=HUNG_S)
    except subprocess.TimeoutExpired as e:
        raise RunFailed(f"{case} hung: no end within {HUNG_S} s (TimeoutError)") from e
    if out.returncode != 0:
        raise RunFailed(f"{case} failed ({out.returncode}): {out.stderr[-3000:]}")

    def t(name, rank):
        with open(os.path.join(stamps, f"{name}.1.{rank}")) as f:
            return float(f.read())

    with open(os.path.join(stamps, "failure.0.1")) as f:
        failure = float(f.read())
    ranks = range(nproc)
    ms = lambda x: round(x * 1000, 1)  # noqa: E731
    per = lambda a, b: ms(statistics.median(t(b, r) - t(a, r) for r in ranks))  # noqa: E731
    return {
        "failure -> up": ms(max(t("up", r) for r in ranks) - failure),
        "up -> imported": per("up", "imported"),
        "imported -> pg": per("imported", "pg"),
        "pg -> step1": per("pg", "step1"),
        "failure -> step1": ms(max(t("step1", r) for r in ranks) - failure),
    }


def torchrun_facts():
    """torch's version and torchrun's default monitor interval, in seconds."""
    out = subprocess.run(
        ["/usr/bin/python3", "-c",
         "import torch\n"
         "from torch.distributed.run import get_args_parser\n"
         "print(torch.__version__, get_args_parser().get_default('monitor_interval'))"],
        capture_output=True, text=True, check=True)
    version, interval = out.stdout.split()
    return version, float(interval)


def last_error_line(text):
    """The line of a failed run's stderr that names its cause: a worker's
    RuntimeError when there is one, else the last line naming an error."""
    lines = [ln for ln in text.splitlines() if "Error" in ln]
    causes = [ln for ln in lines if "RuntimeError" in ln]
    return (causes or lines or text.strip().splitlines())[-1].strip()


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=3,
                   help="runs per case (torchrun at a default of 1 s or more: 1)")
    p.add_argument("--tiderun", default=os.path.join(ROOT, "build", "apps", "tiderun"))
    p.add_argument("--nproc", type=int, nargs="+", default=[2, 4])
    args = p.parse_args()
    has_prestart = "--prestart" in subprocess.run([args.tiderun, "--help"],
                                                   capture_output=True, text=True).stdout
    version, default = torchrun_facts()
    print(f"torch {version}; torchrun's default monitor interval {default:g} s", flush=True)
    slow = f"torchrun@{default:g}" if default >= 1 else None
    cases = ["tiderun"] + (["tiderun --prestart"] if has_prestart else []) + \
        ["torchrun@0.1"] + ([slow] if slow else [])
    results = {}
    failures = {}
    with tempfile.TemporaryDirectory() as scratch:
        for nproc in args.nproc:
            for rep in range(args.reps):
                for case in cases[rep % len(cases):] + cases[:rep % len(cases)]:
                    key = (case, nproc)
                    if case == slow and results.get(key):
                        continue
                    try:
                        r = one_run(case, args.tiderun, nproc, scratch)
                    except RunFailed as e:
                        failures.setdefault(key, []).append(str(e))
                        print(f"FAILED case={case.replace(' ', '')} nproc={nproc}: "
                              f"{last_error_line(str(e))}", flush=True)
                        continue
                    results.setdefault(key, []).append(r)
                    print(f"RESULT case={case.replace(' ', '')} nproc={nproc} " +
                          " ".join(f"{k.replace(' ', '')}={v}" for k, v in r.items()),
                          flush=True)
    names = list(next(iter(results.values()))[0]) if results else []
    for nproc in args.nproc:
        print(f"\n| ms, {nproc} ranks, median | " + " | ".join(cases) + " |")
        print("|---|" + "--:|" * len(cases))
        for name in names:
            cells = [str(round(statistics.median(r[name] for r in results[(c, nproc)]), 1))
                     if results.get((c, nproc)) else "-" for c in cases]
            print(f"| {name} | " + " | ".join(cells) + " |")
        counts = [f"{len(results.get((c, nproc), []))} of "
                  f"{len(results.get((c, nproc), [])) + len(failures.get((c, nproc), []))}"
                  for c in cases]
        print("| runs that trained again | " + " | ".join(counts) + " |")
    for (case, nproc), errors in failures.items():
        print(f"\n{case}, {nproc} ranks: {len(errors)} failed; the last error: "
              f"{last_error_line(errors[-1])}")


if __name__ == "__main__":
    main()
