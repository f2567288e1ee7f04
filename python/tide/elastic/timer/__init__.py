"""Expiration timers, as torch.distributed.elastic.timer: a worker says "if
this block is not done in 60 s, reclaim me", and the launcher's timer server
kills it when the deadline passes, so the agent restarts the group.

    # the launcher
    mp_queue = mp.get_context("spawn").Queue()
    server = timer.LocalTimerServer(mp_queue, max_interval=0.01)
    server.start()
    spec = WorkerSpec(..., fn=trainer, args=(mp_queue,))

    # the worker
    timer.configure(timer.LocalTimerClient(mp_queue))
    with timer.expires(after=60):
        train_step()

The servers are tide's (C++): they signal only the launcher's children (its
workers) and the processes of their sessions. A multiprocessing queue given to
a LocalTimerServer reaches tide's workers as the server's address
(docs/python.md#timers).
"""
from tide.elastic.timer.api import TimerClient, configure, expires  # noqa: F401
from tide.elastic.timer.file_based_local_timer import (  # noqa: F401
    FileTimerClient,
    FileTimerServer,
)
from tide.elastic.timer.local_timer import (  # noqa: F401
    LocalTimerClient,
    LocalTimerServer,
    TimerQueue,
)
