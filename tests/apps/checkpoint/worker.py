"""A worker of checkpoint_test.py: MODE picks what it does, OUT is where it
writes what it saw (JSON, one file per rank and attempt)."""
import faulthandler
import json
import os
import signal
import threading
import time

import torch

import tide.checkpoint as ck
from worker_digest import digest

MODE = os.environ["MODE"]
OUT = os.environ["OUT"]
RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
# Where it is, on SIGUSR1: what checkpoint_test.py asks of a worker past its time.
faulthandler.register(signal.SIGUSR1, all_threads=True)


def report(**what):
    path = os.path.join(OUT, f"{MODE}.{RANK}.{ATTEMPT}.json")
    with open(path + ".tmp", "w") as f:
        json.dump(what, f)
    os.rename(path + ".tmp", path)


def state_of(step):
    """A state of every kind save takes, different at each step and rank."""
    g = torch.Generator().manual_seed(1000 * RANK + step)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g))
    big = torch.randn(64, 33, generator=g)
    return {
        "model": model.state_dict(),
        "extra": {
            "bf16": torch.randn(17, generator=g).to(torch.bfloat16),
            "int": torch.randint(-9, 9, (5, 3), generator=g),
            "bool": torch.rand(7, generator=g) > 0.5,
            "scalar": torch.tensor(step * 1.5),
            "empty": torch.empty(0, 4),
            "strided": big[:, ::3],
        },
        "step": step,
        "meta": ["lr", 0.1 * step, ("betas", (0.9, 0.99)), None],
    }


def saves_then_dies():
    """Attempt 0 saves steps 0-4 and is killed; attempt 1 loads twice (new
    tensors, then in place) and reports what it got."""
    if ATTEMPT == 0:
        for step in range(5):
            ck.save(state_of(step), step=step)
        report(saved=digest(state_of(4)))
        if RANK == 1:
            # Once rank 0 has saved too (its report written).
            while not os.path.exists(os.path.join(OUT, f"{MODE}.0.0.json")):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # stopped by the agent
    fresh = ck.load()
    target = state_of(0)
    weight = target["model"]["0.weight"]
    in_place = ck.load(target)
    report(step=fresh.step, source=fresh.source, fresh=digest(fresh.state),
           in_place_step=in_place.step, in_place=digest(in_place.state),
           kept_objects=in_place.state is target and target["model"]["0.weight"] is weight)


def big_save_killed():
    """Attempt 0 saves step 0, then starts saving step 1 (256 MiB) and is
    killed in the middle of it; attempt 1 loads."""
    if ATTEMPT == 0:
        region = ck._open()
        slots = [region.offset(2 * int(os.environ["LOCAL_RANK"]) + i) for i in (0, 1)]
        ck.save({"w": torch.full((64 << 20,), 1.0)}, step=0)
        step0 = [region.head(i) is not None for i in range(region.slots)]
        data = torch.full((64 << 20,), 2.0)

        def kill_once_writing():
            while True:
                for base in slots:
                    state = int.from_bytes(region.mm[base + 12:base + 16], "little")
                    if state == 1:
                        os.kill(os.getpid(), signal.SIGKILL)
                time.sleep(0.0002)

        report(step0_slots=step0)
        threading.Thread(target=kill_once_writing, daemon=True).start()
        ck.save({"w": data}, step=1)
        report(step0_slots=step0, finished=True)  # must not happen
        time.sleep(60)
    loaded = ck.load()
    w = loaded.state["w"]
    report(step=loaded.step, source=loaded.source, all_ones=bool((w == 1.0).all()),
           numel=w.numel())


def refusals():
    """A state over the bound, a value pickle refuses, a bad step: each a
    clear error, and the last snapshot kept."""
    ck.save({"w": torch.arange(10)}, step=3)
    errors = {}
    for name, call in (
        ("too_big", lambda: ck.save({"w": torch.zeros(8 << 20)}, step=4)),
        ("unpicklable", lambda: ck.save({"opt": {"groups": [{"fn": lambda: 0}]}}, step=4)),
        ("bad_step", lambda: ck.save({}, step=-1)),
        ("sparse", lambda: ck.save({"s": torch.eye(3).to_sparse()}, step=4)),
        ("mismatch", lambda: ck.load({"w": torch.zeros(11)})),
    ):
        try:
            call()
            errors[name] = None
        except ck.CheckpointError as e:
            errors[name] = str(e)
    loaded = ck.load()
    report(errors=errors, step=loaded.step, w=loaded.state["w"].tolist())


def write_behind():
    """Saves steps 0-4, says so, then ends (or waits to be stopped)."""
    for step in range(5):
        ck.save(state_of(step), step=step)
    report(saved=digest(state_of(4)))
    if os.environ.get("THEN") == "wait":
        time.sleep(120)


def from_disk():
    """A new job: nothing in memory, the snapshot from --checkpoint-dir."""
    loaded = ck.load()
    report(step=loaded.step, source=loaded.source, digest=digest(loaded.state))


def agree():
    """Ranks that saved different steps: a collective load meets on the
    newest that both hold; a step one lacks, or none in common, is an error
    on both."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method="env://")

    def error(call):
        try:
            call()
        except ck.CheckpointError as e:
            return str(e)
        return None

    for step in range(4 + RANK):  # rank 0: steps 0-3; rank 1: 0-4
        ck.save(state_of(step), step=step)
    dist.barrier()
    met = ck.load()
    alone = ck.load(process_group=False)
    lacking = error(lambda: ck.load(step=4))
    dist.barrier()
    for step in ((7, 8) if RANK == 0 else (1, 2)):
        ck.save(state_of(step), step=step)
    dist.barrier()
    apart = error(ck.load)
    report(step=met.step, source=met.source, digest=digest(met.state), expected=digest(state_of(3)),
           alone=alone.step, lacking=lacking, apart=apart)
    # Right after a load: under torch < 2.8 this hung one run in five while
    # load gathered with all_gather_object (docs/checkpoints.md).
    dist.destroy_process_group()


def train():
    """DDP over gloo, a save every step, STEPS steps paced by a short
    compute stand-in; each rank writes the last step it saved to
    OUT/progress.RANK, and at the end where it started from and a digest of
    its weights."""
    import hashlib

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    dist.init_process_group("gloo", init_method="env://")
    torch.manual_seed(0)
    # One parameter, so one tensor in DDP's bucket: a restarted DDP reduces
    # its first step with the buckets of a first step, which for several
    # tensors lay them out (and, over 4 ranks, round their sum) otherwise
    # than the rebuilt buckets of a run that went on.
    model = DDP(torch.nn.Linear(64, 64, bias=False))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    gen = torch.Generator().manual_seed(RANK)
    state = {"model": model.module.state_dict(), "opt": opt.state_dict(), "rng": gen.get_state()}
    loaded = ck.load(state)
    start = 0
    if loaded.step is not None:
        opt.load_state_dict(loaded.state["opt"])
        gen.set_state(loaded.state["rng"])
        start = loaded.step + 1
    for step in range(start, int(os.environ["STEPS"])):
        x = torch.randn(16, 64, generator=gen)
        loss = (model(x) - x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        ck.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                 "rng": gen.get_state()}, step=step)
        progress = os.path.join(OUT, f"progress.{RANK}")
        with open(progress + ".tmp", "w") as f:
            f.write(str(step))
        os.rename(progress + ".tmp", progress)
        time.sleep(0.02)
    weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
    report(start=start, source=loaded.source, weights=hashlib.sha256(weights).hexdigest())
    dist.destroy_process_group()


{"agree": agree, "train": train, "saves_then_dies": saves_then_dies, "write_behind": write_behind, "from_disk": from_disk, "big_save_killed": big_save_killed,
 "refusals": refusals}[MODE]()
