#!/usr/bin/python3
"""The "simple end-to-end" distributed autograd program of torch's docs, on a backend of
your choice: worker0 makes two random tensors on worker1 (remote()), adds them, runs a
distributed backward pass and one DistributedOptimizer step, and prints the tensors
worker1 then holds.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/dist_autograd_e2e.py --backend tide
    /usr/bin/python3 examples/python/dist_autograd_e2e.py --backend tensorpipe

The only line that differs between the two backends is the backend= of init_rpc.
"""
import argparse
import socket

import torch
import torch.distributed.autograd as dist_autograd
import torch.distributed.rpc as rpc
import torch.multiprocessing as mp
from torch import optim
from torch.distributed.optim import DistributedOptimizer


def random_tensor(seed):
    # Its own generator: the two remote() calls may run at once on worker1's threads, in
    # either order, so the global generator would hand out its numbers in either order.
    generator = torch.Generator().manual_seed(seed)
    return torch.rand((3, 3), generator=generator, requires_grad=True)


def run(rank, backend, port):
    torch.set_num_threads(1)
    if backend == "tide":
        import tide.torch_rpc  # noqa: F401  registers BackendType.TIDE
    options = rpc.backend_registry.construct_rpc_backend_options(
        rpc.BackendType[backend.upper()], init_method=f"tcp://127.0.0.1:{port}")
    rpc.init_rpc(f"worker{rank}", rank=rank, world_size=2,
                 backend=rpc.BackendType[backend.upper()], rpc_backend_options=options)
    if rank == 0:
        with dist_autograd.context() as context_id:
            rref1 = rpc.remote("worker1", random_tensor, args=(1,))
            rref2 = rpc.remote("worker1", random_tensor, args=(2,))
            loss = rref1.to_here() + rref2.to_here()
            dist_autograd.backward(context_id, [loss.sum()])
            grads = dist_autograd.get_gradients(context_id)
            print("gradients of the local copies:", len(grads))
            optimizer = DistributedOptimizer(optim.SGD, [rref1, rref2], lr=0.05)
            optimizer.step(context_id)
        for name, rref in (("t1", rref1), ("t2", rref2)):
            print(f"{name} after one SGD step:", rref.to_here().tolist())
    rpc.shutdown()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("tide", "tensorpipe"), default="tide")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    mp.start_processes(run, args=(args.backend, port), nprocs=2, join=True, start_method="spawn")


if __name__ == "__main__":
    main()
