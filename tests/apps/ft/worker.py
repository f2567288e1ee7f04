"""A replica group's rank for tests/apps/ft_test.py: a small model trained
with tide.ft across the groups (gradients averaged within its group by
torch's default process group, then over the groups of the quorum).

Each committed step, and each step voted down, is a JSON line in
$OUT/<group>-<rank>.log, with the pid, the time, the quorum and a digest of
the weights. STATE_MB adds a buffer of that size to the state a healing
group receives (bench/ft/ft_bench.py times the heal). Stops at the step in $OUT/stop_at once it exists (every group
reads the same number, and they move in lockstep); MODE=hang: group
$HANG_GROUP stops itself (SIGSTOP) at step $HANG_AT. MODE=diloco: the
groups train with tide.ft.DiLoCo, syncing every $SYNC_EVERY steps (a step
of the logs is a sync; the digest is of the weights and the outer
optimizer's state, which every group shares after a sync).
"""
import hashlib
import json
import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from tide.ft import DiLoCo, Manager, allreduce_gradients

OUT = os.environ["OUT"]
GROUP = os.environ["REPLICA_GROUP_ID"]
RANK = int(os.environ["RANK"])
WORLD = int(os.environ["WORLD_SIZE"])

dist.init_process_group("gloo")
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
optim = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
extra = torch.zeros(int(os.environ.get("STATE_MB", "0")) << 18)  # float32


def load(sd):
    model.load_state_dict(sd["model"])
    optim.load_state_dict(sd["optim"])
    extra.copy_(sd["extra"])


manager = Manager(
    load_state_dict=load,
    state_dict=lambda: {"model": model.state_dict(), "optim": optim.state_dict(),
                        "extra": extra},
    timeout=timedelta(seconds=float(os.environ.get("FT_TIMEOUT", "20"))),
    heartbeat_timeout=timedelta(seconds=float(os.environ.get("FT_HEARTBEAT_TIMEOUT", "5"))))
log = open(os.path.join(OUT, f"{GROUP}-{RANK}.log"), "a", buffering=1)


MODE = os.environ.get("MODE")
# What every group holds alike after a step: the inner optimizer's momentum,
# or under DiLoCo the outer one's (each group's inner one is its own).
shared = optim
if MODE == "diloco":
    shared = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)


def digest():
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    for s in shared.state.values():
        h.update(s["momentum_buffer"].numpy().tobytes())
    return h.hexdigest()[:16]


def write(**fields):
    log.write(json.dumps(dict(fields, pid=os.getpid(), t=time.time())) + "\n")


def stop_at():
    try:
        with open(os.path.join(OUT, "stop_at")) as f:
            return int(f.read())
    except (FileNotFoundError, ValueError):
        return None


def step_within_the_group(seed):
    x = torch.randn(8, 16, generator=torch.Generator().manual_seed(seed))
    optim.zero_grad()
    torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad.div_(WORLD)


def diloco():
    """Syncs every $SYNC_EVERY steps of each group's own."""
    every, i = int(os.environ["SYNC_EVERY"]), 0
    with DiLoCo(manager, model, optim, shared, sync_every=every):
        while True:
            end = stop_at()
            if end is not None and manager.current_step() >= end:
                break
            before, heal = manager.current_step(), manager.last_heal
            i += 1
            step_within_the_group(i * 1000 + int(GROUP) * 10 + RANK)
            optim.step()  # every $SYNC_EVERY-th syncs
            if manager.last_heal is not heal:
                write(event="healed", step=manager.last_heal["step"], digest=digest())
            if manager.current_step() != before:
                write(event="commit", step=manager.current_step(), quorum=manager.quorum_id(),
                      participants=manager.num_participants(), digest=digest())
            elif i % every == 0:
                write(event="abort", step=before, error=repr(manager.errored()))


def every_step():
    while True:
        end = stop_at()
        if end is not None and manager.current_step() >= end:
            break
        before, since = manager.current_step(), time.time()
        manager.start_quorum()
        step = manager.current_step()
        if step != before:
            write(event="healed", step=step, digest=digest(), since=since,
                  heal=manager.last_heal)
        if MODE == "hang" and GROUP == os.environ["HANG_GROUP"] and step == int(os.environ["HANG_AT"]):
            os.kill(os.getpid(), signal.SIGSTOP)
        step_within_the_group(step * 1000 + manager.participating_rank() * 10 + RANK)
        allreduce_gradients(manager, model)
        if manager.should_commit():
            optim.step()
            write(event="commit", step=manager.current_step(), quorum=manager.quorum_id(),
                  participants=manager.num_participants(), digest=digest())
        else:
            write(event="abort", step=manager.current_step(), error=repr(manager.errored()))


write(event="start", step=manager.current_step())
diloco() if MODE == "diloco" else every_step()
write(event="end", step=manager.current_step(), digest=digest(),
      batches=manager.batches_committed())
manager.shutdown()
dist.destroy_process_group()
