"""FileTimerServer and FileTimerClient, as
torch.distributed.elastic.timer.file_based_local_timer: requests are JSON lines
on a named pipe, in torch's format, so torch's FileTimerClient works with
tide's server and tide's client with torch's server."""
import signal

from tide import _elastic
from tide.elastic.timer.api import TimerClient


class FileTimerServer:
    """Creates the FIFO at file_path and kills a worker whose timer expired;
    only this process's children (its workers) and the processes of
    their sessions."""

    def __init__(self, file_path: str, max_interval: float = 10, daemon: bool = True,
                 log_event=None, run_id: str = "") -> None:
        self._server = _elastic.FileTimerServer(file_path, float(max_interval), run_id)

    def start(self) -> None:
        self._server.start()

    def stop(self) -> None:
        self._server.stop()


class FileTimerClient(TimerClient):
    def __init__(self, file_path: str, signal=signal.SIGKILL) -> None:
        self._client = _elastic.file_timer_client(file_path, int(signal))

    def acquire(self, scope_id: str, expiration_time: float) -> None:
        self._client.acquire(scope_id, expiration_time)

    def release(self, scope_id: str) -> None:
        self._client.release(scope_id)
