"""torch's launcher test case, as its test_init_method_{env,tcp}_with_torchelastic
run it: init_process_group through an init method, one all_reduce (every rank
sums a one-hot vector of its rank and checks the world size), "Done", and no
destroy_process_group before exit unless --destroy.

Without it, torch 2.6 on Python 3.13 aborts at exit now and then, under any
launcher or none: gloo's worker thread may drop the last reference to the
all_reduce's tensor while the interpreter finalizes; taking the GIL then ends
the thread (pthread_exit), whose forced unwind meets a noexcept frame
("terminate called without an active exception").

    init_method_worker.py --init-method env://|tcp://HOST:PORT [--destroy]
"""
import argparse
import os

import torch
import torch.distributed as dist


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--init-method", required=True)
    parser.add_argument("--destroy", action="store_true")
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method=args.init_method, rank=rank,
                            world_size=world_size)
    t = torch.zeros(world_size, dtype=torch.int64)
    t[rank] = 1
    dist.all_reduce(t)
    if int(t.sum()) != world_size:
        raise RuntimeError(f"rank {rank}: all_reduce summed {t.tolist()}")
    print(f"rank {rank}: Done", flush=True)
    if args.destroy:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
