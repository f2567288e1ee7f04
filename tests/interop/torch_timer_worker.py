"""A worker that guards its steps with torch's own expiration timers
(FileTimerClient on the agent's TORCHELASTIC_TIMER_FILE). On the first
attempt, local rank 0 hangs inside a timed step; tide's timer server must kill
it so the group restarts. Writes <out>/done.<attempt>.<rank> when it finishes.

    timer_worker.py OUT_DIR
"""
import os
import sys
import time

from torch.distributed.elastic import timer


def main():
    out = sys.argv[1]
    timer.configure(timer.FileTimerClient(os.environ["TORCHELASTIC_TIMER_FILE"]))
    attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
    rank = os.environ["LOCAL_RANK"]
    for step in range(3):
        # A step takes 10 ms; 3 s leaves it room on a loaded machine, where
        # an expiry would kill a healthy step.
        with timer.expires(after=3, scope="train_step"):
            if attempt == "0" and rank == "0" and step == 1:
                time.sleep(120)  # a hang the timer must end
            time.sleep(0.01)
    open(os.path.join(out, f"done.{attempt}.{rank}"), "w").close()


if __name__ == "__main__":
    main()
