"""Runs torch's own FileTimerServer on a FIFO, for a tide client to use.

    torch_timer_server.py PATH

Prints "ready" once the server watches the FIFO, then serves for 60 s.
"""
import inspect
import sys
import time

from torch.distributed.elastic.timer import FileTimerServer


def main():
    # torch 2.x added run_id (a name for its logs) as the second parameter.
    if "run_id" in inspect.signature(FileTimerServer).parameters:
        server = FileTimerServer(sys.argv[1], "tide-interop", max_interval=0.05)
    else:
        server = FileTimerServer(sys.argv[1], max_interval=0.05)
    server.start()
    print("ready", flush=True)
    time.sleep(60)
    server.stop()


if __name__ == "__main__":
    main()
