"""The Python side of the C++ twin's test (tests/checkpoint/torch_worker.cpp
computes the same state_of):

    interop.py save STEP    saves state_of(STEP) with tide.checkpoint
    interop.py check STEP   loads and checks it is state_of(STEP), bit for bit
"""
import os
import sys

import torch

import tide.checkpoint as ck

RANK = int(os.environ["RANK"])


def state_of(step):
    return {
        "w": torch.arange(24, dtype=torch.float32).reshape(4, 6) * (step + 1) + RANK,
        "half": (torch.arange(10, dtype=torch.float32) * step).to(torch.bfloat16),
        "ids": torch.arange(5) * (RANK + 1) + step,
        "mask": torch.arange(7) % 2 == step % 2,
        "scalar": torch.tensor(step * 0.5, dtype=torch.float64),
        "empty": torch.empty(0, 3),
        "strided": torch.arange(12, dtype=torch.float32).reshape(3, 4).t() + step,
    }


def same_bytes(a, b):
    return a.dtype == b.dtype and a.shape == b.shape and \
        a.contiguous().reshape(-1).view(torch.uint8).equal(b.contiguous().reshape(-1).view(torch.uint8))


mode, step = sys.argv[1], int(sys.argv[2])
if mode == "save":
    ck.save(state_of(step), step=step)
else:
    loaded = ck.load(process_group=False)
    want = state_of(step)
    if loaded.step != step or list(loaded.state) != list(want):
        sys.exit(f"rank {RANK}: loaded step {loaded.step} with {list(loaded.state or {})}")
    for key, t in want.items():
        if not same_bytes(loaded.state[key], t):
            sys.exit(f"rank {RANK}: state[{key!r}] differs")
    print(f"rank {RANK}: Python read step {step} of C++, bit for bit", flush=True)
