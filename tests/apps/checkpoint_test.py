#!/usr/bin/python3
"""In-memory checkpoints (tiderun --checkpoint-memory, tide.checkpoint) with
real processes and Debian's torch: a worker SIGKILLed after five saves is
restored bit for bit from memory (cold and prestarted, new tensors and in
place); a worker killed in the middle of a save gets its previous snapshot;
a state over the bound, a value pickle refuses, a sparse tensor and a bad
step are clear errors that keep the last snapshot; a bound that /dev/shm
cannot hold, or too small for the local ranks, is refused at start;
snapshots written behind the training are read by plain torch and by a new
job, SIGTERM of tiderun writes the newest first; ranks that saved
different steps load the newest they all hold; a node lost in a two-node job
is restored from its peer, and one whose ranks move to the survivor from
the copies it kept; a libtorch program (the C++ twin) is restored bit
for bit and reads what Python saves, and Python what it saves; the example DDP script
killed at a random step trains to the same weights as without the kill;
no region is left behind.

    /usr/bin/python3 tests/apps/checkpoint_test.py build/apps/tiderun
"""
import glob
import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from procs import children  # noqa: E402

TIDERUN = os.path.abspath(sys.argv.pop(1) if len(sys.argv) > 1 else "build/apps/tiderun")
HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "checkpoint", "worker.py")
PYTHON = os.path.join(HERE, "..", "..", "python")
# The libtorch worker on the C++ twin (tests/checkpoint/torch_worker.cpp),
# built with libtorch.
TORCH_WORKER = os.environ.get("TIDE_CHECKPOINT_TORCH_WORKER")


def regions():
    return set(glob.glob("/dev/shm/tide-checkpoint-*"))


def tiderun(mode, out, *flags, memory="64M", prefix=(), nproc=2, wait=True, then="",
            timeout=300):
    cmd = [*prefix, TIDERUN, "--standalone", f"--nproc-per-node={nproc}", *flags]
    if memory:
        cmd.append(f"--checkpoint-memory={memory}")
    env = dict(os.environ, MODE=mode, OUT=out, PYTHON_EXEC="/usr/bin/python3",
               PYTHONPATH=os.path.abspath(PYTHON), THEN=then)
    if not wait:
        return subprocess.Popen(cmd + [WORKER], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    p = subprocess.Popen(cmd + [WORKER], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    try:
        out, err = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        out, err = stuck(p, timeout)
    return subprocess.CompletedProcess(p.args, p.returncode, out, err)


def stuck(p, timeout):
    """A tiderun past its time: its workers print where they are (the
    worker's faulthandler on SIGUSR1), then it is stopped by SIGTERM, which
    removes its region; its output, with those stacks, says why."""
    for pid in children(p.pid):
        try:
            with open(f"/proc/{pid}/comm") as f:
                if f.read().startswith("python"):
                    os.kill(pid, signal.SIGUSR1)
        except OSError:  # gone meanwhile
            pass
    time.sleep(2)  # for the stacks to be printed: a diagnosis, not a synchronisation
    p.terminate()
    try:
        out, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        out, err = p.communicate()
    return out, err + f"\n[checkpoint_test: tiderun was still running after {timeout} s]"


def saved(path):
    """The step a worker last wrote to a progress file."""
    with open(path) as f:
        return int(f.read())


# Reads a written snapshot with Debian's torch alone: no tide on the path.
PLAIN_TORCH_DIGEST = """
import sys, torch
sys.path.insert(0, sys.argv[2])
from worker_digest import digest
print(digest(torch.load(sys.argv[1])))
"""


class CheckpointTest(unittest.TestCase):
    maxDiff = None

    def setUp(self):
        self.top = tempfile.mkdtemp(prefix="tide-ckpt-test-")
        self.out = tempfile.mkdtemp(dir=self.top)
        self.before = regions()

    def tearDown(self):
        shutil.rmtree(self.top, ignore_errors=True)
        self.assertEqual(regions() - self.before, set(), "no region is left behind")

    def seen(self, mode, rank, attempt):
        with open(os.path.join(self.out, f"{mode}.{rank}.{attempt}.json")) as f:
            return json.load(f)

    def test_a_killed_worker_is_restored_bit_for_bit_from_memory(self):
        for prestart in ((), ("--prestart",)):
            with self.subTest(prestart=bool(prestart)):
                self.out = tempfile.mkdtemp(dir=self.top)
                r = tiderun("saves_then_dies", self.out, "--max-restarts=1", *prestart)
                self.assertEqual(r.returncode, 0, r.stderr[-3000:])
                self.assertIn("checkpoint memory: 64.0 MiB in /dev/shm/tide-checkpoint-",
                              r.stderr)
                for rank in (0, 1):
                    saved = self.seen("saves_then_dies", rank, 0)["saved"]
                    got = self.seen("saves_then_dies", rank, 1)
                    self.assertEqual((got["step"], got["source"]), (4, "memory"))
                    self.assertEqual(got["fresh"], saved, f"rank {rank}: new tensors")
                    self.assertEqual(got["in_place_step"], 4)
                    self.assertEqual(got["in_place"], saved, f"rank {rank}: in place")
                    self.assertTrue(got["kept_objects"], "in place keeps the caller's tensors")
                if prestart:
                    self.assertIn("handed to prestarted interpreter", r.stderr)

    def test_a_worker_killed_in_the_middle_of_a_save_gets_its_previous_snapshot(self):
        r = tiderun("big_save_killed", self.out, "--max-restarts=1", memory="2G", nproc=1)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertIn("Signal 9 (SIGKILL)", r.stderr)
        before = self.seen("big_save_killed", 0, 0)
        self.assertNotIn("finished", before, "the save of step 1 was cut short")
        self.assertEqual(before["step0_slots"], [True, False], "step 0 was complete")
        got = self.seen("big_save_killed", 0, 1)
        self.assertEqual(got, {"step": 0, "source": "memory", "all_ones": True,
                               "numel": 64 << 20})

    def test_bad_states_are_clear_errors_that_keep_the_last_snapshot(self):
        r = tiderun("refusals", self.out, memory="16M", nproc=1)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        got = self.seen("refusals", 0, 0)
        self.assertEqual((got["step"], got["w"]), (3, list(range(10))))
        errors = got["errors"]
        self.assertRegex(errors["too_big"], r"needs 32\.0 MiB and a snapshot slot holds 8\.0 MiB"
                         r".*previous snapshot is kept")
        self.assertIn("state['opt']['groups'][0]['fn'] cannot be serialized", errors["unpicklable"])
        self.assertIn("step must be an int >= 0", errors["bad_step"])
        self.assertIn("state['s'] is a torch.sparse_coo tensor", errors["sparse"])
        self.assertIn("state['w'] was saved as torch.int64 (10,) and is torch.float32 (11,)",
                      errors["mismatch"])

    def test_a_bound_that_does_not_fit_is_refused_at_start(self):
        r = tiderun("refusals", self.out, memory="lots")
        self.assertEqual(r.returncode, 2, r.stderr)
        self.assertIn("--checkpoint-memory", r.stderr)

        r = tiderun("refusals", self.out, memory="3M", nproc=2)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("--checkpoint-memory 3.0 MiB is too small for 2 local ranks", r.stderr)
        self.assertEqual(os.listdir(self.out), [], "no worker started")

        if os.geteuid() != 0 or not shutil.which("unshare"):
            self.skipTest("a small /dev/shm needs root and unshare (a private mount)")
        probe = subprocess.run(["unshare", "--mount", "--propagation", "private", "true"],
                               capture_output=True, text=True)
        if probe.returncode != 0:  # a chroot whose / is no mount point
            self.skipTest(f"no private mount namespace here: {probe.stderr.strip()}")
        # /dev/shm as a container's, 16 MiB, in a mount namespace of its own.
        small = ["unshare", "--mount", "--propagation", "private", "sh", "-c",
                 'mount -t tmpfs -o size=16m tmpfs /dev/shm && exec "$@"', "sh"]
        r = tiderun("refusals", self.out, memory="64M", prefix=small)
        self.assertNotEqual(r.returncode, 0)
        self.assertRegex(r.stderr, r"--checkpoint-memory 64\.0 MiB does not fit in /dev/shm: "
                         r"16\.0 MiB free of 16\.0 MiB")
        self.assertEqual(os.listdir(self.out), [], "no worker started")

    def written(self, directory, rank):
        return sorted(os.listdir(os.path.join(directory, f"rank-{rank}")))

    def plain_torch_digest(self, path):
        r = subprocess.run(["/usr/bin/python3", "-c", PLAIN_TORCH_DIGEST, path,
                            os.path.join(HERE, "checkpoint")],
                           env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True,
                           timeout=120)
        self.assertEqual(r.returncode, 0, r.stderr)
        return r.stdout.strip()

    def test_snapshots_are_written_behind_and_read_by_plain_torch_and_a_new_job(self):
        disk = os.path.join(self.top, "ckpt")
        r = tiderun("write_behind", self.out, f"--checkpoint-dir={disk}",
                    "--checkpoint-keep=2")
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        self.assertIn("writing the newest snapshots to", r.stderr)
        for rank in (0, 1):
            files = self.written(disk, rank)
            self.assertEqual(files[-1], "step-4.pt", "the newest, written at the end")
            self.assertLessEqual(len(files), 2, "--checkpoint-keep=2")
            self.assertEqual(self.plain_torch_digest(os.path.join(disk, f"rank-{rank}", "step-4.pt")),
                             self.seen("write_behind", rank, 0)["saved"])

        # A new job: its agent's memory is empty, the files are not.
        r = tiderun("from_disk", self.out, f"--checkpoint-dir={disk}")
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        for rank in (0, 1):
            got = self.seen("from_disk", rank, 0)
            self.assertEqual((got["step"], got["source"]), (4, "disk"))
            self.assertEqual(got["digest"], self.seen("write_behind", rank, 0)["saved"])

    def test_sigterm_of_tiderun_writes_the_newest_snapshot_first(self):
        disk = os.path.join(self.top, "ckpt")
        p = tiderun("write_behind", self.out, f"--checkpoint-dir={disk}", wait=False,
                    then="wait")
        try:
            while not all(os.path.exists(os.path.join(self.out, f"write_behind.{r}.0.json"))
                          for r in (0, 1)):
                self.assertIsNone(p.poll(), "tiderun ended early")
                time.sleep(0.05)
            p.send_signal(signal.SIGTERM)
            _, err = p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
        self.assertNotEqual(p.returncode, 0)
        for rank in (0, 1):
            self.assertEqual(self.written(disk, rank)[-1], "step-4.pt", err[-3000:])
            self.assertEqual(self.plain_torch_digest(os.path.join(disk, f"rank-{rank}", "step-4.pt")),
                             self.seen("write_behind", rank, 0)["saved"])

    def test_a_ddp_job_killed_at_a_random_step_trains_to_the_same_weights(self):
        example = os.path.join(HERE, "..", "..", "examples", "checkpoint_train.py")
        kill_at = random.randint(3, 45)

        def train(*args):
            env = dict(os.environ, PYTHON_EXEC="/usr/bin/python3",
                       PYTHONPATH=os.path.abspath(PYTHON))
            r = subprocess.run([TIDERUN, "--standalone", "--nproc-per-node=2",
                                "--max-restarts=1", "--checkpoint-memory=64M", example,
                                *args], env=env, capture_output=True, text=True, timeout=300)
            self.assertEqual(r.returncode, 0, r.stderr[-3000:])
            return r.stdout

        whole = train()
        killed = train("--kill-at", str(kill_at))
        # Every rank goes on from the same step: the last rank's last save
        # (kill_at), or the one before when the agent stopped rank 0 before
        # its own save of kill_at was in.
        # (The two ranks' lines may interleave in tiderun's stdout.)
        starts = re.findall(r"attempt 1: (starting at step \d+ \(state from \w+\))", killed)
        self.assertEqual(len(starts), 2, killed)
        starts = set(starts)
        self.assertEqual(len(starts), 1, killed)
        self.assertIn(starts.pop(), [f"starting at step {s} (state from memory)"
                                     for s in (kill_at, kill_at + 1)])
        done = [ln for ln in killed.splitlines() if ln.startswith("done:")]
        self.assertEqual(done, [ln for ln in whole.splitlines() if ln.startswith("done:")],
                         f"killed after step {kill_at}")

    def test_ranks_that_saved_different_steps_load_the_newest_they_all_hold(self):
        r = tiderun("agree", self.out)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        for rank in (0, 1):
            got = self.seen("agree", rank, 0)
            self.assertEqual((got["step"], got["source"]), (3, "memory"))
            self.assertEqual(got["digest"], got["expected"])
            self.assertEqual(got["alone"], 3 + rank)
            self.assertEqual(got["lacking"], "load: step 4 is not held by every rank "
                                             "(not by rank(s) 0; this rank holds "
                                             f"{'2, 3' if rank == 0 else '3, 4'})")
            self.assertEqual(got["apart"], "load: no step is held by every rank, so none can "
                                           "resume in step with the others; rank 0: 7, 8; "
                                           "rank 1: 1, 2")

    def test_a_node_lost_restores_its_ranks_from_the_peer_node(self):
        steps = 150

        def node(name, *flags, out=self.out, nproc=2):
            env = dict(os.environ, MODE="train", OUT=out, STEPS=str(steps),
                       PYTHON_EXEC="/usr/bin/python3", PYTHONPATH=os.path.abspath(PYTHON))
            with open(os.path.join(self.top, name + ".log"), "w") as log:
                return subprocess.Popen(
                    [TIDERUN, f"--nproc-per-node={nproc}", "--checkpoint-memory=64M",
                     "--max-restarts=2", "--monitor-interval=0.05", *flags, WORKER],
                    env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        # Uninterrupted, on one node: the weights to end with.
        whole = tempfile.mkdtemp(dir=self.top)
        ref = node("whole", "--standalone", out=whole, nproc=4)
        self.assertEqual(ref.wait(timeout=300), 0, self.log("whole"))

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        common = ("--nnodes=2", "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                  "--rdzv-id=peercopy", "--local-addr=127.0.0.1",
                  "--rdzv-conf=join_timeout=120,last_call_timeout=1,keep_alive_interval=1,"
                  "keep_alive_max_attempt=3")
        a = node("a", *common[:-1], common[-1] + ",is_host=true")
        b = node("b", *common[:-1], common[-1] + ",is_host=false")
        procs = [a, b]
        try:
            progress = os.path.join(self.out, "progress.2")
            while not (os.path.exists(progress) and saved(progress) >= 40):
                self.assertIsNone(a.poll(), self.log("a"))
                self.assertIsNone(b.poll(), self.log("b"))
                time.sleep(0.05)
            os.killpg(b.pid, signal.SIGKILL)  # the node, with its agent's memory
            b.wait()
            lost_at = saved(progress)
            c = node("c", *common[:-1], common[-1] + ",is_host=false")
            procs.append(c)
            self.assertEqual(a.wait(timeout=300), 0, self.log("a"))
            self.assertEqual(c.wait(timeout=300), 0, self.log("c"))
        finally:
            for p in procs:
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()

        def result(out, rank):
            (path,) = glob.glob(os.path.join(out, f"train.{rank}.*.json"))
            with open(path) as f:
                return json.load(f)

        starts = {result(self.out, r)["start"] for r in range(4)}
        self.assertEqual(len(starts), 1, "every rank goes on from one step")
        self.assertGreaterEqual(starts.pop(), lost_at - 1)
        # The new node's ranks come from the survivor over the network; the
        # survivor's from its memory, or from the copies it keeps for its
        # peer (when a round gave it the lost node's ranks).
        (new,) = [tuple(map(int, m)) for m in re.findall(
            r"started 2 workers \(attempt \d+, ranks (\d)-(\d) of 4", self.log("c"))]
        for r in range(4):
            self.assertIn(result(self.out, r)["source"],
                          ["peer"] if new[0] <= r <= new[1] else ["memory", "peer"], r)
        for r in range(new[0], new[1] + 1):
            self.assertRegex(self.log("c"), rf"rank {r}: snapshots of steps \d+.* from node")
        for r in range(4):
            self.assertEqual(result(self.out, r)["weights"], result(whole, r)["weights"])

    def test_a_lost_node_whose_ranks_move_is_restored_from_the_copies_kept(self):
        # Node 0 (ranks 0-1) lost for good: the other node goes on alone in a
        # round of one (--nnodes=1:2, the store outside both), where its
        # ranks become 0-1; it loads them from the copies it kept for node
        # 0, and the ranks of its own (2-3) no longer exist.
        store = subprocess.Popen([os.path.join(os.path.dirname(TIDERUN), "tide-store"),
                                  "--port", "0"], stdout=subprocess.PIPE, text=True)
        port = int(store.stdout.readline().rsplit(":", 1)[1])
        env = dict(os.environ, MODE="train", OUT=self.out, STEPS="150",
                   PYTHON_EXEC="/usr/bin/python3", PYTHONPATH=os.path.abspath(PYTHON))

        def node(name):
            with open(os.path.join(self.top, name + ".log"), "w") as log:
                return subprocess.Popen(
                    [TIDERUN, "--nproc-per-node=2", "--checkpoint-memory=64M",
                     "--max-restarts=2", "--monitor-interval=0.05", "--nnodes=1:2",
                     "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{port}",
                     "--rdzv-id=moved", "--local-addr=127.0.0.1",
                     "--rdzv-conf=join_timeout=120,last_call_timeout=1,keep_alive_interval=1,"
                     "keep_alive_max_attempt=3,is_host=false", WORKER],
                    env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

        procs = {"a": node("a"), "b": node("b")}
        try:
            progress = os.path.join(self.out, "progress.0")
            while not (os.path.exists(progress) and saved(progress) >= 40):
                for name, p in procs.items():
                    self.assertIsNone(p.poll(), self.log(name))
                time.sleep(0.05)
            (lost,) = [n for n in procs if "ranks 0-1 of 4" in self.log(n, whole=True)]
            (survivor,) = [n for n in procs if n != lost]
            os.killpg(procs[lost].pid, signal.SIGKILL)  # the node, with its memory
            procs[lost].wait()
            lost_at = saved(progress)
            self.assertEqual(procs[survivor].wait(timeout=300), 0, self.log(survivor))
        finally:
            for p in procs.values():
                if p.poll() is None:
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            store.kill()
            store.communicate()
            # The lost agent's region, which only a later tiderun would remove.
            for path in glob.glob(f"/dev/shm/tide-checkpoint-{procs[lost].pid}-*"):
                os.unlink(path)

        self.assertIn("ranks 0-1 of 2", self.log(survivor, whole=True))
        results = []
        for rank in (0, 1):
            (path,) = glob.glob(os.path.join(self.out, f"train.{rank}.*.json"))
            with open(path) as f:
                results.append(json.load(f))
        self.assertEqual(results[0]["start"], results[1]["start"], "one step for both ranks")
        self.assertGreaterEqual(results[0]["start"], lost_at - 1)
        self.assertEqual([r["source"] for r in results], ["peer", "peer"])

    def log(self, name, whole=False):
        with open(os.path.join(self.top, name + ".log")) as f:
            text = f.read()
        return text if whole else text[-4000:]

    @unittest.skipUnless(TORCH_WORKER, "no libtorch worker (TIDE_CHECKPOINT_TORCH_WORKER)")
    def test_a_libtorch_program_is_restored_and_shares_snapshots_with_python(self):
        env = dict(os.environ, OUT=self.out, PYTHONPATH=os.path.abspath(PYTHON))
        common = [TIDERUN, "--standalone", "--nproc-per-node=2", "--checkpoint-memory=64M",
                  "--no-python"]
        r = subprocess.run([*common, "--max-restarts=1", TORCH_WORKER, "dies"], env=env,
                           capture_output=True, text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        for rank in (0, 1):
            self.assertIn(f"rank {rank}: step 4 from memory, bit for bit", r.stdout)
        # C++ saves, Python loads and saves, C++ loads: one worker, one region.
        interop = os.path.join(HERE, "checkpoint", "interop.py")
        script = (f"{TORCH_WORKER} save 7 && /usr/bin/python3 {interop} check 7 && "
                  f"/usr/bin/python3 {interop} save 8 && {TORCH_WORKER} check 8")
        r = subprocess.run([*common, "sh", "-c", script], env=env, capture_output=True,
                           text=True, timeout=300)
        self.assertEqual(r.returncode, 0, r.stderr[-3000:])
        for rank in (0, 1):
            self.assertIn(f"rank {rank}: Python read step 7 of C++, bit for bit", r.stdout)
            self.assertIn(f"rank {rank}: step 8 from memory, bit for bit", r.stdout)

    def test_outside_tide_save_says_how_to_get_memory(self):
        env = dict(os.environ, PYTHONPATH=os.path.abspath(PYTHON))
        env.pop("TIDE_CHECKPOINT_REGION", None)
        r = subprocess.run(["/usr/bin/python3", "-c",
                            "import tide.checkpoint as c, torch\n"
                            "assert not c.available()\n"
                            "c.save({'w': torch.zeros(1)}, step=0)"],
                           env=env, capture_output=True, text=True, timeout=120)
        self.assertNotEqual(r.returncode, 0)
        self.assertIn("run the script under tiderun --checkpoint-memory SIZE", r.stderr)


if __name__ == "__main__":
    unittest.main()
