#!/usr/bin/python3
"""torch's TCPStore server as a benchmark peer (bench/store/store_bench.cpp).

Starts torch.distributed.TCPStore(host, port, is_master=True,
wait_for_workers=False), prints the bound port on one line, and serves until
stdin closes (the parent went away) or SIGTERM/SIGINT arrives; then exits 0.

Run it with /usr/bin/python3 (Debian's python3-torch): the python3 first on
PATH may be another interpreter without torch. With Debian 13's torch 2.6,
built without libuv, set USE_LIBUV=0.

torch 1.13 accepts port 0 (the kernel picks a free port) and reports the real
one in store.port, so there is no port race. The server is torch's C++
TCPStoreMasterDaemon thread, which never takes the GIL; the Python threads
only wait.
"""

import argparse
import datetime
import os
import signal
import sys
import threading
import time


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0, help="0 picks a free port")
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="store timeout, seconds")
    args = parser.parse_args()

    # Exit straight from the handlers: nothing to flush, and skipping the
    # store's teardown avoids joining torch's daemon thread. (Not
    # threading.Event.set(): called from a signal handler while the main
    # thread is inside Event.wait() it deadlocks on the Event's lock.)
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: os._exit(0))

    import torch.distributed as dist  # Slow (seconds): after the handlers.

    # torch >= 2.4 serves with libuv by default; one built without it
    # (Debian 13's 2.6) serves as USE_LIBUV=0 says, as its env:// path does.
    from libuv_fix import follow_use_libuv

    follow_use_libuv()
    store = dist.TCPStore(
        args.host,
        args.port,
        is_master=True,
        wait_for_workers=False,
        timeout=datetime.timedelta(seconds=args.timeout),
    )
    port = store.port
    if not port:
        print("torch_store_server: torch did not report its port", file=sys.stderr)
        return 1
    print(port, flush=True)

    def watch_stdin() -> None:
        try:
            while os.read(sys.stdin.fileno(), 4096):
                pass
        except OSError:
            pass
        os._exit(0)

    threading.Thread(target=watch_stdin, daemon=True).start()
    while True:
        time.sleep(3600)  # Signal handlers run on this thread.


if __name__ == "__main__":
    sys.exit(main())
