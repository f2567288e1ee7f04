#!/usr/bin/python3
"""A parameter server with torch.distributed.rpc, on a backend of your choice.

worker0 holds a small model (the parameter server) and directs; trainer1 and trainer2
train it in turn on synthetic data (a fixed random regression task): each step runs
the model's forward on the server through an RRef, a distributed backward pass and a
DistributedOptimizer step over the server's parameters. Prints each trainer's losses
and the final weights.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/parameter_server.py --backend tide
    /usr/bin/python3 examples/python/parameter_server.py --backend tensorpipe
"""
import argparse
import socket

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch import nn, optim
from torch.distributed.optim import DistributedOptimizer

STEPS = 20
BATCH = 32


class ParameterServer(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1))

    def forward(self, x):
        return self.model(x)

    def parameter_rrefs(self):
        return [rpc.RRef(p) for p in self.parameters()]

    def weights(self):
        return [p.detach().clone() for p in self.parameters()]


def train(server, seed):
    """One trainer's run: STEPS steps on its own synthetic batches; returns the losses."""
    data = torch.Generator().manual_seed(seed)
    target_weights = torch.arange(8, dtype=torch.float32) / 8
    optimizer = DistributedOptimizer(optim.SGD, server.rpc_sync().parameter_rrefs(), lr=0.05)
    losses = []
    for _ in range(STEPS):
        x = torch.randn(BATCH, 8, generator=data)
        y = (x @ target_weights).unsqueeze(1)
        with dist_autograd.context() as context_id:
            loss = nn.functional.mse_loss(server.rpc_sync().forward(x), y)
            dist_autograd.backward(context_id, [loss])
            optimizer.step(context_id)
        losses.append(loss.item())
    return losses


def run(rank, backend, port):
    torch.set_num_threads(1)
    if backend == "tide":
        import tide.torch_rpc  # noqa: F401  registers BackendType.TIDE
    kind = rpc.BackendType[backend.upper()]
    options = rpc.backend_registry.construct_rpc_backend_options(
        kind, init_method=f"tcp://127.0.0.1:{port}")
    name = "ps" if rank == 0 else f"trainer{rank}"
    rpc.init_rpc(name, rank=rank, world_size=3, backend=kind, rpc_backend_options=options)
    if rank == 0:
        server = rpc.RRef(ParameterServer())
        for seed, trainer in enumerate(("trainer1", "trainer2")):
            losses = rpc.rpc_sync(trainer, train, args=(server, seed))
            print(f"{trainer} losses: first {losses[0]:.6f}, last {losses[-1]:.6f}")
            print(f"{trainer} all losses: {losses}")
        print("final weights:", [w.tolist() for w in server.local_value().weights()])
    rpc.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("tide", "tensorpipe"), default="tide")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(run, args=(args.backend, port), nprocs=3, join=True, start_method="spawn")


if __name__ == "__main__":
    main()
