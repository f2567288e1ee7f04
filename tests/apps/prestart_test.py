#!/usr/bin/python3
"""tiderun --prestart with real processes: workers handed to prestarted Python
interpreters keep the worker contract. The same torchrun scripts
(prestart/worker.py) run cold and from the pool: a DDP job restarted after a
failure trains to the same losses; a worker sees the same argv, sys.path[0],
__file__, __name__, working directory and environment (but for what differs
between any two runs); error files, per-attempt logs and tee, a timer kill and
`-m module`, heartbeats and NUMA binding work; SIGKILL or SIGTERM of tiderun leaves no interpreter or
worker; and the pool says why it does not apply to --no-python.

    /usr/bin/python3 tests/apps/prestart_test.py build/apps/tiderun
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from procs import DEADLINE, alive, children, wait_until  # noqa: E402

# What differs between any two runs: the run's id, its paths, the port, the
# run's secret, this test's output directory.
VARIES = {
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_ERROR_FILE",
    "TIDE_HEARTBEAT_SOCKET",
    "MASTER_PORT",
    "TIDE_RPC_TOKEN",
    "OUT",
}
TIDERUN = os.path.abspath(sys.argv.pop(1) if len(sys.argv) > 1 else "build/apps/tiderun")
HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "prestart")
WORKER = os.path.join(HERE, "worker.py")


def tiderun(mode, out, *flags, prestart=True, script=(WORKER,), nproc=2, wait=True):
    cmd = [TIDERUN, "--standalone", f"--nproc-per-node={nproc}", *flags]
    if prestart:
        cmd.append("--prestart")
    env = dict(os.environ, MODE=mode, OUT=out, PYTHON_EXEC="/usr/bin/python3",
               PYTHONPATH=HERE)
    if not wait:
        return subprocess.Popen(cmd + list(script), env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    return subprocess.run(cmd + list(script), env=env, capture_output=True, text=True,
                          timeout=240)


def read(directory, name):
    with open(os.path.join(directory, name)) as f:
        return f.read()


class PrestartTest(unittest.TestCase):
    maxDiff = None

    def setUp(self):
        self.dirs = []

    def tearDown(self):
        for d in self.dirs:
            d.cleanup()

    def tmp(self):
        d = tempfile.TemporaryDirectory()
        self.dirs.append(d)
        return d.name

    def test_a_ddp_job_restarted_from_the_pool_trains_as_a_cold_restart(self):
        results = []
        for prestart in (False, True):
            out = self.tmp()
            r = tiderun("ddp", out, "--max-restarts=1", prestart=prestart)
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            results.append([read(out, f"losses.{k}") for k in (0, 1)])
            if prestart:
                self.assertIn("local rank 1: handed to prestarted interpreter", r.stderr)
                self.assertEqual(r.stderr.count("handed to prestarted interpreter"), 4,
                                 "both attempts' workers come from the pool")
        self.assertEqual(results[0], results[1])

    def test_a_pooled_worker_sees_what_a_cold_one_does(self):
        dumps = []
        for prestart in (False, True):
            out = self.tmp()
            r = tiderun("dump", out, prestart=prestart)
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            dumps.append([json.loads(read(out, f"dump.{k}")) for k in (0, 1)])
        for cold, warm in zip(*dumps):
            for d in (cold, warm):
                for k in VARIES:
                    d["env"].pop(k)
            self.assertEqual(cold, warm)
        self.assertEqual(dumps[1][0]["name"], "__main__")
        self.assertEqual(dumps[1][0]["argv"], [WORKER])
        self.assertEqual(dumps[1][0]["path0"], HERE)

    def test_module_workers_from_the_pool(self):
        dumps = []
        for prestart in (False, True):
            out = self.tmp()
            r = tiderun("dump", out, prestart=prestart, script=("-m", "worker"))
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            dumps.append(json.loads(read(out, "dump.1")))
        for d in dumps:
            for k in VARIES:
                d["env"].pop(k)
        self.assertEqual(dumps[0], dumps[1])
        self.assertEqual(dumps[1]["argv"][0], WORKER)

    def test_error_files_logs_and_tee_of_pooled_workers(self):
        out, logs = self.tmp(), self.tmp()
        r = tiderun("fail", out, "--tee=3", f"--log-dir={logs}")
        self.assertEqual(r.returncode, 1)
        self.assertIn("handed to prestarted interpreter", r.stderr)
        self.assertIn("ValueError: bad value on rank", r.stderr)  # from the error file
        self.assertIn("[default0]:", r.stderr)  # tee's prefix
        [run_dir] = os.listdir(logs)
        stderr_log = read(os.path.join(logs, run_dir, "attempt_0", "0"), "stderr.log")
        self.assertIn("ValueError: bad value on rank 0", stderr_log)
        self.assertNotIn("<frozen runpy>", stderr_log)
        error = json.loads(read(os.path.join(logs, run_dir, "attempt_0", "0"), "error.json"))
        self.assertEqual(error["message"]["message"], "ValueError: bad value on rank 0")

    def test_a_pooled_worker_stuck_in_its_timer_is_killed_and_retried(self):
        out = self.tmp()
        r = tiderun("stuck_in_timer", out, "--file-timer", "--max-restarts=1")
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertEqual([read(out, f"done.{k}") for k in (0, 1)], ["1", "1"])
        self.assertEqual(r.stderr.count("handed to prestarted interpreter"), 4)

    def test_a_pooled_worker_that_stops_beating_is_found_hung(self):
        out = self.tmp()
        # 3 s: room for a worker that beat to exit (torch's teardown) on a
        # loaded machine before it counts as hung.
        r = tiderun("beats_then_hangs", out, "--heartbeat-timeout=3", "--max-restarts=1")
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertIn("hung: rank 0", r.stderr)
        self.assertEqual([read(out, f"done.{k}") for k in (0, 1)], ["1", "1"])
        self.assertEqual(r.stderr.count("handed to prestarted interpreter"), 4)

    def test_pooled_workers_are_bound_as_cold_ones(self):
        cpus = sorted(os.sched_getaffinity(0))
        if len(cpus) < 2:
            self.skipTest("needs 2 allowed CPUs")
        # A fake topology of two nodes of one CPU each: each local rank's
        # interpreter is started bound to its own.
        sysfs = self.tmp()
        for node, cpu in enumerate(cpus[:2]):
            for path, text in ((f"devices/system/node/node{node}/cpulist", str(cpu)),
                               (f"devices/system/cpu/cpu{cpu}/topology/physical_package_id",
                                "0")):
                os.makedirs(os.path.dirname(os.path.join(sysfs, path)), exist_ok=True)
                with open(os.path.join(sysfs, path), "w") as f:
                    f.write(text + "\n")
        out = self.tmp()
        os.environ["TIDE_TOPOLOGY_ROOT"] = sysfs
        try:
            r = tiderun("affinity", out, "--numa-binding=node")
        finally:
            del os.environ["TIDE_TOPOLOGY_ROOT"]
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertEqual(r.stderr.count("handed to prestarted interpreter"), 2, r.stderr)
        self.assertEqual([read(out, f"affinity.{k}") for k in (0, 1)],
                         [str(cpus[0]), str(cpus[1])])

    def stop_tiderun(self, sig):
        out = self.tmp()
        p = tiderun("hang", out, "--prestart-spares=1", wait=False)
        try:
            wait_until(lambda: all(os.path.exists(os.path.join(out, f"pid.{k}"))
                                   for k in (0, 1)), "workers started")
            # Two workers, and the pool refilled: two interpreters and a spare
            # (with the janitor, tiderun's children).
            wait_until(lambda: len(children(p.pid)) >= 6, "the pool refilled")
            everyone = children(p.pid)
            p.send_signal(sig)
            p.wait(timeout=DEADLINE)
            wait_until(lambda: not any(alive(c) for c in everyone), "all gone")
            return p.returncode
        finally:
            p.kill()
            p.communicate()

    def test_killing_tiderun_leaves_no_interpreter_or_worker(self):
        self.assertEqual(self.stop_tiderun(signal.SIGKILL), -signal.SIGKILL)

    def test_sigterm_stops_the_workers_and_drains_the_pool(self):
        self.assertEqual(self.stop_tiderun(signal.SIGTERM), 1)

    def test_the_pool_says_it_does_not_apply_to_no_python(self):
        r = tiderun("dump", self.tmp(), "--no-python", prestart=True, nproc=1,
                    script=("/bin/true",))
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertIn("--prestart does not apply", r.stderr)


if __name__ == "__main__":
    unittest.main()
