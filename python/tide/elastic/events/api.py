"""Event, EventSource, EventHandler, configure and record, as
torch.distributed.elastic.events. The handler is held by tide's C++ events:
the agent's and the rendezvous' events reach a Python handler with the GIL
taken for each; an exception a handler raises is logged and the caller goes on."""
import abc
import atexit
import json
from dataclasses import asdict, dataclass, field
from enum import Enum
from typing import Dict, Optional, Union

from tide import _elastic

EventMetadataValue = Union[str, int, float, bool, None]


class EventSource(str, Enum):
    AGENT = "AGENT"
    WORKER = "WORKER"


@dataclass
class Event:
    name: str
    source: EventSource
    timestamp: int = 0  # ms since the epoch; record() fills a 0
    metadata: Dict[str, EventMetadataValue] = field(default_factory=dict)

    def __str__(self) -> str:
        return self.serialize()

    @staticmethod
    def deserialize(data: Union[str, "Event"]) -> "Event":
        if isinstance(data, Event):
            return data
        d = json.loads(data)
        d["source"] = EventSource[d["source"]]
        return Event(**d)

    def serialize(self) -> str:
        return json.dumps(asdict(self))


class NodeState(str, Enum):
    INIT = "INIT"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"


@dataclass
class RdzvEvent:
    name: str
    run_id: str
    message: str
    hostname: str
    pid: int
    node_state: NodeState
    master_endpoint: str = ""
    rank: Optional[int] = None
    local_id: Optional[str] = None
    error_trace: str = ""

    def __str__(self) -> str:
        return self.serialize()

    def serialize(self) -> str:
        return json.dumps(asdict(self))


class EventHandler(abc.ABC):
    """Receives every event. record_rdzv_event, when a handler defines it,
    receives the rendezvous' events too."""

    @abc.abstractmethod
    def record(self, event: Event) -> None:
        ...


_handler: Optional[EventHandler] = None


def configure(handler: Optional[EventHandler]) -> None:
    """Sends every event (the agent's, the rendezvous', record()'s) to handler;
    None: drops them (the default)."""
    global _handler
    _handler = handler
    if handler is None:
        _elastic.configure_events(None, None)
        return

    def on_event(name, source, timestamp, metadata):
        handler.record(Event(name, EventSource(source), timestamp, metadata))

    on_rdzv = None
    if callable(getattr(handler, "record_rdzv_event", None)):
        def on_rdzv(d):
            d["node_state"] = NodeState(d["node_state"])
            handler.record_rdzv_event(RdzvEvent(**d))

    _elastic.configure_events(on_event, on_rdzv)


def record(event: Event, destination: str = "null") -> None:
    """Records an event with the configured handler (`destination`, torch's
    logger name, is not used: there is one handler)."""
    _elastic.record_event(event.name, EventSource(event.source).value, event.timestamp,
                          dict(event.metadata))


def record_rdzv_event(event: RdzvEvent) -> None:
    if _handler is not None and callable(getattr(_handler, "record_rdzv_event", None)):
        _handler.record_rdzv_event(event)


@atexit.register
def _drop_python_handler() -> None:
    if _handler is not None:
        _elastic.configure_events(None, None)
