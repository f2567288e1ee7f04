#!/usr/bin/python3
"""A custom launcher with a custom rendezvous handler: torch.distributed.elastic's
"Customization" listings, runnable. Only the imports differ from torch's (swap
`tide.elastic` for `torch.distributed.elastic` and `tide.elastic.store` for
`torch.distributed` and it runs on torch's agent, 1.13's or 2.x's: the agent
is made in torch >= 2.3's form where LogsSpecs exists, in 1.13's otherwise).

    PYTHONPATH=build/python /usr/bin/python3 examples/python/elastic/custom_launcher.py \
        --nproc-per-node 2 --max-restarts 1 --fail-once

Each worker returns a greeting; with --fail-once, rank 1 raises in the first
attempt, the agent restarts the group, and the second attempt succeeds (with
--max-restarts 0 the run fails, and the failure is printed).
"""
import argparse
import os
import sys

from tide.elastic.agent.server.api import WorkerSpec
from tide.elastic.agent.server.local_elastic_agent import LocalElasticAgent
from tide.elastic.multiprocessing.errors import record
from tide.elastic.rendezvous import RendezvousHandler, RendezvousParameters
from tide.elastic.rendezvous import RendezvousClosedError
from tide.elastic.rendezvous.registry import get_rendezvous_handler, handler_registry
from tide.elastic.store import PrefixStore, TCPStore

try:  # torch >= 2.3's LocalElasticAgent takes a LogsSpecs (tide's takes either form)
    from tide.elastic.multiprocessing import DefaultLogsSpecs
except ImportError:
    DefaultLogsSpecs = None


class SingleNodeRendezvousHandler(RendezvousHandler):
    """A rendezvous of one node: this node is rank 0 of 1 every round and
    hosts the store; each round gets its own key prefix."""

    def __init__(self, params: RendezvousParameters):
        self._run_id = params.run_id
        self._store = TCPStore("127.0.0.1", 0, 1, True)
        self._round = 0
        self._closed = False

    def get_backend(self) -> str:
        return "single-node"

    def next_rendezvous(self):
        if self._closed:
            raise RendezvousClosedError()
        self._round += 1
        return PrefixStore(f"{self._run_id}/{self._round}", self._store), 0, 1

    def is_closed(self) -> bool:
        return self._closed

    def set_closed(self) -> None:
        self._closed = True

    def num_nodes_waiting(self) -> int:
        return 0

    def get_run_id(self) -> str:
        return self._run_id

    def shutdown(self) -> bool:
        return True


handler_registry.register("single-node", SingleNodeRendezvousHandler)


@record
def trainer_entrypoint_fn(greeting, fail_once):
    rank = int(os.environ["RANK"])
    if fail_once and rank == 1 and os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        raise RuntimeError(f"rank {rank} fails in the first attempt")
    return f"{greeting} from rank {rank} of {os.environ['WORLD_SIZE']}"


def parse_args(argv):
    p = argparse.ArgumentParser()
    p.add_argument("--nproc-per-node", type=int, default=2)
    p.add_argument("--max-restarts", type=int, default=1)
    p.add_argument("--monitor-interval", type=float, default=0.1)
    p.add_argument("--fail-once", action="store_true")
    return p.parse_args(argv)


if __name__ == "__main__":
    args = parse_args(sys.argv[1:])
    rdzv_handler = get_rendezvous_handler(RendezvousParameters(
        backend="single-node", endpoint="", run_id="example", min_nodes=1, max_nodes=1))
    spec = WorkerSpec(
        role="trainer",
        local_world_size=args.nproc_per_node,
        fn=trainer_entrypoint_fn,
        args=("hello", args.fail_once),
        rdzv_handler=rdzv_handler,
        max_restarts=args.max_restarts,
        monitor_interval=args.monitor_interval,
    )
    if DefaultLogsSpecs is None:  # torch < 2.3
        agent = LocalElasticAgent(spec, start_method="spawn")
    else:  # torch >= 2.3: where the logs go comes second
        agent = LocalElasticAgent(spec, DefaultLogsSpecs(), start_method="spawn")
    run_result = agent.run()
    if run_result.is_failed():
        for rank, failure in sorted(run_result.failures.items()):
            print(f"worker {rank} failed with exit code {failure.exitcode}: "
                  f"{failure.message['message']}")
        sys.exit(1)
    for rank, value in sorted(run_result.return_values.items()):
        print(f"worker {rank} return value is: {value}")
