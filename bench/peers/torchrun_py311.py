#!/usr/bin/python3
"""Runs Debian 12's stock torchrun (PyTorch 1.13.1) on Python 3.11.

torch 1.13 parses -r/-t values by looking the number up among the members of
its Std IntFlag. Since Python 3.11, iterating an IntFlag skips the zero and
multi-bit members, so "0" (the default) and "3" are not found and torchrun
fails right after the rendezvous. This script swaps in a parser that builds
the flag from the number itself, then starts torchrun unchanged. Flags are
torch 1.13's (underscore spellings: --nproc_per_node, --max_restarts, ...).

    /usr/bin/python3 bench/peers/torchrun_py311.py --standalone --nproc_per_node=2 train.py
"""
import sys

from torch.distributed.elastic.multiprocessing import api


def parse_std(cls, text):
    text = text.strip()
    if ":" not in text:
        return cls(int(text))
    by_rank = {}
    for item in text.split(","):
        rank, value = item.split(":")
        by_rank[int(rank)] = cls(int(value))
    return by_rank


api.Std.from_str = classmethod(parse_std)

if __name__ == "__main__":
    from torch.distributed.run import main

    sys.exit(main())
