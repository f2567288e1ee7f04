"""TimerClient, configure and expires, as torch.distributed.elastic.timer.api."""
import abc
import inspect
import time
from contextlib import contextmanager
from typing import Optional


class TimerClient(abc.ABC):
    """A worker's side of a timer server."""

    @abc.abstractmethod
    def acquire(self, scope_id: str, expiration_time: float) -> None:
        ...

    @abc.abstractmethod
    def release(self, scope_id: str) -> None:
        ...


_timer_client: Optional[TimerClient] = None


def configure(timer_client: TimerClient) -> None:
    """Sets the client expires() uses by default (process-wide)."""
    global _timer_client
    _timer_client = timer_client


@contextmanager
def expires(after: float, scope: Optional[str] = None,
            client: Optional[TimerClient] = None):
    """Arms a timer expiring `after` seconds from now for the block; the scope
    defaults to the caller's "<file>#<line>"."""
    if client is None:
        if _timer_client is None:
            raise RuntimeError("Configure timer client before using countdown timers.")
        client = _timer_client
    if scope is None:
        caller = inspect.getframeinfo(inspect.currentframe().f_back.f_back)
        scope = f"{caller.filename}#{caller.lineno}"
    client.acquire(scope, time.time() + after)
    try:
        yield
    finally:
        client.release(scope)
