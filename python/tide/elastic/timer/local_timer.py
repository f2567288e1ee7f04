"""LocalTimerServer and LocalTimerClient, as
torch.distributed.elastic.timer.local_timer, on tide's C++ local timers: a Unix
datagram socket whose kernel-given sender pid names the worker, so a worker
arms timers for itself only.

torch's pair talks over a multiprocessing queue the launcher makes and passes
to its workers in WorkerSpec.args. tide's workers are not started by
multiprocessing, so such a queue cannot reach them as a queue: a queue given
to a LocalTimerServer reaches them as a TimerQueue naming the server's socket,
and LocalTimerClient(queue) talks to that socket. TimerQueue() may be passed
instead of a multiprocessing queue.
"""
import os
import signal
import tempfile
import uuid
from typing import Any, Dict

from tide import _elastic
from tide.elastic.timer.api import TimerClient


class TimerQueue:
    """Where a LocalTimerServer listens; picklable, so it crosses into
    workers (a multiprocessing queue given to a server becomes one)."""

    def __init__(self, path: str = "") -> None:
        self.path = path or os.path.join(
            tempfile.gettempdir(), f"tide-timer-{os.getpid()}-{uuid.uuid4().hex[:8]}.sock")

    def __repr__(self) -> str:
        return f"TimerQueue({self.path!r})"


# Multiprocessing queues given to a server, by id (each kept alive so its id
# is not reused): the TimerQueue each one stands for in the workers.
_queues: Dict[int, Any] = {}


def as_timer_queue(queue: Any) -> TimerQueue:
    if isinstance(queue, TimerQueue):
        return queue
    entry = _queues.get(id(queue))
    if entry is None:
        raise TypeError(
            f"{queue!r} is not known to a LocalTimerServer: give the queue to "
            "LocalTimerServer(queue) first, or use tide.elastic.timer.TimerQueue()")
    return entry[1]


def timer_queue_of(obj: Any):
    """The TimerQueue a multiprocessing queue stands for, or None."""
    entry = _queues.get(id(obj))
    return entry[1] if entry is not None and entry[0] is obj else None


class LocalTimerServer:
    """Holds the workers' timers and kills (SIGKILL) a worker whose timer
    expired; only this process's children (its workers) and the processes of
    their sessions."""

    def __init__(self, mp_queue: Any, max_interval: float = 60, daemon: bool = True) -> None:
        if isinstance(mp_queue, TimerQueue):
            self._queue = mp_queue
        else:
            self._queue = TimerQueue()
            _queues[id(mp_queue)] = (mp_queue, self._queue)
        self._server = _elastic.LocalTimerServer(self._queue.path, float(max_interval))

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop()


class LocalTimerClient(TimerClient):
    def __init__(self, mp_queue: Any) -> None:
        self._client = _elastic.local_timer_client(as_timer_queue(mp_queue).path,
                                                   int(signal.SIGKILL))

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        self._client.acquire(scope_id, expiration_time)

    def release(self, scope_id: str) -> None:
        self._client.release(scope_id)
