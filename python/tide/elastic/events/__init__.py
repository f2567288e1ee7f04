"""Events, as torch.distributed.elastic.events: what the agent did (started
workers, a failure, a restart) and what the rendezvous did, as records a
handler receives.

    class MyEventHandler(events.EventHandler):
        def record(self, event: events.Event):
            ...
    events.configure(MyEventHandler())
"""
from tide.elastic.events.api import (  # noqa: F401
    Event,
    EventHandler,
    EventMetadataValue,
    EventSource,
    NodeState,
    RdzvEvent,
    configure,
    record,
    record_rdzv_event,
)
