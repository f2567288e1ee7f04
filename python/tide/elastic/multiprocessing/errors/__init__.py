"""Worker failures and the error file, as torch.distributed.elastic.multiprocessing.errors.

``@record`` on a worker's entry function writes an exception to the file named
by TORCHELASTIC_ERROR_FILE (torch's JSON: message, traceback, timestamp), where
the agent reads it into the ProcessFailure of RunResult.failures.
"""
import functools
import json
import os
import signal
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Callable, Dict, Optional, Tuple, TypeVar

T = TypeVar("T")

_NO_ERROR_FILE = "<N/A>"


@dataclass
class ProcessFailure:
    """Why a worker failed: exit code (minus the signal number when a signal
    killed it), pid, and what its error file says. message and timestamp come
    from the error file when the worker wrote one, as in torch."""

    local_rank: int
    pid: int
    exitcode: int
    error_file: str
    error_file_data: Dict[str, Any] = field(init=False)
    message: Any = field(init=False)
    timestamp: int = field(init=False)

    def __post_init__(self) -> None:
        self.error_file_data = {"message": "<NONE>"}
        self.message = ""
        self.timestamp = int(time.time())
        if self.error_file and os.path.isfile(self.error_file):
            with open(self.error_file) as fp:
                self.error_file_data = json.load(fp)
            self.message, self.timestamp = _message_and_time(self.error_file_data)
        if not self.message:
            if self.exitcode < 0:
                self.message = (f"Signal {-self.exitcode} ({self.signal_name()}) "
                                f"received by PID {self.pid}")
            else:
                self.message = ("exited with code {}; to see the worker's error here, "
                                "decorate its entry function with @record"
                                .format(self.exitcode))

    def signal_name(self) -> str:
        if self.exitcode < 0:
            try:
                return signal.Signals(-self.exitcode).name
            except ValueError:
                return _NO_ERROR_FILE
        return _NO_ERROR_FILE

    def timestamp_isoformat(self) -> str:
        return datetime.fromtimestamp(self.timestamp).isoformat(sep="_")


def _message_and_time(data: Dict[str, Any]) -> Tuple[Any, int]:
    message = data["message"]
    if isinstance(message, str):
        return message, int(data.get("timestamp", 0))
    return message, int(message["extraInfo"]["timestamp"])


class ChildFailedError(Exception):
    """Raised by a launcher when workers failed: ``name`` is the entrypoint,
    ``failures`` the ProcessFailures by global rank."""

    def __init__(self, name: str, failures: Dict[int, ProcessFailure]) -> None:
        self.name = name
        self.failures = failures
        super().__init__(self.format_msg())

    def get_first_failure(self) -> Tuple[int, ProcessFailure]:
        rank = min(self.failures, key=lambda r: self.failures[r].timestamp)
        return rank, self.failures[rank]

    def format_msg(self) -> str:
        lines = [f"{self.name} FAILED"]
        for rank, f in sorted(self.failures.items()):
            lines.append(f"  rank {rank} (local_rank {f.local_rank}, pid {f.pid}): "
                         f"exitcode {f.exitcode} at {f.timestamp_isoformat()}: {f.message}")
        return "\n".join(lines)


class ErrorHandler:
    """Writes a worker's uncaught exception to TORCHELASTIC_ERROR_FILE."""

    def initialize(self) -> None:
        try:
            import faulthandler
            faulthandler.enable(all_threads=True)
        except Exception:  # a stream without a file descriptor
            pass

    def record_exception(self, e: BaseException) -> None:
        path = os.environ.get("TORCHELASTIC_ERROR_FILE")
        if not path:
            return
        data = {
            "message": {
                "message": f"{type(e).__name__}: {e}",
                "extraInfo": {
                    "py_callstack": traceback.format_exc(),
                    "timestamp": str(int(time.time())),
                },
            }
        }
        with open(path, "w") as fp:
            json.dump(data, fp)


def get_error_handler() -> ErrorHandler:
    return ErrorHandler()


def record(fn: Optional[Callable[..., T]] = None,
           error_handler: Optional[ErrorHandler] = None) -> Callable[..., T]:
    """Decorates a worker's entry function: an exception it raises is written
    to the error file, then raised again (the worker exits with code 1)."""
    handler = error_handler or get_error_handler()

    def wrap(f: Callable[..., T]) -> Callable[..., T]:
        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            handler.initialize()
            try:
                return f(*args, **kwargs)
            except SystemExit as se:
                if se.code == 0 or se.code is None:
                    return None
                raise
            except BaseException as e:
                handler.record_exception(e)
                raise

        return wrapper

    return wrap(fn) if fn is not None else wrap
