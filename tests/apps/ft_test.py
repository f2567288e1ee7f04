#!/usr/bin/python3
"""Training that does not stop (tide.ft, tiderun --ft-store) with real
processes, gloo and Debian's torch: three replica groups of two ranks each
train a small model, one tiderun per group, meeting in a tide-store. A rank
of one group is SIGKILLed mid-training: the other groups' workers keep their
pids, their steps never go back, no committed step is lost; the killed
group restarts, is admitted again, heals from a healthy group, and at the
end every rank of every group holds bit-identical weights and momentum. A
group that hangs (SIGSTOP) is voted out by its heartbeat and the others go
on; the same kill under DiLoCo (a sync every 4 steps) heals at a sync; with the quorum in a 3-member etcd, training goes on when the
member in use is killed; one tiderun --replica-groups=3 runs all three;
examples/python/ft/train.py trains, and so do the examples in TorchFT's
idiom (DistributedDataParallel, DiLoCo).

    /usr/bin/python3 tests/apps/ft_test.py build/apps/tiderun
"""
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from etcd import EtcdCluster  # noqa: E402

TIDERUN = os.path.abspath(sys.argv.pop(1) if len(sys.argv) > 1 else "build/apps/tiderun")
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "ft", "worker.py")
# tide.ft needs tide._elastic: the build's package (python/ copied beside it).
PYTHON = os.path.join(os.path.dirname(TIDERUN), "..", "python")
GROUPS = ["0", "1", "2"]
DEADLINE = 240  # s: the bound on a hang, never a pace


class Job:
    """A tide-store and one tiderun per replica group."""

    def __init__(self, test, env=(), address=None, one_command=False):
        self.dir = tempfile.mkdtemp(prefix="tide_ft_")
        test.addCleanup(self.stop)
        self.store = None
        if address is None:
            self.store = subprocess.Popen(
                [os.path.join(os.path.dirname(TIDERUN), "tide-store"), "--port", "0"],
                stdout=subprocess.PIPE, text=True)
            address = self.store.stdout.readline().split()[-1] + "/job"
        self.address = address
        self.env = dict(os.environ, OUT=self.dir, PYTHONPATH=os.path.abspath(PYTHON),
                        PYTHON_EXEC="/usr/bin/python3", **dict(env))
        if one_command:  # tiderun --replica-groups: it serves the store
            self.runs = {"all": subprocess.Popen(
                [TIDERUN, "--standalone", "--nproc-per-node=2",
                 f"--replica-groups={len(GROUPS)}", WORKER],
                env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)}
        else:
            self.runs = {g: self.launch(g) for g in GROUPS}
        self.started = time.monotonic()

    def launch(self, group):
        cmd = [TIDERUN, "--standalone", "--nproc-per-node=2", "--max-restarts=1",
               f"--ft-store={self.address}", f"--replica-group-id={group}",
               f"--num-replica-groups={len(GROUPS)}", WORKER]
        return subprocess.Popen(cmd, env=self.env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def lines(self, group, rank):
        try:
            with open(os.path.join(self.dir, f"{group}-{rank}.log")) as f:
                return [json.loads(x) for x in f if x.endswith("\n")]
        except FileNotFoundError:
            return []

    def commits(self, group, rank):
        return [x for x in self.lines(group, rank) if x["event"] == "commit"]

    def until(self, what, condition):
        while not condition():
            if time.monotonic() - self.started > DEADLINE:
                raise AssertionError(f"not within {DEADLINE} s: {what}\n" + self.output())
            for g, p in self.runs.items():
                if p.poll() is not None and p.returncode != 0:
                    raise AssertionError(f"{g}'s tiderun exited {p.returncode}\n" + self.output())
            time.sleep(0.05)  # looking again at files other processes write

    def stop_at(self, step):
        with open(os.path.join(self.dir, "stop_at.tmp"), "w") as f:
            f.write(str(step))
        os.rename(os.path.join(self.dir, "stop_at.tmp"), os.path.join(self.dir, "stop_at"))

    def wait(self, groups=None):
        groups = list(self.runs) if groups is None else groups
        out = {}
        for g in groups:
            try:
                out[g] = self.runs[g].communicate(timeout=DEADLINE)[0]
            except subprocess.TimeoutExpired:
                raise AssertionError(f"{g} did not end\n" + self.output())
        self.outputs = out
        return {g: self.runs[g].returncode for g in groups}

    def output(self):
        text = []
        for g in GROUPS:
            for r in (0, 1):
                text.append(f"--- {g}-{r}.log (tail)\n" + "\n".join(
                    json.dumps(x) for x in self.lines(g, r)[-8:]))
        for g, o in getattr(self, "outputs", {}).items():
            text.append(f"--- {g} tiderun\n{o[-3000:]}")
        return "\n".join(text)

    def stop(self):
        for p in list(self.runs.values()) + ([self.store] if self.store else []):
            if p.poll() is None:
                p.kill()
                p.wait()
            for s in (p.stdout,):
                if s:
                    s.close()


class FaultToleranceTest(unittest.TestCase):
    def check_survivor(self, job, group):
        """Its workers kept their pids; its steps went 1, 2, 3... with none
        lost and none repeated."""
        for rank in (0, 1):
            pids = {x["pid"] for x in job.lines(group, rank)}
            self.assertEqual(len(pids), 1, f"{group}-{rank} was restarted\n" + job.output())
            steps = [x["step"] for x in job.commits(group, rank)]
            self.assertEqual(steps, list(range(1, len(steps) + 1)), job.output())

    def check_identical(self, job):
        ends = {(g, r): [x for x in job.lines(g, r) if x["event"] == "end"][-1]
                for g in GROUPS for r in (0, 1)}
        self.assertEqual(len({e["step"] for e in ends.values()}), 1, ends)
        self.assertEqual(len({e["digest"] for e in ends.values()}), 1, ends)
        # A healed group counts the batches of the steps before it came back.
        self.assertEqual(len({e["batches"] for e in ends.values()}), 1, ends)

    def test_a_killed_group_heals_and_the_others_never_stop(self):
        self.kill_group_1_and_check_it_heals(Job(self))

    def test_under_diloco_a_killed_group_heals_at_a_sync_and_the_others_never_stop(self):
        # A step of the logs is a sync (every 4 steps of each group's own).
        self.kill_group_1_and_check_it_heals(Job(self, env={"MODE": "diloco", "SYNC_EVERY": "4"}))

    def kill_group_1_and_check_it_heals(self, job):
        job.until("every group commits step 5",
                  lambda: all(len(job.commits(g, r)) >= 5 for g in GROUPS for r in (0, 1)))
        victim = job.commits("1", 1)[-1]["pid"]
        os.kill(victim, signal.SIGKILL)
        killed_at = max(x["step"] for g in ("0", "2") for x in job.commits(g, 0))
        # The restarted group 1 heals (a new pid) and then commits with the others.
        job.until("group 1 heals and commits again", lambda: any(
            x["event"] == "commit" and x["pid"] != victim and x["participants"] == 3
            for x in job.lines("1", 1)))
        healed = [x for x in job.lines("1", 0) if x["event"] == "healed"]
        self.assertTrue(healed, job.output())
        self.assertGreater(healed[-1]["step"], killed_at, job.output())
        end = max(x["step"] for x in job.commits("0", 0)) + 10
        job.stop_at(end)
        self.assertEqual(job.wait(), {g: 0 for g in GROUPS}, job.output())
        for g in ("0", "2"):
            self.check_survivor(job, g)
            # Some round went on with two groups while group 1 was away.
            self.assertTrue(any(x["participants"] == 2 for x in job.commits(g, 0)), job.output())
        self.check_identical(job)
        self.assertIn("declared out", job.outputs["1"])

    def test_training_goes_on_when_the_etcd_member_in_use_is_killed(self):
        cluster = EtcdCluster(3)
        self.addCleanup(cluster.stop)
        # With the default heartbeat timeout (5 s): a member that lost its
        # leader holds a request for up to 7 s, and the election pauses
        # every beat; neither may vote a healthy group out.
        job = Job(self, address=f"etcd:{cluster.endpoints()}/job")
        job.until("every group commits step 5",
                  lambda: all(len(job.commits(g, r)) >= 5 for g in GROUPS for r in (0, 1)))
        cluster.kill(0)  # the first endpoint: the one every client uses
        at = max(x["step"] for x in job.commits("0", 0))
        job.until("every group commits 10 more steps", lambda: all(
            job.commits(g, r)[-1]["step"] >= at + 10 for g in GROUPS for r in (0, 1)))
        job.stop_at(max(x["step"] for x in job.commits("0", 0)) + 5)
        self.assertEqual(job.wait(), {g: 0 for g in GROUPS}, job.output())
        for g in GROUPS:
            self.check_survivor(job, g)
        self.check_identical(job)

    def test_one_tiderun_runs_every_group_and_serves_their_store(self):
        job = Job(self, one_command=True)
        job.stop_at(20)
        self.assertEqual(job.wait(), {"all": 0}, job.output())
        for g in GROUPS:
            self.check_survivor(job, g)
            self.assertEqual(job.commits(g, 0)[0]["participants"], len(GROUPS))
        self.check_identical(job)
        self.assertIn("running 3 replica groups", job.outputs["all"])
        bad = subprocess.run([TIDERUN, "--standalone", "--replica-groups=2",
                              "--ft-store=127.0.0.1:1", WORKER], capture_output=True, text=True)
        self.assertEqual(bad.returncode, 2)
        self.assertIn("without --ft-store", bad.stderr)

    def run_example(self, name, nproc, steps):
        """examples/python/ft/NAME run by one tiderun with 2 replica groups."""
        example = os.path.join(HERE, "..", "..", "examples", "python", "ft", name)
        out = subprocess.run(
            [TIDERUN, "--standalone", f"--nproc-per-node={nproc}", "--replica-groups=2",
             example, "--steps", str(steps)],
            env=dict(os.environ, PYTHONPATH=os.path.abspath(PYTHON),
                     PYTHON_EXEC="/usr/bin/python3"),
            capture_output=True, text=True, timeout=DEADLINE)
        self.assertEqual(out.returncode, 0, out.stdout + out.stderr)
        return out

    def test_the_example_trains_with_two_groups(self):
        out = self.run_example("train.py", 2, 100)
        for g in ("0", "1"):  # tiderun numbers the groups it runs
            self.assertIn(f"group {g}: step 100", out.stdout)

    def test_a_script_in_torchfts_idiom_trains_two_groups_alike(self):
        out = self.run_example("torchft_style.py", 1, 60)
        # The two groups' lines may interleave on the shared stdout.
        ends = dict(re.findall(
            r"group (\d): step 60, 120 batches committed, weights ([-\d.,]+\d)", out.stdout))
        # Both groups in every step (2 batches a step), and the same weights
        # (from different shards of the data: averaged).
        self.assertEqual(sorted(ends), ["0", "1"], out.stdout)
        self.assertEqual(ends["0"], ends["1"])

    def test_the_diloco_example_leaves_two_groups_alike(self):
        out = self.run_example("diloco.py", 1, 12)
        ends = dict(re.findall(r"group (\d): sync 12, weights ([-\d.,]+\d)", out.stdout))
        # Trained on different shards between syncs: alike only if synced.
        self.assertEqual(sorted(ends), ["0", "1"], out.stdout)
        self.assertEqual(ends["0"], ends["1"])

    def test_a_hung_group_is_voted_out_by_its_heartbeat(self):
        job = Job(self, env={"MODE": "hang", "HANG_GROUP": "2", "HANG_AT": "4",
                             "FT_HEARTBEAT_TIMEOUT": "2", "FT_TIMEOUT": "5"})
        job.until("groups 0 and 1 go on without 2", lambda: any(
            x["participants"] == 2 for g in ("0", "1") for x in job.commits(g, 0)))
        end = max(x["step"] for x in job.commits("0", 0)) + 5
        job.stop_at(end)
        self.assertEqual(job.wait(["0", "1"]), {"0": 0, "1": 0}, job.output())
        for g in ("0", "1"):
            self.check_survivor(job, g)
            self.assertEqual(job.commits(g, 0)[-1]["step"], end)
        for r in (0, 1):  # stopped, never to wake: ended here
            for pid in {x["pid"] for x in job.lines("2", r)}:
                os.kill(pid, signal.SIGKILL)


if __name__ == "__main__":
    unittest.main()
