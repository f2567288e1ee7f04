"""get_rendezvous_handler, as torch.distributed.elastic.rendezvous.registry,
with tide's C++ backends registered: c10d, etcd (also as etcd-v2) and static."""
from typing import Tuple

from tide import _elastic
from tide.elastic.rendezvous.api import (
    RendezvousHandler,
    RendezvousParameters,
    rendezvous_handler_registry as handler_registry,
)


class NativeRendezvousHandler(RendezvousHandler):
    """One of tide's backends, in C++: the agent calls it without Python."""

    def __init__(self, native: "_elastic.NativeHandler", backend: str) -> None:
        self._native = native
        self._backend = backend

    def get_backend(self) -> str:
        return self._backend

    def next_rendezvous(self) -> Tuple["_elastic.Store", int, int]:
        return self._native.next_rendezvous()

    def is_closed(self) -> bool:
        return self._native.is_closed()

    def set_closed(self) -> None:
        self._native.set_closed()

    def num_nodes_waiting(self) -> int:
        return self._native.num_nodes_waiting()

    def get_run_id(self) -> str:
        return self._native.get_run_id()

    def shutdown(self) -> bool:
        return self._native.shutdown()


def _native_creator(backend: str, native_backend: str):
    def create(params: RendezvousParameters) -> RendezvousHandler:
        config = {k: str(v) for k, v in params.config.items()}
        native = _elastic.create_handler(
            native_backend, params.endpoint, params.run_id, params.min_nodes,
            params.max_nodes, params.local_addr or "", config)
        return NativeRendezvousHandler(native, backend)

    return create


def _register_default_handlers() -> None:
    for backend, native in (("c10d", "c10d"), ("etcd", "etcd"), ("etcd-v2", "etcd"),
                            ("static", "static")):
        handler_registry.register(backend, _native_creator(backend, native))


def get_rendezvous_handler(params: RendezvousParameters) -> RendezvousHandler:
    """The handler of params.backend (ValueError when none is registered)."""
    return handler_registry.create_handler(params)


_register_default_handlers()
