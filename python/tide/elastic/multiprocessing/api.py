"""Std, SignalException and torch >= 2.3's LogsSpecs, as in
torch.distributed.elastic.multiprocessing.api."""
import os
import signal
import tempfile
from enum import IntFlag
from typing import Dict, Optional, Set, Union


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


class LogsSpecs:
    """Where a worker group's logs go and which streams (torch >= 2.3's
    LogsSpecs): `log_dir`, `redirects`, `tee` and `local_ranks_filter` (the
    local ranks whose tee'd or unredirected output reaches the console).

    tide's agent reads those four and lays the files out itself, as torch's
    DefaultLogsSpecs does: <root_log_dir>/<run_id>_<random>/attempt_<n>/
    <local_rank>/{stdout.log,stderr.log,error.json}. It never calls reify,
    so a subclass's own layout is not used (a warning says so)."""

    def __init__(self, log_dir: Optional[str] = None,
                 redirects: Union[Std, Dict[int, Std]] = Std.NONE,
                 tee: Union[Std, Dict[int, Std]] = Std.NONE,
                 local_ranks_filter: Optional[Set[int]] = None) -> None:
        self._root_log_dir = log_dir
        self._redirects = redirects
        self._tee = tee
        self._local_ranks_filter = local_ranks_filter

    @property
    def root_log_dir(self) -> str:
        return str(self._root_log_dir)

    def reify(self, envs):
        raise NotImplementedError(
            "tide's agent lays out the logs itself and never calls reify (see LogsSpecs)")


class DefaultLogsSpecs(LogsSpecs):
    """torch's default: `log_dir` is made if missing (a new directory under
    $TMPDIR when not given); a file there is an error."""

    def __init__(self, log_dir: Optional[str] = None,
                 redirects: Union[Std, Dict[int, Std]] = Std.NONE,
                 tee: Union[Std, Dict[int, Std]] = Std.NONE,
                 local_ranks_filter: Optional[Set[int]] = None) -> None:
        if log_dir == os.devnull:
            raise ValueError("log_dir=os.devnull (no log files at all) is not supported by "
                             "tide's agent: give a directory, or none for a new one")
        if not log_dir:
            log_dir = tempfile.mkdtemp(prefix="torchelastic_")
        elif os.path.isfile(log_dir):
            raise NotADirectoryError(f"log_dir: {log_dir} is a file")
        else:
            os.makedirs(log_dir, exist_ok=True)
        super().__init__(log_dir, redirects, tee, local_ranks_filter)

    def __repr__(self) -> str:
        return (f"DefaultLogsSpecs(root_log_dir={self._root_log_dir}, "
                f"redirects={self._redirects}, tee={self._tee}, "
                f"local_ranks_filter={self._local_ranks_filter})")
