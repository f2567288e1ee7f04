#!/usr/bin/python3
"""In-memory checkpoints (tiderun --checkpoint-memory, tide.checkpoint)
against torch.save/torch.load, with the physical references, in one run on
this machine (Debian's python3-torch; bench/checkpoint/worker.py):

1. Save: for 64, 256 and 1024 MiB of state per rank on 2 ranks (under
   tiderun, both ranks at once, as in training), the time save blocks the
   script, against a memcpy of the same bytes (memmove into a buffer already
   touched), torch.save to a file on the disk a user would use (--dir), and a
   write of the bytes there with fsync. Medians over ranks and repetitions;
   ratios to the memcpy.
2. Restore: from a worker's SIGKILL to its first training step with its
   state restored, 1 GiB per rank on 2 ranks (the last rank): the state from
   memory (tiderun --prestart, and cold), against the same script loading
   with torch.load under tiderun --prestart and under torchrun at its fastest
   monitor interval (0.1 s; bench/peers/torchrun.py).

    PYTHONPATH= /usr/bin/python3 bench/checkpoint/checkpoint_bench.py [--reps 3] [--tiderun build/apps/tiderun] [--dir /var/tmp]

Prints Markdown tables of medians and a RESULT line per run.
"""
import argparse
import json
import os
import statistics
import subprocess
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
WORKER = os.path.join(HERE, "worker.py")
TORCHRUN = os.path.join(ROOT, "bench", "peers", "torchrun.py")
PYTHON = os.path.join(ROOT, "python")
NPROC = 2


def run(cmd, env):
    out = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({out.returncode}):\n{out.stderr[-3000:]}")


def env_for(mode, out, scratch, mb, reps=5, store="memory"):
    return dict(os.environ, BENCH_MODE=mode, BENCH_OUT=out, BENCH_DIR=scratch,
                BENCH_MB=str(mb), BENCH_REPS=str(reps), BENCH_STORE=store,
                PYTHON_EXEC="/usr/bin/python3", PYTHONPATH=PYTHON)


def memory_for(mb):
    """Two slots per rank of the state, and room for the headers."""
    return f"{2 * NPROC * mb + 16}M"


def save_cells(tiderun, scratch, reps):
    rows = {}
    for mb in (64, 256, 1024):
        out = tempfile.mkdtemp(dir=scratch)
        run([tiderun, "--standalone", f"--nproc-per-node={NPROC}",
             f"--checkpoint-memory={memory_for(mb)}", WORKER],
            env_for("save", out, scratch, mb, reps=reps))
        per = [json.load(open(os.path.join(out, f"save.{r}.json"))) for r in range(NPROC)]
        cell = {k: statistics.median(t for p in per for t in p[k])
                for k in ("save", "memcpy", "torch.save", "write+fsync")}
        rows[mb] = cell
        print(f"RESULT part=save mb={mb} " +
              " ".join(f"{k}={v * 1000:.1f}ms" for k, v in cell.items()), flush=True)
    return rows


def restore_once(case, tiderun, scratch, mb):
    out = tempfile.mkdtemp(dir=scratch)
    store = "disk" if "torch.load" in case else "memory"
    env = env_for("restore", out, scratch, mb, store=store)
    if case.startswith("torchrun"):
        cmd = ["/usr/bin/python3", TORCHRUN, "--standalone", f"--nproc_per_node={NPROC}",
               "--max_restarts=1", "--monitor_interval=0.1", WORKER]
    else:
        cmd = [tiderun, "--standalone", f"--nproc-per-node={NPROC}", "--max-restarts=1",
               f"--checkpoint-memory={memory_for(mb)}"]
        if "--prestart" in case:
            cmd.append("--prestart")
        cmd.append(WORKER)
    run(cmd, env)
    read = lambda name: open(os.path.join(out, name)).read()  # noqa: E731
    sources = {read(f"source.{r}") for r in range(NPROC)}
    if sources != {store}:
        raise SystemExit(f"{case}: restored from {sources}, not {store}")
    failure = float(read("failure"))
    return max(float(read(f"step1.{r}")) for r in range(NPROC)) - failure


CASES = ["memory, tiderun --prestart", "memory, tiderun", "torch.load, tiderun --prestart",
         "torch.load, torchrun@0.1"]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--tiderun", default=os.path.join(ROOT, "build", "apps", "tiderun"))
    p.add_argument("--dir", default="/var/tmp",
                   help="where torch.save writes: the disk a user would use")
    args = p.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="tide-ckpt-bench-") as scratch:
        saves = save_cells(args.tiderun, scratch, max(5, args.reps))
        restores = {c: [] for c in CASES}
        for rep in range(args.reps):
            for case in CASES[rep % len(CASES):] + CASES[:rep % len(CASES)]:
                t = restore_once(case, args.tiderun, scratch, 1024)
                restores[case].append(t)
                print(f"RESULT part=restore case={case.replace(' ', '')} ms={t * 1000:.1f}",
                      flush=True)

    print(f"\n| save, per rank, {NPROC} ranks at once, median | tide.checkpoint.save | "
          "memcpy | torch.save | write + fsync | save / memcpy | torch.save / save |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for mb, c in saves.items():
        print(f"| {mb} MiB | {c['save'] * 1e3:.1f} ms | {c['memcpy'] * 1e3:.1f} ms | "
              f"{c['torch.save'] * 1e3:.1f} ms | {c['write+fsync'] * 1e3:.1f} ms | "
              f"{c['save'] / c['memcpy']:.2f} | {c['torch.save'] / c['save']:.1f} |")
    best = statistics.median(restores[CASES[0]])
    print(f"\n| SIGKILL -> first step, 1 GiB per rank, {NPROC} ranks, median of {args.reps} | ms | "
          "vs memory, --prestart |")
    print("|---|--:|--:|")
    for case in CASES:
        m = statistics.median(restores[case])
        print(f"| {case} | {m * 1000:.0f} | {m / best:.1f}x |")


if __name__ == "__main__":
    main()
