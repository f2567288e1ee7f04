"""Training that does not stop (docs/fault_tolerance.md): a model trained by
replica groups that agree on every step with tide.ft. Kill any worker while
it runs: the other groups go on, and the killed group comes back, heals from
them and joins again.

    tiderun --standalone --nproc-per-node=2 --replica-groups=3 --max-restarts=3 \\
        examples/python/ft/train.py --steps 2000

Each group trains a full copy; within a group, torch's default process
group averages the ranks' gradients as DDP would; tide.ft then averages
them over the groups of the step's quorum, and the optimizer steps only
when the step commits.
"""
import argparse
import os

import torch
import torch.distributed as dist

from tide.ft import Manager, allreduce_gradients


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=500)
    args = p.parse_args()
    dist.init_process_group("gloo")  # the group's own ranks
    rank, world = dist.get_rank(), dist.get_world_size()
    group = os.environ["REPLICA_GROUP_ID"]

    torch.manual_seed(0)  # every group starts from the same weights
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(), torch.nn.Linear(64, 1))
    optim = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def load_state_dict(sd):
        model.load_state_dict(sd["model"])
        optim.load_state_dict(sd["optim"])

    manager = Manager(
        load_state_dict=load_state_dict,
        state_dict=lambda: {"model": model.state_dict(), "optim": optim.state_dict()},
        min_replica_size=1)
    while manager.current_step() < args.steps:
        manager.start_quorum()
        step = manager.current_step()
        g = torch.Generator().manual_seed(step * 100 + manager.participating_rank() * 10 + rank)
        x = torch.randn(64, 32, generator=g)
        loss = torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        optim.zero_grad()
        loss.backward()
        for param in model.parameters():  # within the group
            dist.all_reduce(param.grad)
            param.grad.div_(world)
        allreduce_gradients(manager, model)  # across the groups
        if manager.should_commit():
            optim.step()
            if rank == 0 and manager.current_step() % 100 == 0:
                print(f"group {group}: step {manager.current_step()}, loss {loss.item():.4f}, "
                      f"{manager.num_participants()} groups", flush=True)
    manager.shutdown()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
