"""Rendezvous, as torch.distributed.elastic.rendezvous: the handler interface a
Python backend implements, its parameters, and the registry (tide's c10d, etcd
and static backends, in C++, are registered by default)."""
from tide.elastic.rendezvous.api import (  # noqa: F401
    RendezvousClosedError,
    RendezvousConnectionError,
    RendezvousError,
    RendezvousHandler,
    RendezvousHandlerRegistry,
    RendezvousParameters,
    RendezvousStateError,
    RendezvousTimeoutError,
    rendezvous_handler_registry,
)
from tide.elastic.rendezvous import registry  # noqa: F401  (registers the backends)
