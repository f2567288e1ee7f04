#!/usr/bin/python3
"""The live job page of a real job, in Debian's headless chromium: two
tiderun agents form one c10d job on this machine; the page one of them
serves on its health port shows both nodes and both ranks running, then,
after a worker fails and the group restarts, the restart; a rank's log is
read from its node; a screenshot is kept (docs/img/job_page.png is one).

    python3 tests/apps/job_page_live_test.py TIDERUN

Screenshots and dumped pages go to $TIDE_TEST_ARTIFACTS (default: a new
temporary folder). Without chromium it exits 77 (skipped).
"""
import os
import re
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "support"))
import browser  # noqa: E402

TIDERUN = None  # from the command line
WORKER = """#!/bin/sh
echo "start RANK=$RANK"
while [ ! -e {stop} ]; do
  if [ "$RANK" = 1 ] && [ -e {fail} ] && [ ! -e {failed} ]; then
    touch {failed}
    echo "rank 1 fails on purpose" >&2
    exit 3
  fi
  sleep 0.05
done
"""


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Agent:
    """One tiderun, its output read by a thread."""

    def __init__(self, name, args):
        self.name = name
        self.lines = []
        self.cond = threading.Condition()
        self.proc = subprocess.Popen(
            [TIDERUN] + args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self):
        for line in self.proc.stdout:
            with self.cond:
                self.lines.append(line.rstrip("\n"))
                self.cond.notify_all()

    def wait_for(self, pattern, timeout=60):
        """The first match of pattern in the output, waiting for it."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self.cond:
            while True:
                for line in self.lines:
                    m = regex.search(line)
                    if m:
                        return m
                left = deadline - time.monotonic()
                if left <= 0 or self.proc.poll() is not None:
                    raise AssertionError(
                        f"{self.name}: no line matching {pattern!r} in:\n"
                        + "\n".join(self.lines))
                self.cond.wait(left)

    def count(self, pattern):
        with self.cond:
            return sum(1 for line in self.lines if re.search(pattern, line))

    def log(self):
        with self.cond:
            return f"--- {self.name}\n" + "\n".join(self.lines)


class LiveJobPageTest(unittest.TestCase):
    def setUp(self):
        if browser.chromium() is None:
            self.skipTest("chromium is not installed (scripts/setup.sh)")
        self.dir = tempfile.mkdtemp(prefix="tide-live-page-")
        self.artifacts = os.environ.get("TIDE_TEST_ARTIFACTS") or self.dir
        os.makedirs(self.artifacts, exist_ok=True)
        self.stop = os.path.join(self.dir, "stop")
        self.fail_flag = os.path.join(self.dir, "fail")
        worker = os.path.join(self.dir, "worker.sh")
        with open(worker, "w") as f:
            f.write(WORKER.format(stop=self.stop, fail=self.fail_flag,
                                  failed=os.path.join(self.dir, "failed")))
        os.chmod(worker, 0o755)
        endpoint = f"127.0.0.1:{free_port()}"
        common = [
            "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
            f"--rdzv-endpoint={endpoint}", "--rdzv-id=pagejob",
            # A node is lost after 3 s silent: a loaded machine's stalls are
            # shorter (a false loss would spend the one restart).
            "--rdzv-conf=last_call_timeout=1,keep_alive_interval=1,"
            "keep_alive_max_attempt=3,join_timeout=60",
            "--monitor-interval=0.05", "--local-addr=127.0.0.1",
            "--status-interval=0.3", "--max-restarts=1", "--tee=3",
            "--health-port=127.0.0.1:0",
        ]
        self.agents = []
        for name in ("a", "b"):
            self.agents.append(Agent(name, [
                "--log-dir", os.path.join(self.dir, "logs-" + name)]
                + common + [worker]))

    def tearDown(self):
        if not hasattr(self, "agents"):
            return
        open(self.stop, "w").close()
        for a in self.agents:
            try:
                a.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                a.proc.kill()
                a.proc.wait()

    def logs(self):
        return "\n".join(a.log() for a in self.agents)

    def page_until(self, url, check, timeout=90):
        """Loads the page until check(dom) holds; returns that DOM. (One load
        starts a browser: seconds each on a loaded machine.)"""
        deadline = time.monotonic() + timeout
        while True:
            text = browser.dump_dom(url, budget_ms=3000)
            dom = browser.parse_html(text)
            if check(dom):
                return dom, text
            if time.monotonic() > deadline:
                self.fail(f"the page never showed what was expected:\n{text}\n"
                          + self.logs())

    def test_the_page_shows_the_running_job_and_then_its_restart(self):
        a = self.agents[0]
        port = int(a.wait_for(r"health checks on port (\d+)").group(1))
        url = f"http://127.0.0.1:{port}/"
        for agent in self.agents:
            agent.wait_for(r"start RANK=")

        def running(dom):
            cards = [e for e in dom.iter() if e.get("data-node") is not None
                     and e.get("data-slot") is not None]
            squares = [e for e in dom.iter() if e.get("data-rank") is not None]
            return (len(cards) == 2
                    and sorted(s.get("data-rank") for s in squares) == ["0", "1"]
                    and all(s.get("data-state") == "HEALTHY" for s in squares))

        dom, first = self.page_until(url, running)
        self.assertEqual(dom.by_id("job-state").text.strip(), "HEALTHY", first)
        self.assertEqual(dom.by_id("job-restarts").text.strip(), "0", first)
        with open(os.path.join(self.artifacts, "live_running.html"), "w") as f:
            f.write(first)

        # Rank 1 fails; both nodes start again; the page shows the restart.
        open(self.fail_flag, "w").close()
        for agent in self.agents:
            agent.wait_for(r"restarting the worker group|membership changed")

        def restarted(dom):
            state = dom.by_id("job-state")
            squares = [e for e in dom.iter() if e.get("data-rank") is not None]
            return (dom.by_id("job-restarts").text.strip() == "1"
                    and state is not None and state.text.strip() == "HEALTHY"
                    and len(squares) == 2
                    and all(s.get("data-state") == "HEALTHY" for s in squares))

        dom, after = self.page_until(url, restarted)
        with open(os.path.join(self.artifacts, "live_restarted.html"), "w") as f:
            f.write(after)
        # The node whose rank failed names the failure; its timeline lane
        # holds the failed attempt and the running one.
        self.assertIn("worker failure: rank 1", after, after)
        outcomes = [e.get("data-outcome") for e in dom.iter()
                    if e.get("data-outcome") is not None]
        self.assertIn("FAILED", outcomes, after)
        self.assertIn("RUNNING", outcomes, after)

        # A rank's log, from its node's endpoint (the page fetches it).
        with urllib.request.urlopen(
                f"http://127.0.0.1:{port}/api/log?rank=0", timeout=10) as r:
            self.assertEqual(r.headers["Access-Control-Allow-Origin"], "*")
            self.assertIn("start RANK=", r.read().decode())

        shot = os.path.join(self.artifacts, "job_page_live.png")
        browser.screenshot(url, shot, size=(1280, 900), budget_ms=3000)
        width, height = browser.png_size(shot)
        self.assertEqual((width, height), (1280, 900))
        self.assertGreater(os.path.getsize(shot), 20_000)


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: job_page_live_test.py TIDERUN")
    TIDERUN = sys.argv.pop(1)
    if browser.chromium() is None:
        print("chromium is not installed: skipped", file=sys.stderr)
        sys.exit(77)
    unittest.main()
