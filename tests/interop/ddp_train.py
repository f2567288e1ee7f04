#!/usr/bin/python3
"""A DDP training script written for torchrun, for tiderun's interop tests.

Run by a launcher (torchrun or tiderun) as ``python3 -u ddp_train.py ...``:
it reads RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT the way every torchrun
script does, through ``init_process_group("gloo", init_method="env://")``,
trains a tiny model on the CPU with DistributedDataParallel for a few steps,
each rank on different data, then checks with an all-reduce that every rank
ends with the same parameters. Nothing in it knows about tiderun.

Options (all optional):
  --steps N             training steps (default 5)
  --marker-dir DIR      write DIR/attempt_<TORCHELASTIC_RESTART_COUNT>_rank_<RANK>
                        when the worker starts, and ..._done when it finished
  --fail-rank R         this rank raises before joining the group ...
  --fail-attempt A      ... when TORCHELASTIC_RESTART_COUNT == A (default 0)

The failure is a plain uncaught exception, so @record writes it to
$TORCHELASTIC_ERROR_FILE and the launcher can show it in its summary. It is
raised before init_process_group, so the other ranks block there (and are
stopped by the launcher) rather than fail themselves: the root cause is
always the injected one.

Prints ``DDP OK rank=<r> world=<w> attempt=<a> checksum=<c>`` on success.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel

FAILURE_MESSAGE = "injected failure: rank {rank} on attempt {attempt}"


def touch(marker_dir, name):
    if marker_dir:
        with open(os.path.join(marker_dir, name), "w") as f:
            f.write(f"{os.getpid()}\n")


@record
def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--marker-dir", default="")
    parser.add_argument("--fail-rank", type=int, default=-1)
    parser.add_argument("--fail-attempt", type=int, default=0)
    args = parser.parse_args()

    rank = int(os.environ["RANK"])
    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    touch(args.marker_dir, f"attempt_{attempt}_rank_{rank}")
    if rank == args.fail_rank and attempt == args.fail_attempt:
        raise RuntimeError(FAILURE_MESSAGE.format(rank=rank, attempt=attempt))

    dist.init_process_group("gloo", init_method="env://")
    world = dist.get_world_size()
    assert dist.get_rank() == rank, (dist.get_rank(), rank)
    assert world == int(os.environ["WORLD_SIZE"]), world

    torch.manual_seed(1234 + rank)  # different initial weights per rank:
    model = torch.nn.Sequential(  # DDP must broadcast rank 0's
        torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
    )
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.05)
    data = torch.Generator().manual_seed(99 + rank)  # different data per rank
    for _ in range(args.steps):
        x = torch.randn(32, 8, generator=data)
        y = x.sum(dim=1, keepdim=True)
        optimizer.zero_grad()
        loss = torch.nn.functional.mse_loss(ddp(x), y)
        loss.backward()
        optimizer.step()

    # Every rank must hold the same parameters: compare each with the max
    # and the min over all ranks.
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    hi = flat.clone()
    lo = flat.clone()
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    if not (torch.equal(hi, flat) and torch.equal(lo, flat)):
        raise RuntimeError(
            f"rank {rank}: parameters differ across ranks after training "
            f"(max |hi - lo| = {(hi - lo).abs().max().item()})"
        )
    dist.barrier()
    print(
        f"DDP OK rank={rank} world={world} attempt={attempt} "
        f"checksum={flat.sum().item():.6f}",
        flush=True,
    )
    dist.destroy_process_group()
    touch(args.marker_dir, f"attempt_{attempt}_rank_{rank}_done")


if __name__ == "__main__":
    sys.exit(main())
