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
   state restored, 1 GiB per rank on 2 ranks (the last rank), and where the
   time goes (the restarted workers up; building the state, as a script
   builds its model; loading it): the state from memory (tiderun
   --prestart, and cold), against the same script loading with torch.load
   under tiderun --prestart and under torchrun at its fastest monitor
   interval (0.1 s; bench/peers/torchrun.py); beside them, the physical
   costs of building 1 GiB and copying it, in one process.

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
    at = lambda name, r: float(read(f"{name}.{r}"))  # noqa: E731
    ranks = range(NPROC)
    return {
        "failure -> up": max(at("up", r) for r in ranks) - failure,
        "up -> built": statistics.median(at("built", r) - at("up", r) for r in ranks),
        "built -> loaded": statistics.median(at("loaded", r) - at("built", r) for r in ranks),
        "failure -> step1": max(at("step1", r) for r in ranks) - failure,
    }


def references(mb):
    """The physical costs of a restore here, in a fresh process: building
    the state (allocating and first touching its memory) and a memcpy of
    it, in seconds."""
    out = subprocess.run(
        ["/usr/bin/python3", "-c",
         "import ctypes, time, torch\n"
         "torch.set_num_threads(1)\n"
         f"n = {mb} << 20\n"
         "t = time.perf_counter(); a = torch.full((n // 4,), 1.0); built = time.perf_counter() - t\n"
         "b = torch.empty_like(a); b.fill_(0)\n"
         "t = time.perf_counter(); ctypes.memmove(b.data_ptr(), a.data_ptr(), n)\n"
         "print(built, time.perf_counter() - t)"],
        capture_output=True, text=True, check=True)
    built, copied = map(float, out.stdout.split())
    return built, copied


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
                r = restore_once(case, args.tiderun, scratch, 1024)
                restores[case].append(r)
                print(f"RESULT part=restore case={case.replace(' ', '')} " +
                      " ".join(f"{k.replace(' ', '')}={v * 1000:.1f}ms" for k, v in r.items()),
                      flush=True)
        built, copied = references(1024)

    print(f"\n| save, per rank, {NPROC} ranks at once, median | tide.checkpoint.save | "
          "memcpy | torch.save | write + fsync | save / memcpy | torch.save / save |")
    print("|---|--:|--:|--:|--:|--:|--:|")
    for mb, c in saves.items():
        print(f"| {mb} MiB | {c['save'] * 1e3:.1f} ms | {c['memcpy'] * 1e3:.1f} ms | "
              f"{c['torch.save'] * 1e3:.1f} ms | {c['write+fsync'] * 1e3:.1f} ms | "
              f"{c['save'] / c['memcpy']:.2f} | {c['torch.save'] / c['save']:.1f} |")
    names = list(restores[CASES[0]][0])
    med = {c: {n: statistics.median(r[n] for r in restores[c]) for n in names} for c in CASES}
    print(f"\n| ms, 1 GiB per rank, {NPROC} ranks, median of {args.reps} | " +
          " | ".join(CASES) + " |")
    print("|---|" + "--:|" * len(CASES))
    for n in names:
        print(f"| {n} | " + " | ".join(f"{med[c][n] * 1000:.0f}" for c in CASES) + " |")
    best = med[CASES[0]]["failure -> step1"]
    print("| vs memory, --prestart | " +
          " | ".join(f"{med[c]['failure -> step1'] / best:.2f}x" for c in CASES) + " |")
    print(f"\nPhysical references, one process, 1 GiB: building the state (allocating "
          f"and first touching it) {built * 1000:.0f} ms; a memcpy of it {copied * 1000:.0f} ms.")


if __name__ == "__main__":
    main()
