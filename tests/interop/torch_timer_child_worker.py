"""A worker whose own multiprocessing child arms torch's expiration timer
(FileTimerClient on the agent's TORCHELASTIC_TIMER_FILE) and hangs; tide's
timer server must kill that child, not its parent, which then writes the
child's exit code to <out>/child_exitcode and exits 0.

Before that, the worker asks for a timer, already expired, on a process that
is not one of the agent's (FOREIGN_PID): the server must refuse it.

    torch_timer_child_worker.py OUT_DIR FOREIGN_PID
"""
import json
import multiprocessing
import os
import sys
import time

from torch.distributed.elastic import timer


def hang_under_timer(path):
    timer.configure(timer.FileTimerClient(path))
    with timer.expires(after=0.3, scope="child_step"):
        time.sleep(120)  # a hang the timer must end


def main():
    out, foreign = sys.argv[1], int(sys.argv[2])
    path = os.environ["TORCHELASTIC_TIMER_FILE"]
    # torch's request line, naming a pid outside this job.
    with open(path, "w") as fifo:
        fifo.write(json.dumps({
            "version": 1,
            "pid": foreign,
            "scope_id": "foreign",
            "expiration_time": time.time() - 1,
            "signal": 9,
        }) + "\n")
    child = multiprocessing.get_context("fork").Process(
        target=hang_under_timer, args=(path,))
    child.start()
    child.join(60)
    with open(os.path.join(out, "child_exitcode"), "w") as f:
        f.write(str(child.exitcode))


if __name__ == "__main__":
    main()
