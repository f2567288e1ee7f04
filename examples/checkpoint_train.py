"""torchrun's fault-tolerant training pattern (load the last checkpoint at
start, save one as you go) with the checkpoints held in memory by tide's
agent: a DDP script that saves every step, killed mid-run, goes on from the
step it last saved, not from the last disk checkpoint.

    PYTHON_EXEC=/usr/bin/python3 PYTHONPATH=python tiderun --standalone \\
        --nproc-per-node=2 --max-restarts=1 --checkpoint-memory=256M \\
        --checkpoint-dir=/tmp/ckpt examples/checkpoint_train.py --kill-at 30

With --kill-at N, the last rank SIGKILLs itself after step N of the first
attempt; the second attempt says where its state came from and goes on from
step N + 1, every rank alike (load is collective once the process group is
up: from step N when the agent stopped another rank before its save of step
N was in). /tmp/ckpt/rank-R/step-S.pt then holds the newest snapshots,
which torch.load reads without tide.
"""
import argparse
import hashlib
import os
import signal

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import tide.checkpoint


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--kill-at", type=int, default=-1)
    args = parser.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    dist.init_process_group("gloo", init_method="env://")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)

    # The quickstart's load at start: here from the agent's memory (or
    # --checkpoint-dir when memory has none), in place into the model.
    state = {"model": model.module.state_dict(), "opt": opt.state_dict(),
             "rng": gen.get_state()}
    state, step = loaded = tide.checkpoint.load(state)
    start = 0
    if step is not None:
        opt.load_state_dict(state["opt"])
        gen.set_state(state["rng"])
        start = step + 1
    print(f"rank {rank}, attempt {attempt}: starting at step {start} "
          f"(state from {loaded.source})", flush=True)

    for step in range(start, args.steps):
        x = torch.randn(32, 8, generator=gen)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        # The quickstart's save, at every step: a copy into memory.
        tide.checkpoint.save({"model": model.module.state_dict(), "opt": opt.state_dict(),
                              "rng": gen.get_state()}, step=step)
        if step == args.kill_at and attempt == 0 and rank == world - 1:
            os.kill(os.getpid(), signal.SIGKILL)
    if rank == 0:
        weights = b"".join(p.detach().numpy().tobytes() for p in model.parameters())
        print(f"done: loss {loss.item():.5f}, weights {hashlib.sha256(weights).hexdigest()[:16]}",
              flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
