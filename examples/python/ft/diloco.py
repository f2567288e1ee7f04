"""DiLoCo on tide.ft (docs/fault_tolerance.md): each replica group trains
on its own shard for --sync-every steps with its inner optimizer; then the
groups average how far they moved from the last synced weights, and an outer
optimizer (SGD with Nesterov momentum, as in the DiLoCo paper) moves the
synced weights by that average. The groups talk once every --sync-every
steps instead of every step. A group that fails is left out of the next
sync; when it comes back it heals at a sync from a healthy group (the
synced weights and the outer optimizer's state). One rank per replica
group:

    tiderun --standalone --nproc-per-node=1 --replica-groups=2 --max-restarts=3 \\
        examples/python/ft/diloco.py --steps 20 --sync-every 10

--steps counts syncs (manager.current_step()).
"""
import argparse
import os

import torch
from torch.utils.data import DataLoader, TensorDataset

from tide.ft import DiLoCo, DistributedSampler, Manager

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
    p.add_argument("--steps", type=int, default=20, help="syncs to commit")
    p.add_argument("--sync-every", type=int, default=10, help="inner steps between syncs")
    args = p.parse_args()

    torch.manual_seed(0)  # every group starts from the same weights and data
    x = torch.randn(512, 8)
    dataset = TensorDataset(x, x.sum(dim=1, keepdim=True))
    sampler = DistributedSampler(dataset, replica_rank=REPLICA_GROUP_ID,
                                 num_replica_groups=NUM_REPLICA_GROUPS,
                                 group_rank=0, num_replicas=1, shuffle=True)
    data = batches(DataLoader(dataset, batch_size=16, sampler=sampler), sampler)

    model = torch.nn.Linear(8, 1)
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    outer = torch.optim.SGD(model.parameters(), lr=0.7, momentum=0.9, nesterov=True)
    manager = Manager(load_state_dict=model.load_state_dict, state_dict=model.state_dict,
                      min_replica_size=1)
    with DiLoCo(manager, model, inner, outer, sync_every=args.sync_every):
        while manager.current_step() < args.steps:
            inputs, labels = next(data)
            inner.zero_grad()
            torch.nn.functional.mse_loss(model(inputs), labels).backward()
            inner.step()  # every --sync-every-th also syncs
    weights = ",".join(f"{v:.6f}" for v in model.weight.detach().flatten().tolist())
    print(f"group {REPLICA_GROUP_ID}: sync {manager.current_step()}, weights {weights}", flush=True)
    manager.shutdown()


if __name__ == "__main__":
    main()
