#!/usr/bin/python3
"""Expiration timers with a stuck worker: torch.distributed.elastic's
"Expiration Timers" listing, runnable. The launcher makes the queue, starts
the LocalTimerServer and passes the queue to the workers; a worker whose
`expires()` block overruns is killed by the server and the agent restarts the
group. Only the imports differ from torch's.

    PYTHONPATH=build/python /usr/bin/python3 examples/python/elastic/expiration_timers.py

Rank 1 hangs inside its 1 s block in the first attempt: it is killed, the
group restarts, and the second attempt finishes.
"""
import multiprocessing as mp
import os
import socket
import sys
import time

from tide.elastic import timer
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


def trainer_func(mp_queue, stuck_rank):
    timer.configure(timer.LocalTimerClient(mp_queue))
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    with timer.expires(after=1):
        if attempt == 0 and int(os.environ["RANK"]) == stuck_rank:
            time.sleep(600)  # stuck: the timer server reclaims this worker
    return attempt


if __name__ == "__main__":
    mp_queue = mp.get_context("spawn").Queue()
    server = timer.LocalTimerServer(mp_queue, max_interval=0.01)
    server.start()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    handler = get_rendezvous_handler(RendezvousParameters(
        backend="c10d", endpoint=f"127.0.0.1:{port}", run_id="timers-example",
        min_nodes=1, max_nodes=1))
    spec = WorkerSpec(role="trainer", local_world_size=2, entrypoint=trainer_func,
                      args=(mp_queue, 1), rdzv_handler=handler, max_restarts=1,
                      monitor_interval=0.1)
    start = time.time()
    result = make_agent(spec).run()
    server.stop()
    if result.is_failed():
        print(f"failed: {result.failures}")
        sys.exit(1)
    print(f"attempts seen by the workers: {sorted(set(result.return_values.values()))}")
