"""WorkerSpec, Worker, WorkerGroup, WorkerState, RunResult and ElasticAgent, as
torch.distributed.elastic.agent.server.api."""
import abc
import os
import warnings
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Callable, Dict, List, Optional, Tuple, Union

from tide.elastic.multiprocessing.api import Std
from tide.elastic.multiprocessing.errors import ProcessFailure
from tide.elastic.rendezvous.api import RendezvousHandler

DEFAULT_ROLE = "default"


@dataclass
class WorkerSpec:
    """What the agent runs: `local_world_size` copies of `entrypoint` (a
    function, run with `args` in a fresh interpreter per worker, or a program's
    path, run with the string `args`), restarted as a group on failure up to
    `max_restarts` times. `monitor_interval` paces how often the agent asks the
    rendezvous whether nodes wait to join; it sees worker exits at once."""

    role: str
    local_world_size: int
    rdzv_handler: RendezvousHandler
    fn: Optional[Callable] = None
    entrypoint: Union[Callable, str, None] = None
    args: Tuple = ()
    max_restarts: int = 3
    monitor_interval: float = 0.1
    master_port: Optional[int] = None
    master_addr: Optional[str] = None
    local_addr: Optional[str] = None
    redirects: Union[Std, Dict[int, Std]] = Std.NONE
    tee: Union[Std, Dict[int, Std]] = Std.NONE

    def __post_init__(self) -> None:
        assert self.local_world_size > 0
        assert self.monitor_interval > 0
        if self.fn:
            warnings.warn("WorkerSpec.fn will be deprecated, please use WorkerSpec.entrypoint "
                          "instead", category=DeprecationWarning)
            self.entrypoint = self.fn
        assert self.entrypoint

    def get_entrypoint_name(self) -> str:
        if isinstance(self.entrypoint, str):
            return os.path.basename(self.entrypoint)
        return self.entrypoint.__qualname__


class Worker:
    """One worker process; `id` is its pid while it runs."""

    __slots__ = ["id", "local_rank", "global_rank", "role_rank", "world_size",
                 "role_world_size"]

    def __init__(self, local_rank: int, global_rank: int = -1, role_rank: int = -1,
                 world_size: int = -1, role_world_size: int = -1) -> None:
        self.id: Any = None
        self.local_rank = local_rank
        self.global_rank = global_rank
        self.role_rank = role_rank
        self.world_size = world_size
        self.role_world_size = role_world_size

    def __str__(self) -> str:
        return (f"local_rank={self.local_rank},global_rank={self.global_rank}"
                f",role_rank={self.role_rank},world_size={self.world_size}"
                f",role_world_size={self.role_world_size}")

    __repr__ = __str__


class WorkerState(str, Enum):
    UNKNOWN = "UNKNOWN"
    INIT = "INIT"
    HEALTHY = "HEALTHY"
    UNHEALTHY = "UNHEALTHY"
    STOPPED = "STOPPED"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"

    @staticmethod
    def is_running(state: "WorkerState") -> bool:
        return state in {WorkerState.HEALTHY, WorkerState.UNHEALTHY}


class WorkerGroup:
    """The workers of the current or last attempt on this node."""

    __slots__ = ["spec", "workers", "store", "group_rank", "group_world_size", "state"]

    def __init__(self, spec: WorkerSpec) -> None:
        self.spec = spec
        self.workers: List[Worker] = [Worker(local_rank=i)
                                      for i in range(spec.local_world_size)]
        self.store = None
        self.group_rank: Optional[int] = None
        self.group_world_size: Optional[int] = None
        self.state = WorkerState.INIT


@dataclass
class RunResult:
    """How run() ended: return values by global rank when the workers
    succeeded, failures by global rank when they failed."""

    state: WorkerState
    return_values: Dict[int, Any] = field(default_factory=dict)
    failures: Dict[int, ProcessFailure] = field(default_factory=dict)

    def is_failed(self) -> bool:
        return self.state == WorkerState.FAILED


class ElasticAgent(abc.ABC):
    @abc.abstractmethod
    def run(self, role: str = DEFAULT_ROLE) -> RunResult:
        ...

    @abc.abstractmethod
    def get_worker_group(self, role: str = DEFAULT_ROLE) -> WorkerGroup:
        ...
