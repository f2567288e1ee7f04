"""A training loop in TorchFT's idiom on tide.ft (docs/fault_tolerance.md):
the model wrapped in DistributedDataParallel(manager, ...) averages its
gradients over the replica groups after each backward pass; the optimizer
wrapper starts each step's quorum in zero_grad() and steps only when the
step commits; each group reads its own shard of the data. One rank per
replica group:

    tiderun --standalone --nproc-per-node=1 --replica-groups=2 --max-restarts=3 \\
        examples/python/ft/torchft_style.py --steps 200

From a TorchFT script, what changes is the import: tide.ft for torchft.
"""
import argparse
import os
from datetime import timedelta

import torch
from torch.utils.data import DataLoader, TensorDataset

from tide.ft import DistributedDataParallel, DistributedSampler, Manager, Optimizer, ProcessGroupGloo

REPLICA_GROUP_ID = int(os.environ.get("REPLICA_GROUP_ID", 0))
NUM_REPLICA_GROUPS = int(os.environ.get("NUM_REPLICA_GROUPS", 2))


def batches(loader, sampler):
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        yield from loader
        epoch += 1


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()

    torch.manual_seed(0)  # every group starts from the same weights and data
    x = torch.randn(256, 8)
    dataset = TensorDataset(x, x.sum(dim=1, keepdim=True))
    sampler = DistributedSampler(dataset, replica_rank=REPLICA_GROUP_ID,
                                 num_replica_groups=NUM_REPLICA_GROUPS,
                                 group_rank=0, num_replicas=1, shuffle=True)
    data = batches(DataLoader(dataset, batch_size=16, sampler=sampler), sampler)

    m = torch.nn.Linear(8, 1)
    inner = torch.optim.SGD(m.parameters(), lr=0.05)
    manager = Manager(pg=ProcessGroupGloo(timeout=timedelta(seconds=10)),
                      load_state_dict=m.load_state_dict, state_dict=m.state_dict,
                      min_replica_size=1, replica_id=f"torchft_style_{REPLICA_GROUP_ID}")
    manager.register_state_dict_fn("optim", inner.load_state_dict, inner.state_dict)
    model = DistributedDataParallel(manager, m)
    optimizer = Optimizer(manager, inner)
    while manager.current_step() < args.steps:
        inputs, labels = next(data)
        optimizer.zero_grad()  # this step's quorum (and healing)
        torch.nn.functional.mse_loss(model(inputs), labels).backward()  # averaged over groups
        optimizer.step()  # only when every group's step succeeded
    weights = ",".join(f"{v:.6f}" for v in m.weight.detach().flatten().tolist())
    print(f"group {REPLICA_GROUP_ID}: step {manager.current_step()}, "
          f"{manager.batches_committed()} batches committed, weights {weights}", flush=True)
    manager.shutdown()


if __name__ == "__main__":
    main()
