#!/usr/bin/python3
"""A torch.distributed.TCPStore peer for tide's interop tests.

torch_interop_test.cpp runs it with Debian's PyTorch 1.13 as
``/usr/bin/python3 -u torch_store_peer.py MODE ...``:

  version                      print HELLO and exit 0
  server                       a torch TCPStore server (is_master=True)
  client SCENARIO --port P     torch clients running SCENARIO against host:port

Every mode first prints ``HELLO torch <version>`` once torch is imported, or
``NOTORCH <why>`` and exits 3 when it cannot be.

server: starts the store on a port the kernel picks, prints ``PORT <n>``, then
answers one line per stdin line until stdin closes (values in hex):
  set KEY HEX -> OK        get KEY -> VALUE HEX       add KEY N -> INT N
  num_keys -> INT N        delete KEY -> INT 0|1      any failure -> ERROR ...

client: prints ``FAIL <what>`` for every failed check, then ``PASS`` or
``FAILED <n>``; exits 0 only when every check passed.

Stdin closing means the test is gone: every mode then exits at once, so no
peer outlives its test.
"""

import argparse
import datetime
import os
import queue
import sys
import threading
import time

try:
    import torch
    import torch.distributed as dist
except Exception as e:  # noqa: BLE001 - any import failure is reported
    print(
        f"NOTORCH {sys.executable} cannot import torch ({e!r}); "
        "install python3-torch (scripts/setup.sh does)",
        flush=True,
    )
    sys.exit(3)

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from torch_facts import store_kwargs  # noqa: E402

# Values both sides know; torch_interop_test.cpp has the same ones.
TIDE_STR = b"hello from tide"
TIDE_BIN = bytes(range(256))
TORCH_STR = b"hello from torch"
TORCH_BIN = bytes(reversed(range(256)))
BIG_LEN = 1 << 20


def big_value(seed):
    return bytes((i * 7 + seed) % 251 for i in range(BIG_LEN))


def seconds(s):
    return datetime.timedelta(seconds=s)


class Checks:
    """Collects failed checks instead of stopping at the first one."""

    def __init__(self):
        self.failed = 0

    def fail(self, what):
        self.failed += 1
        print(f"FAIL {what}", flush=True)

    def expect(self, cond, what):
        if not cond:
            self.fail(what)

    def equal(self, got, want, what):
        if got != want:
            self.fail(f"{what}: got {shorten(got)}, want {shorten(want)}")

    def raises_within(self, fn, lo_s, hi_s, what):
        """fn must raise RuntimeError after lo_s..hi_s seconds."""
        start = time.monotonic()
        try:
            fn()
        except RuntimeError as e:
            took = time.monotonic() - start
            self.expect(
                lo_s <= took <= hi_s,
                f"{what}: raised after {took:.3f}s, want {lo_s}..{hi_s}s",
            )
            print(f"INFO {what}: RuntimeError({e}) after {took:.3f}s", flush=True)
            return e
        except Exception as e:  # noqa: BLE001 - the type is what we check
            self.fail(f"{what}: raised {e!r}, want RuntimeError")
            return e
        self.fail(f"{what}: returned instead of raising")
        return None


def shorten(v):
    r = repr(v)
    return r if len(r) <= 80 else f"{r[:60]}... ({len(v)} bytes)"


class Stdin:
    """Reads stdin on a thread; exits the process when it closes."""

    def __init__(self, exit_on_eof):
        self.lines = queue.Queue()
        self.exit_on_eof = exit_on_eof
        threading.Thread(target=self._run, daemon=True).start()

    def _run(self):
        for line in sys.stdin:
            self.lines.put(line.rstrip("\n"))
        if self.exit_on_eof:
            os._exit(4)
        self.lines.put(None)

    def next(self, timeout_s):
        return self.lines.get(timeout=timeout_s)


def connect(args, **kwargs):
    return dist.TCPStore(
        args.host,
        args.port,
        is_master=False,
        timeout=seconds(args.timeout_s),
        **kwargs,
        **store_kwargs(),
    )


def scenario_exchange(args, checks, _stdin):
    """Reads what the tide client set; writes what the tide client checks."""
    s = connect(args)
    checks.equal(s.get("tide/str"), TIDE_STR, "get of a string set by tide")
    checks.equal(s.get("tide/bin"), TIDE_BIN, "get of binary bytes set by tide")
    checks.equal(s.get("tide/empty"), b"", "get of an empty value set by tide")
    checks.equal(s.get("tide/big"), big_value(1), "get of 1 MiB set by tide")
    checks.equal(s.get("tide/counter"), b"7", "get of a counter tide added 7 to")
    checks.equal(s.add("tide/counter", 3), 10, "add 3 to tide's counter")
    s.set("torch/str", TORCH_STR)
    s.set("torch/bin", TORCH_BIN)
    s.set("torch/empty", b"")
    s.set("torch/big", big_value(2))
    checks.equal(s.add("torch/counter", 40), 40, "add to a missing key starts at 0")
    checks.equal(s.add("torch/counter", 2), 42, "add 2")
    checks.equal(s.add("torch/counter", 0), 42, "add 0 reads the counter")


def scenario_semantics(args, checks, _stdin):
    """compare_set, num_keys, delete_key, add and wait as torch 1.13 has them."""
    s = connect(args)
    checks.equal(
        s.compare_set("sem/cas", "", "first"),
        b"first",
        "compare_set of a missing key with empty expected sets desired",
    )
    checks.equal(
        s.compare_set("sem/cas", "wrong", "second"),
        b"first",
        "compare_set with a wrong expected returns the current value",
    )
    checks.equal(
        s.compare_set("sem/cas", "first", "third"),
        b"third",
        "compare_set with the right expected sets desired",
    )
    checks.equal(s.get("sem/cas"), b"third", "get after compare_set")

    n0 = s.num_keys()
    checks.equal(
        s.compare_set("sem/absent", "x", "y"),
        b"x",
        "compare_set of a missing key with non-empty expected returns expected",
    )
    checks.equal(s.num_keys(), n0, "that compare_set created no key")
    s.set("sem/a", "1")
    checks.equal(s.num_keys(), n0 + 1, "num_keys after a set")
    s.set("sem/a", "2")
    checks.equal(s.num_keys(), n0 + 1, "num_keys after overwriting")
    checks.equal(s.get("sem/a"), b"2", "get after overwriting")
    checks.equal(s.delete_key("sem/a"), True, "delete_key of a present key")
    checks.equal(s.num_keys(), n0, "num_keys after delete_key")
    checks.equal(s.delete_key("sem/a"), False, "delete_key of a missing key")

    checks.equal(s.add("sem/n", -5), -5, "add of a negative delta to a missing key")
    checks.equal(s.get("sem/n"), b"-5", "an added value reads as decimal")

    s.set("sem/w1", "x")
    s.set("sem/w2", "y")
    start = time.monotonic()
    s.wait(["sem/w1", "sem/w2"])
    s.wait(["sem/w1", "sem/w2"], seconds(5))
    took = time.monotonic() - start
    checks.expect(took < 2, f"wait on present keys took {took:.3f}s")

    # A client that knows the world size registers with ADD("init/", 1): the
    # one key torch puts in the store without the "/" prefix.
    n1 = s.num_keys()
    dist.TCPStore(
        args.host,
        args.port,
        world_size=2,
        is_master=False,
        timeout=seconds(args.timeout_s),
        **store_kwargs(),
    )
    checks.equal(s.num_keys(), n1 + 1, "num_keys after a world_size client joined")


def scenario_timeouts(args, checks, _stdin):
    """wait and get of a key nobody sets raise after their timeout."""
    s = connect(args)
    e = checks.raises_within(
        lambda: s.wait(["timeouts/never"], datetime.timedelta(milliseconds=500)),
        0.45,
        5.0,
        "wait(timeout=500ms) on a missing key",
    )
    checks.expect(
        e is None or "timeout" in str(e).lower(), f"the wait error names a timeout: {e}"
    )
    # The server still answers this connection (its WAIT is never answered,
    # as nobody sets that key).
    s.set("timeouts/after_wait", "ok")
    checks.equal(s.get("timeouts/after_wait"), b"ok", "get after a timed-out wait")

    s.set_timeout(datetime.timedelta(milliseconds=500))
    checks.raises_within(
        lambda: s.get("timeouts/never2"), 0.45, 5.0, "get of a missing key (timeout 500ms)"
    )
    s.set_timeout(seconds(args.timeout_s))
    s.set("timeouts/after_get", "ok")
    checks.equal(s.get("timeouts/after_get"), b"ok", "get after a timed-out get")


def scenario_late(args, checks, stdin):
    """get and wait block until the tide client, or another torch client,
    sets their keys."""
    s = connect(args)
    print("WAITING late/from_tide", flush=True)
    start = time.monotonic()
    checks.equal(s.get("late/from_tide"), b"tide was here", "get of a key tide sets later")
    print(f"INFO get blocked {time.monotonic() - start:.3f}s", flush=True)
    print("WAITING late/a late/b", flush=True)
    start = time.monotonic()
    s.wait(["late/a", "late/b"])
    print(f"INFO wait blocked {time.monotonic() - start:.3f}s", flush=True)
    checks.equal(s.get("late/a") + s.get("late/b"), b"ab", "wait for two keys tide sets later")

    other = connect(args)
    got = []
    reader = threading.Thread(target=lambda: got.append(s.get("late/from_torch")))
    reader.start()
    other.set("late/from_torch", "torch was here")
    reader.join(timeout=args.timeout_s)
    checks.equal(got, [b"torch was here"], "get of a key another torch client sets later")


def scenario_adder(args, checks, stdin):
    """--threads torch clients each add 1 to --key --count times, starting
    together on GO; prints every value add returned."""
    stores = [connect(args) for _ in range(args.threads)]
    print("READY", flush=True)
    line = stdin.next(timeout_s=args.timeout_s)
    checks.equal(line, "GO", "the start signal")
    values = [[] for _ in stores]

    def run(i):
        for _ in range(args.count):
            values[i].append(stores[i].add(args.key, 1))

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(stores))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=args.timeout_s)
    for i, v in enumerate(values):
        checks.equal(len(v), args.count, f"adds done by thread {i}")
        checks.expect(
            all(a < b for a, b in zip(v, v[1:])),
            f"values one client's adds returned are increasing: {v}",
        )
    print("VALUES " + ",".join(str(x) for v in values for x in v), flush=True)


SCENARIOS = {
    "exchange": scenario_exchange,
    "semantics": scenario_semantics,
    "timeouts": scenario_timeouts,
    "late": scenario_late,
    "adder": scenario_adder,
}


def run_client(args):
    stdin = Stdin(exit_on_eof=True)
    checks = Checks()
    try:
        SCENARIOS[args.scenario](args, checks, stdin)
    except Exception as e:  # noqa: BLE001 - reported as a failed check
        checks.fail(f"{args.scenario} raised {e!r}")
    if checks.failed:
        print(f"FAILED {checks.failed}", flush=True)
        return 1
    print("PASS", flush=True)
    return 0


def run_server(args):
    store = dist.TCPStore(
        args.host,
        0,
        is_master=True,
        wait_for_workers=False,
        timeout=seconds(args.timeout_s),
        **store_kwargs(),
    )
    print(f"PORT {store.port}", flush=True)
    stdin = Stdin(exit_on_eof=False)
    while (line := stdin.lines.get()) is not None:
        cmd, *rest = line.split(" ")
        try:
            if cmd == "set":
                store.set(rest[0], bytes.fromhex(rest[1] if len(rest) > 1 else ""))
                reply = "OK"
            elif cmd == "get":
                reply = "VALUE " + store.get(rest[0]).hex()
            elif cmd == "add":
                reply = f"INT {store.add(rest[0], int(rest[1]))}"
            elif cmd == "num_keys":
                reply = f"INT {store.num_keys()}"
            elif cmd == "delete":
                reply = f"INT {int(store.delete_key(rest[0]))}"
            else:
                reply = f"ERROR unknown command {line!r}"
        except Exception as e:  # noqa: BLE001 - sent back to the test
            reply = f"ERROR {e!r}"
        print(reply, flush=True)
    return 0


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["version", "server", "client"])
    parser.add_argument("scenario", nargs="?", choices=sorted(SCENARIOS))
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=0)
    parser.add_argument("--timeout-s", type=float, default=30.0)
    parser.add_argument("--key", default="counter")
    parser.add_argument("--count", type=int, default=100)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args()
    print(f"HELLO torch {torch.__version__}", flush=True)
    if args.mode == "version":
        return 0
    if args.mode == "server":
        return run_server(args)
    if args.scenario is None or args.port == 0:
        parser.error("client needs a SCENARIO and --port")
    return run_client(args)


if __name__ == "__main__":
    sys.exit(main())
