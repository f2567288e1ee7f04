"""A worker of checkpoint_bench.py. BENCH_MODE:

save     builds a state of BENCH_MB MiB (8 float32 tensors) and times, in
         this process: tide.checkpoint.save (BENCH_REPS saves), a memmove of
         the same bytes into a buffer already touched, torch.save to a file
         in BENCH_DIR (the disk a user would use), and a write of the bytes
         there with fsync; writes the times (s) to BENCH_OUT/save.<rank>.json.
restore  attempt 0 saves the state (tide.checkpoint, or torch.save when
         BENCH_STORE=disk) and, 9 s after it started, rank 1 stamps the
         failure and SIGKILLs itself;
         attempt 1 builds the state, loads it (tide.checkpoint.load in place,
         or torch.load and a copy in), runs one training step and stamps it:
         BENCH_OUT/{failure,step1.<rank>,source.<rank>}.
"""
import ctypes
import json
import os
import signal
import statistics
import time

import torch

import tide.checkpoint as ck

MODE = os.environ["BENCH_MODE"]
OUT = os.environ["BENCH_OUT"]
DIR = os.environ["BENCH_DIR"]
MB = int(os.environ["BENCH_MB"])
REPS = int(os.environ.get("BENCH_REPS", "5"))
RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
PIECES = 8
STARTED = time.time()
RUNS_FOR = 9.0  # seconds attempt 0 runs before rank 1 fails


def state():
    n = (MB << 20) // 4 // PIECES
    return {f"layer{i}.weight": torch.full((n,), float(RANK + i)) for i in range(PIECES)}


def stamp(name, value=None):
    with open(os.path.join(OUT, name), "w") as f:
        f.write(str(time.time() if value is None else value))


def timed(fn, reps):
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return times


def save_mode():
    s = state()
    nbytes = sum(t.numel() * 4 for t in s.values())
    out = {"bytes": nbytes}
    out["save"] = timed(lambda: ck.save(s, step=0), REPS)
    dst = torch.empty(nbytes // 4)
    dst.fill_(0)

    def memcpy():
        at = dst.data_ptr()
        for t in s.values():
            ctypes.memmove(at, t.data_ptr(), t.numel() * 4)
            at += t.numel() * 4

    out["memcpy"] = timed(memcpy, REPS)
    path = os.path.join(DIR, f"bench-ckpt-{RANK}.pt")

    def torch_save():
        torch.save(s, path)

    out["torch.save"] = timed(torch_save, max(3, REPS // 2))

    def write_fsync():
        with open(path, "wb") as f:
            for t in s.values():
                f.write(memoryview(t.numpy()).cast("B"))
            f.flush()
            os.fsync(f.fileno())

    out["write+fsync"] = timed(write_fsync, max(3, REPS // 2))
    os.unlink(path)
    with open(os.path.join(OUT, f"save.{RANK}.json"), "w") as f:
        json.dump(out, f)


def train_step(s):
    w = s["layer0.weight"]
    w[:1024].mul_(0.999).add_(0.001)


def restore_mode():
    disk = os.environ.get("BENCH_STORE") == "disk"
    path = os.path.join(DIR, f"bench-ckpt-{RANK}.pt")
    if ATTEMPT == 0:
        s = state()
        train_step(s)
        if disk:
            torch.save(s, path)
        else:
            ck.save(s, step=0)
        stamp(f"saved.{RANK}")
        if RANK == 1:
            while not os.path.exists(os.path.join(OUT, "saved.0")):
                time.sleep(0.001)
            # The job has run a while when it fails, as a job that trains
            # does: tiderun --prestart's pool has refilled (its interpreters
            # import 5 s into an attempt).
            time.sleep(max(0.0, STARTED + RUNS_FOR - time.time()))
            stamp("failure")
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(120)  # stopped by the launcher
    stamp(f"up.{RANK}")
    s = state()
    stamp(f"built.{RANK}")
    if disk:
        loaded = torch.load(path)
        for k, t in s.items():
            t.copy_(loaded[k])
        source = "disk"
    else:
        source = ck.load(s).source
    stamp(f"loaded.{RANK}")
    train_step(s)
    stamp(f"step1.{RANK}")
    stamp(f"source.{RANK}", source)
    if disk:
        os.unlink(path)


{"save": save_mode, "restore": restore_mode}[MODE]()
