#!/usr/bin/env python3
"""Runs torch's generic RPC test suites (GENERIC_TESTS of
torch.testing._internal.distributed.rpc_utils, from Debian's python3-torch)
on the TIDE backend, or on TensorPipe for comparison, and records each test.

    PYTHONPATH=build/python /usr/bin/python3 tests/torch_rpc/run_suite.py [options]

    --backend TIDE|TENSORPIPE   the fixture (default TIDE)
    -k TEXT                     keep tests whose id contains TEXT (repeatable)
    --skip TEXT                 drop tests whose id contains TEXT (repeatable)
    --list FILE                 keep the tests named in FILE (one id a line)
    --out FILE                  one TSV row per test: id, result, seconds, reason
    --start-method fork|spawn   how each test's workers start (default fork: a copy
                                of this process, torch and the suites already
                                imported; spawn, torch's own choice, has each of
                                them import both again, about 3 CPU-s a worker)

It prints each row as it goes, a count per suite, and ends with
"N passed, N failed, N skipped"; the exit status is 1 when any test failed.
"""
import argparse
import io
import os
import sys
import time
import unittest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # expecttest, the fixture

parser = argparse.ArgumentParser()
parser.add_argument("--backend", default="TIDE", choices=["TIDE", "TENSORPIPE"])
parser.add_argument("-k", action="append", default=[])
parser.add_argument("--skip", action="append", default=[])
parser.add_argument("--list")
parser.add_argument("--out", default="torch_rpc_suite.tsv")
parser.add_argument("--start-method", default="fork", choices=["fork", "spawn"])
args, _ = parser.parse_known_args()

import torch.multiprocessing  # noqa: E402
from torch.testing._internal.common_distributed import MultiProcessTestCase  # noqa: E402
from torch.testing._internal.distributed.rpc_utils import (  # noqa: E402
    GENERIC_TESTS,
    SpawnHelper,
    _check_and_set_tcp_init,
    generate_tests,
)

# Spawned workers import this module again, with this process's arguments
# gone (torch's utilities parse sys.argv too, so main() clears it): they learn
# the backend from the environment.
backend = os.environ.setdefault("TIDE_RPC_SUITE_BACKEND", args.backend)
if backend == "TIDE":
    from tide_fixture import TideRpcAgentTestFixture as fixture
    prefix = "Tide"
else:
    from torch.testing._internal.distributed.rpc.tensorpipe_rpc_agent_test_fixture import (
        TensorPipeRpcAgentTestFixture as fixture,
    )
    prefix = "TensorPipe"

# The generated classes live in this module, where spawned workers find them.
globals().update(generate_tests(prefix, fixture, GENERIC_TESTS, __name__))

if args.start_method == "fork":
    # SpawnHelper.setUp with fork for spawn. The workers run the same test
    # code on the same backend; only their start differs (and this process
    # starts no thread before it forks: rpc runs in the workers alone).
    def _fork_workers(self):
        MultiProcessTestCase.setUp(self)
        _check_and_set_tcp_init()
        self._start_processes(torch.multiprocessing.get_context("fork").Process)

    SpawnHelper.setUp = _fork_workers


def selected():
    wanted = None
    if args.list:
        with open(args.list) as f:
            # "Suite.test_name", or a row of a results file ("TideSuite.test_name ...").
            wanted = {line.split()[0].removeprefix("Tide").removeprefix("TensorPipe")
                      for line in f if line.strip() and not line.startswith("#")}
    tests = []
    for name, cls in sorted(globals().items()):
        if not (isinstance(cls, type) and issubclass(cls, unittest.TestCase) and name.startswith(prefix)):
            continue
        for test in unittest.TestLoader().loadTestsFromTestCase(cls):
            tid = test.id().split(".", 1)[-1]  # Suite.test_name
            short = tid[len(prefix):]
            if wanted is not None and short not in wanted:
                continue
            if args.k and not any(k in tid for k in args.k):
                continue
            if any(s in tid for s in args.skip):
                continue
            tests.append(test)
    return tests


class Recorder(unittest.TextTestResult):
    rows = []

    def startTest(self, test):
        self.began = time.time()
        super().startTest(test)

    def record(self, test, result, err=None):
        reason = ""
        if err is not None:
            text = err if isinstance(err, str) else self._exc_info_to_string(err, test)
            lines = [l for l in text.strip().splitlines() if l.strip()]
            reason = lines[-1][:300] if lines else ""
        tid = test.id().split(".", 1)[-1]
        row = f"{tid}\t{result}\t{time.time() - self.began:.1f}\t{reason}"
        Recorder.rows.append((tid, result))
        self.out.write(row + "\n")
        self.out.flush()
        print(row, file=sys.__stdout__, flush=True)

    def addSuccess(self, t):
        super().addSuccess(t)
        self.record(t, "pass")

    def addFailure(self, t, e):
        super().addFailure(t, e)
        self.record(t, "fail", e)

    def addError(self, t, e):
        super().addError(t, e)
        self.record(t, "error", e)

    def addSkip(self, t, r):
        super().addSkip(t, r)
        self.record(t, "skip", r)

    def addExpectedFailure(self, t, e):
        super().addExpectedFailure(t, e)
        self.record(t, "xfail")

    def addUnexpectedSuccess(self, t):
        super().addUnexpectedSuccess(t)
        self.record(t, "xpass")


if __name__ == "__main__":
    tests = selected()
    if not tests:
        sys.exit("no test matches")
    Recorder.out = open(args.out, "w")
    sys.argv = sys.argv[:1]  # torch's test utilities parse the command line too
    began = time.time()
    unittest.TextTestRunner(stream=io.StringIO(), resultclass=Recorder, verbosity=0).run(unittest.TestSuite(tests))
    suites = {}
    for tid, result in Recorder.rows:
        counts = suites.setdefault(tid.split(".")[0], {})
        counts[result] = counts.get(result, 0) + 1
    for suite, counts in sorted(suites.items()):
        print(f"{suite}: " + ", ".join(f"{n} {r}" for r, n in sorted(counts.items())))
    passed = sum(r in ("pass", "xfail") for _, r in Recorder.rows)
    failed = sum(r in ("fail", "error", "xpass") for _, r in Recorder.rows)
    skipped = sum(r == "skip" for _, r in Recorder.rows)
    print(f"{len(Recorder.rows)} tests in {time.time() - began:.0f} s; results in {args.out}")
    print(f"{passed} passed, {failed} failed, {skipped} skipped")
    sys.exit(1 if failed else 0)
