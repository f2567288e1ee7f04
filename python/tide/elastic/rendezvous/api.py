"""RendezvousHandler, RendezvousParameters and the handler registry, as
torch.distributed.elastic.rendezvous.api."""
from abc import ABC, abstractmethod
from typing import Any, Callable, Dict, Optional, Tuple


class RendezvousError(Exception):
    """The rendezvous failed."""


class RendezvousClosedError(RendezvousError):
    """The rendezvous is closed: the job is over."""


class RendezvousTimeoutError(RendezvousError):
    """The round did not complete in time."""


class RendezvousConnectionError(RendezvousError):
    """The rendezvous backend cannot be reached."""


class RendezvousStateError(RendezvousError):
    """The rendezvous state is corrupt."""


class RendezvousHandler(ABC):
    """One agent's handle on the rendezvous. A subclass written in Python
    drives tide's C++ agent: it calls these methods (taking the GIL for each);
    an exception from next_rendezvous fails the round, as in torch.

    next_rendezvous() returns (store, rank, world_size); the store may be
    tide.elastic's (tide.elastic.store) or torch.distributed's."""

    @abstractmethod
    def get_backend(self) -> str:
        ...

    @abstractmethod
    def next_rendezvous(self) -> Tuple[Any, int, int]:
        ...

    @abstractmethod
    def is_closed(self) -> bool:
        ...

    @abstractmethod
    def set_closed(self) -> None:
        ...

    @abstractmethod
    def num_nodes_waiting(self) -> int:
        ...

    @abstractmethod
    def get_run_id(self) -> str:
        ...

    @abstractmethod
    def shutdown(self) -> bool:
        ...


class RendezvousParameters:
    """What a backend is made from: --rdzv-backend, --rdzv-endpoint,
    --rdzv-id, --nnodes and the --rdzv-conf pairs (kwargs)."""

    def __init__(self, backend: str, endpoint: str, run_id: str, min_nodes: int,
                 max_nodes: int, local_addr: Optional[str] = None, **kwargs) -> None:
        if not backend:
            raise ValueError("The rendezvous backend name must be a non-empty string.")
        if min_nodes < 1:
            raise ValueError(f"The minimum number of rendezvous nodes ({min_nodes}) "
                             "must be greater than zero.")
        if max_nodes < min_nodes:
            raise ValueError(f"The maximum number of rendezvous nodes ({max_nodes}) must be "
                             f"greater than or equal to the minimum number of rendezvous "
                             f"nodes ({min_nodes}).")
        self.backend = backend
        self.endpoint = endpoint
        self.run_id = run_id
        self.min_nodes = min_nodes
        self.max_nodes = max_nodes
        self.config = kwargs
        self.local_addr = local_addr

    def get(self, key: str, default: Any = None) -> Any:
        return self.config.get(key, default)

    def get_as_bool(self, key: str, default: Optional[bool] = None) -> Optional[bool]:
        value = self.get(key, default)
        if value is None or isinstance(value, bool):
            return value
        if isinstance(value, int):
            if value in (0, 1):
                return bool(value)
        elif isinstance(value, str):
            if value.lower() in ("1", "true", "t", "yes", "y"):
                return True
            if value.lower() in ("0", "false", "f", "no", "n"):
                return False
        raise ValueError(f"The rendezvous configuration option '{key}' does not represent "
                         "a valid boolean value.")

    def get_as_int(self, key: str, default: Optional[int] = None) -> Optional[int]:
        value = self.get(key, default)
        if value is None:
            return value
        try:
            return int(value)
        except ValueError as e:
            raise ValueError(f"The rendezvous configuration option '{key}' does not "
                             "represent a valid integer value.") from e


RendezvousHandlerCreator = Callable[[RendezvousParameters], RendezvousHandler]


class RendezvousHandlerRegistry:
    """Backends by name; create_handler(params) makes params.backend's handler."""

    def __init__(self) -> None:
        self._registry: Dict[str, RendezvousHandlerCreator] = {}

    def register(self, backend: str, creator: RendezvousHandlerCreator) -> None:
        if not backend:
            raise ValueError("The rendezvous backend name must be a non-empty string.")
        current = self._registry.get(backend)
        if current is not None and current is not creator:
            raise ValueError(f"The rendezvous backend '{backend}' cannot be registered with "
                             f"'{creator}' as it is already registered with '{current}'.")
        self._registry[backend] = creator

    def create_handler(self, params: RendezvousParameters) -> RendezvousHandler:
        try:
            creator = self._registry[params.backend]
        except KeyError:
            raise ValueError(f"The rendezvous backend '{params.backend}' is not registered. "
                             f"Did you forget to call `register`? (registered: "
                             f"{', '.join(sorted(self._registry))})") from None
        handler = creator(params)
        if handler.get_backend() != params.backend:
            raise RuntimeError(f"The rendezvous backend '{handler.get_backend()}' does not "
                               f"match the requested backend '{params.backend}'.")
        return handler


rendezvous_handler_registry = RendezvousHandlerRegistry()
