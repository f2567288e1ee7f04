#!/usr/bin/python3
"""tide.elastic's examples (examples/python/elastic/: torch.distributed.elastic's
"Customization" and "Expiration Timers" listings, runnable) run on tide, and,
with only their imports changed, on torch's own torch.distributed.elastic
(Debian's torch) with the same output: the same RunResult after a restart, after
a failure and after a stuck worker is reaped, and the agent's metrics by torch's names. torch
1.13 has no events.configure: the event handler runs on tide only.

    PYTHONPATH=build/python /usr/bin/python3 tests/elastic_py/examples_test.py
"""
import os
import subprocess
import sys
import tempfile
import unittest

EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "examples",
                        "python", "elastic")


def as_torch(source):
    """The example with torch's imports: the only difference."""
    return (source.replace("tide.elastic.store", "torch.distributed")
            .replace("tide.elastic", "torch.distributed.elastic"))


# What torch >= 2.4 built without libuv (Debian 13's 2.6) says of every store
# its own rendezvous backends make: they ask for libuv whatever USE_LIBUV is.
NO_LIBUV = "use_libuv was requested but PyTorch was build without libuv support"


class TorchCannotRun(Exception):
    pass


def run(path, *args, returncode=0, torch_side=False):
    out = subprocess.run(["/usr/bin/python3", path, *args], capture_output=True, text=True,
                         timeout=240)
    if torch_side and NO_LIBUV in out.stderr:
        raise TorchCannotRun()
    if out.returncode != returncode:
        raise AssertionError(f"{path} {' '.join(args)} exited with {out.returncode}:\n"
                             f"{out.stderr[-4000:]}")
    return out.stdout.splitlines()


class ExamplesTest(unittest.TestCase):
    def both(self, name, *args, returncode=0):
        path = os.path.join(EXAMPLES, name)
        with open(path) as f:
            source = f.read()
        self.assertIn("tide.elastic", source)
        with tempfile.TemporaryDirectory() as d:
            torch_path = os.path.join(d, name)
            with open(torch_path, "w") as f:
                f.write(as_torch(source))
            tide = run(path, *args, returncode=returncode)
            try:
                return tide, run(torch_path, *args, returncode=returncode, torch_side=True)
            except TorchCannotRun:
                # Still checked: tide's side, by the caller.
                print(f"\n{name} on torch's agent: this torch cannot make its "
                      "rendezvous store (built without libuv); compared with nothing",
                      file=sys.stderr)
                return tide, None

    def assert_same(self, tide, torch):
        if torch is not None:
            self.assertEqual(tide, torch)

    def test_custom_launcher_with_a_custom_rendezvous_handler(self):
        tide, torch = self.both("custom_launcher.py", "--fail-once")
        self.assertEqual(tide, ["worker 0 return value is: hello from rank 0 of 2",
                                "worker 1 return value is: hello from rank 1 of 2"])
        self.assert_same(tide, torch)

    def test_custom_launcher_reports_the_same_failure(self):
        tide, torch = self.both("custom_launcher.py", "--fail-once", "--max-restarts", "0",
                                returncode=1)
        self.assertEqual(tide, ["worker 1 failed with exit code 1: "
                                "RuntimeError: rank 1 fails in the first attempt"])
        self.assert_same(tide, torch)

    def test_expiration_timers_reap_a_stuck_worker(self):
        tide, torch = self.both("expiration_timers.py")
        self.assertEqual(tide, ["attempts seen by the workers: [1]"])
        self.assert_same(tide, torch)

    def test_metric_handler_gets_the_agents_metrics_by_torchs_names(self):
        tide, torch = self.both("metric_handler.py")
        # torch polls its workers and profiles each poll; tide's agent is
        # told of exits and has no such step.
        self.assertIn("torchelastic:workers.trainer.run_success_no_retries", tide)
        self.assertIn("launcher:__main__.launch.success", tide)
        if torch is not None:
            torch = {n for n in torch if "_monitor_workers" not in n}
            self.assertEqual(torch - set(tide), set())

    def test_event_handler_sees_the_failure_and_the_restart(self):
        lines = run(os.path.join(EXAMPLES, "event_handler.py"))
        self.assertEqual(lines[0], "event AGENT launcher.start state=None")
        self.assertIn("event AGENT torchelastic.worker.status.FAILED state=FAILED", lines)
        self.assertIn("event AGENT torchelastic.agent.restart state=None", lines)
        self.assertEqual(lines.count(
            "event AGENT torchelastic.worker.status.SUCCEEDED state=SUCCEEDED"), 2)
        self.assertEqual(lines[-1], "succeeded")


if __name__ == "__main__":
    unittest.main()
