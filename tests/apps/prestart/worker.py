"""The workers of tests/apps/prestart_test.py, as torchrun scripts. MODE says
what they do; OUT is a directory they write to."""
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record

OUT = os.environ["OUT"]
RANK = int(os.environ["RANK"])
ATTEMPT = int(os.environ["TORCHELASTIC_RESTART_COUNT"])


def write(name, text):
    path = os.path.join(OUT, name)
    with open(path + ".tmp", "w") as f:
        f.write(text)
    os.rename(path + ".tmp", path)


def ddp():
    """Trains a few steps, rank 1 failing in attempt 0; prints the losses."""
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(RANK)
    losses = []
    for step in range(6):
        x = torch.randn(16, 8, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(f"{loss.item():.6f}")
        if ATTEMPT == 0 and RANK == 1 and step == 2:
            raise RuntimeError("rank 1 fails in attempt 0")
    write(f"losses.{RANK}", " ".join(losses))
    dist.destroy_process_group()


def dump():
    """What a script sees of how it was started."""
    main = sys.modules["__main__"]
    write(f"dump.{RANK}", json.dumps({
        "argv": sys.argv, "path0": sys.path[0], "file": main.__dict__.get("__file__"),
        "name": __name__, "cwd": os.getcwd(), "env": dict(os.environ),
        "unbuffered": not sys.stdout.buffer.__class__.__name__.startswith("Buffered"),
        "stdout_isatty": sys.stdout.isatty(),
    }))
    print(f"stdout of rank {RANK}", flush=True)
    print(f"stderr of rank {RANK}", file=sys.stderr, flush=True)


def fail():
    """Rank 0 raises; the others wait to be stopped."""
    if RANK == 0:
        raise ValueError(f"bad value on rank {RANK}")
    time.sleep(600)


def stuck_in_timer():
    from torch.distributed.elastic.timer import FileTimerClient, configure, expires
    configure(FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    # 3 s: room for a step that is not stuck on a loaded machine.
    with expires(after=3):
        if ATTEMPT == 0 and RANK == 0:
            time.sleep(600)  # stuck: the agent's timer server must reclaim it
    write(f"done.{RANK}", str(ATTEMPT))


def beats_then_hangs():
    """Rank 0 beats once in attempt 0, then hangs: the agent must find it."""
    import socket
    beat = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    beat.connect(os.environ["TIDE_HEARTBEAT_SOCKET"])
    beat.send(b".")
    if ATTEMPT == 0 and RANK == 0:
        time.sleep(600)  # hung
    write(f"done.{RANK}", str(ATTEMPT))


def affinity():
    write(f"affinity.{RANK}", ",".join(str(c) for c in sorted(os.sched_getaffinity(0))))


def hang():
    write(f"pid.{RANK}", str(os.getpid()))
    time.sleep(600)  # until tiderun is killed


@record
def main():
    globals()[os.environ["MODE"]]()


if __name__ == "__main__":
    main()
