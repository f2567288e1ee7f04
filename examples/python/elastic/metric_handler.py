#!/usr/bin/python3
"""A metric handler: torch.distributed.elastic's "Customization" listing,
runnable. The agent's own metrics (torch's names) reach the handler; so do the
launcher's, put with metrics.put_metric and metrics.prof. Only the imports
differ from torch's.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/elastic/metric_handler.py
"""
import socket
import sys

from tide.elastic import metrics
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


class MyMetricHandler(metrics.MetricHandler):
    def __init__(self):
        self.names = set()

    def emit(self, metric_data: metrics.MetricData):
        self.names.add(f"{metric_data.group_name}:{metric_data.name}")


def trainer():
    return 0


@metrics.prof(group="launcher")
def launch(handler):
    spec = WorkerSpec(role="trainer", local_world_size=2, entrypoint=trainer,
                      rdzv_handler=handler, max_restarts=0, monitor_interval=0.1)
    return make_agent(spec).run()


if __name__ == "__main__":
    sink = MyMetricHandler()
    metrics.configure(sink)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    handler = get_rendezvous_handler(RendezvousParameters(
        backend="c10d", endpoint=f"127.0.0.1:{port}", run_id="metrics-example",
        min_nodes=1, max_nodes=1))
    result = launch(handler)
    metrics.put_metric("jobs_launched", 1, "launcher")
    for name in sorted(sink.names):
        print(name)
    sys.exit(1 if result.is_failed() else 0)
