"""A training loop in TorchFT's idiom on tide.ft (docs/fault_tolerance.md):
the optimizer wrapper starts each step's quorum in zero_grad() and steps
only when the step commits; each gradient is averaged over the groups with
manager.allreduce(...).wait(). One rank per replica group:

    tiderun --standalone --nproc-per-node=1 --replica-groups=2 --max-restarts=3 \\
        examples/python/ft/torchft_style.py --steps 200

From a TorchFT script, what changes is the import (tide.ft for torchft) and
the process group: tide.ft forms its own (pass no pg).
"""
import argparse
import os

import torch

from tide.ft import Manager, OptimizerWrapper


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=200)
    args = p.parse_args()
    group = os.environ["REPLICA_GROUP_ID"]

    torch.manual_seed(0)  # every group starts from the same weights
    model = torch.nn.Linear(8, 1)
    inner = torch.optim.SGD(model.parameters(), lr=0.05)
    manager = Manager(load_state_dict=model.load_state_dict, state_dict=model.state_dict,
                      min_replica_size=1)
    manager.register_state_dict_fn("optim", inner.load_state_dict, inner.state_dict)
    optimizer = OptimizerWrapper(manager, inner)
    while manager.current_step() < args.steps:
        optimizer.zero_grad()  # this step's quorum (and healing)
        g = torch.Generator().manual_seed(manager.current_step() * 10 + manager.participating_rank())
        x = torch.randn(16, 8, generator=g)
        torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
        for param in model.parameters():
            manager.allreduce(param.grad).wait()
        optimizer.step()  # only when every group's step succeeded
    weights = ",".join(f"{v:.6f}" for v in model.weight.detach().flatten().tolist())
    print(f"group {group}: step {manager.current_step()}, "
          f"{manager.batches_committed()} batches committed, weights {weights}", flush=True)
    manager.shutdown()


if __name__ == "__main__":
    main()
