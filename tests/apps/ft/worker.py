"""A replica group's rank for tests/apps/ft_test.py: a small model trained
with tide.ft across the groups (gradients averaged within its group by
torch's default process group, then over the groups of the quorum).

Each committed step, and each step voted down, is a JSON line in
$OUT/<group>-<rank>.log, with the pid, the time, the quorum and a digest of
the weights. STATE_MB adds a buffer of that size to the state a healing
group receives (bench/ft/ft_bench.py times the heal). Stops at the step in $OUT/stop_at once it exists (every group
reads the same number, and they move in lockstep); MODE=hang: group
$HANG_GROUP stops itself (SIGSTOP) at step $HANG_AT.
"""
import hashlib
import json
import os
import signal
import time
from datetime import timedelta

import torch
import torch.distributed as dist

from tide.ft import Manager, allreduce_gradients

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


def digest():
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    for s in optim.state.values():
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


write(event="start", step=manager.current_step())
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
    if (os.environ.get("MODE") == "hang" and GROUP == os.environ["HANG_GROUP"]
            and step == int(os.environ["HANG_AT"])):
        os.kill(os.getpid(), signal.SIGSTOP)
    g = torch.Generator().manual_seed(step * 1000 + manager.participating_rank() * 10 + RANK)
    x = torch.randn(8, 16, generator=g)
    y = x.sum(dim=1, keepdim=True)
    optim.zero_grad()
    torch.nn.functional.mse_loss(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad.div_(WORLD)
    allreduce_gradients(manager, model)
    if manager.should_commit():
        optim.step()
        write(event="commit", step=manager.current_step(), quorum=manager.quorum_id(),
              participants=manager.num_participants(), digest=digest())
    else:
        write(event="abort", step=manager.current_step(), error=repr(manager.errored()))
write(event="end", step=manager.current_step(), digest=digest())
manager.shutdown()
dist.destroy_process_group()
