"""Std and SignalException, as in torch.distributed.elastic.multiprocessing.api."""
import signal
from enum import IntFlag
from typing import Dict, Union


class SignalException(Exception):
    """The agent was stopped by a signal (SIGINT, SIGTERM, SIGHUP, SIGQUIT);
    its workers were stopped first."""

    def __init__(self, msg: str, sigval: signal.Signals) -> None:
        super().__init__(msg)
        self.sigval = sigval


class Std(IntFlag):
    """Which of a worker's streams go to its log files (redirects, tee)."""

    NONE = 0
    OUT = 1
    ERR = 2
    ALL = OUT | ERR

    @classmethod
    def from_str(cls, vm: str) -> Union["Std", Dict[int, "Std"]]:
        """"3" -> Std.ALL; "0:1,1:2" -> {0: Std.OUT, 1: Std.ERR}."""

        def one(v: str) -> "Std":
            s = cls(int(v))
            if s not in cls:
                raise ValueError(f"{s} not in {list(cls)}")
            return s

        if ":" not in vm:
            return one(vm)
        out = {}
        for pair in vm.split(","):
            rank, _, v = pair.partition(":")
            out[int(rank)] = one(v)
        return out
