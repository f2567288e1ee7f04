"""A small DDP training script written for torchrun; it runs unchanged under
tiderun:

    PYTHON_EXEC=/usr/bin/python3 tiderun --standalone --nproc-per-node=2 examples/ddp_train.py

With --fail-once, the last rank raises on the first attempt, so
--max-restarts=1 shows the group restarting and finishing.
"""
import argparse
import os

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP


@record
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--fail-once", action="store_true")
    args = parser.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    if args.fail_once and attempt == 0 and rank == world - 1:
        # Before joining the process group, so the others wait in
        # init_process_group until the agent stops them.
        raise RuntimeError(f"rank {rank}: simulated failure on attempt {attempt}")
    dist.init_process_group("gloo", init_method="env://")

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(rank)
    for _ in range(args.steps):
        x = torch.randn(32, 8, generator=gen)
        y = x.sum(dim=1, keepdim=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    # Every rank must hold the same weights after DDP's gradient averaging.
    w = model.module.weight.detach().clone()
    gathered = [torch.zeros_like(w) for _ in range(world)]
    dist.all_gather(gathered, w)
    assert all(torch.equal(g, w) for g in gathered), "replicas diverged"
    if rank == 0:
        print(f"trained {args.steps} steps on {world} ranks (attempt {attempt}); "
              f"final loss {loss.item():.4f}; replicas identical")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
