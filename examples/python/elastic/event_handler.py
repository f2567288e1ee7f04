#!/usr/bin/python3
"""An event handler: torch.distributed.elastic's "Customization" listing,
runnable. The agent's events (and the rendezvous', to a handler that defines
record_rdzv_event) reach the handler as they happen. torch's own agent routes
events to logging only; events.configure is the listing's API.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/elastic/event_handler.py
"""
import os
import socket
import sys

from tide.elastic import events
from tide.elastic.agent.server.api import WorkerSpec
from tide.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from tide.elastic.rendezvous import RendezvousParameters
from tide.elastic.rendezvous.registry import get_rendezvous_handler

try:  # torch >= 2.3's LocalElasticAgent takes a LogsSpecs (tide's takes either form)
    from tide.elastic.multiprocessing import DefaultLogsSpecs
except ImportError:
    DefaultLogsSpecs = None


def make_agent(spec):
    if DefaultLogsSpecs is None:  # torch < 2.3
        return LocalElasticAgent(spec, start_method="spawn")
    return LocalElasticAgent(spec, DefaultLogsSpecs(), start_method="spawn")


class MyEventHandler(events.EventHandler):
    def record(self, event: events.Event):
        print(f"event {event.source.value} {event.name} "
              f"state={event.metadata.get('state')}", flush=True)


def trainer():
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0" and os.environ["RANK"] == "0":
        raise SystemExit(3)


if __name__ == "__main__":
    events.configure(MyEventHandler())
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    handler = get_rendezvous_handler(RendezvousParameters(
        backend="c10d", endpoint=f"127.0.0.1:{port}", run_id="events-example",
        min_nodes=1, max_nodes=1))
    spec = WorkerSpec(role="trainer", local_world_size=2, entrypoint=trainer,
                      rdzv_handler=handler, max_restarts=1, monitor_interval=0.1)
    events.record(events.Event("launcher.start", events.EventSource.AGENT))
    result = make_agent(spec).run()
    print("failed" if result.is_failed() else "succeeded")
    sys.exit(1 if result.is_failed() else 0)
