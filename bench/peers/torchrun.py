#!/usr/bin/python3
"""Runs Debian's stock torchrun with the one fix that its torch needs here.

Debian 12 (PyTorch 1.13.1 on Python 3.11): torch 1.13 parses -r/-t values by
looking the number up among the members of its Std IntFlag. Since Python
3.11, iterating an IntFlag skips the zero and multi-bit members, so "0" (the
default) and "3" are not found and torchrun fails right after the
rendezvous. This script swaps in a parser that builds the flag from the
number itself.

Debian 13 (PyTorch 2.6 on Python 3.13): torch is built without libuv, while
TCPStore asks for it by default and torchrun's rendezvous makes its stores
without saying otherwise, so torchrun cannot start at all, whatever USE_LIBUV
says. This script makes TCPStore's default follow USE_LIBUV
(bench/peers/libuv_fix.py): run it with USE_LIBUV=0 there.

Then it starts torchrun unchanged. Flags are the installed torch's (1.13:
underscore spellings only, --nproc_per_node, --max_restarts, ...).

    /usr/bin/python3 bench/peers/torchrun.py --standalone --nproc_per_node=2 train.py
    USE_LIBUV=0 /usr/bin/python3 bench/peers/torchrun.py ...   # Debian 13
"""
import sys

import torch
from torch.distributed.elastic.multiprocessing import api

from libuv_fix import follow_use_libuv


def parse_std(cls, text):
    text = text.strip()
    if ":" not in text:
        return cls(int(text))
    by_rank = {}
    for item in text.split(","):
        rank, value = item.split(":")
        by_rank[int(rank)] = cls(int(value))
    return by_rank


if __name__ == "__main__":
    if torch.__version__.startswith("1."):
        api.Std.from_str = classmethod(parse_std)
    from torch.distributed.run import main

    follow_use_libuv()
    sys.exit(main())
