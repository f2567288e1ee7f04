"""A stand-in training job for the live page's picture (docs/img/job_page.png):

    scripts/job_page_picture.sh

Each rank reports its steps with tide.heartbeat(step); rank 6 takes four
times as long a step (a straggler); rank 1 fails once, at step 40, so the
group restarts.
"""
import os
import sys
import time

import tide

rank = int(os.environ["RANK"])
first_attempt = os.environ["TORCHELASTIC_RESTART_COUNT"] == "0"
pause = 0.2 if rank == 6 else 0.05
for step in range(1, 100_000):
    time.sleep(pause)
    tide.heartbeat(step)
    if step % 20 == 0:
        print(f"rank {rank}: step {step}", flush=True)
    if rank == 1 and first_attempt and step == 40:
        print("rank 1: RuntimeError: CUDA error: an illegal memory access (simulated)",
              file=sys.stderr, flush=True)
        sys.exit(1)
    if os.path.exists(os.environ["STOP_FILE"]):
        break
