#!/usr/bin/python3
"""tide.elastic with real processes: LocalElasticAgent running function and
program entrypoints on tide's C++ agent (return values, failures with error
files and tracebacks, restarts, a killed worker, a killed launcher), rendezvous
handlers written in Python (rounds, closed, failing, raising), torch 1.13's
and torch >= 2.3's signatures (LogsSpecs), metric and
event handlers written in Python (receiving the agent's, raising), and
expiration timers (a worker stuck inside expires() is reaped and the group
retried; torch's FileTimerClient against tide's FileTimerServer).

    PYTHONPATH=build/python /usr/bin/python3 tests/elastic_py/agent_test.py
"""
import multiprocessing
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

from tide.elastic import events, metrics, timer
from tide.elastic.agent.server import LocalElasticAgent, WorkerSpec, WorkerState
from tide.elastic.multiprocessing import DefaultLogsSpecs, Std
from tide.elastic.multiprocessing.api import SignalException
from tide.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousError,
    RendezvousHandler,
    RendezvousParameters,
)
from tide.elastic.rendezvous.registry import get_rendezvous_handler
from tide.elastic.store import HashStore

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
from procs import DEADLINE, alive, wait_until  # noqa: E402



def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def c10d(run_id="test"):
    return get_rendezvous_handler(RendezvousParameters(
        backend="c10d", endpoint=f"127.0.0.1:{free_port()}", run_id=run_id,
        min_nodes=1, max_nodes=1))


def run(entrypoint, args=(), n=2, max_restarts=0, handler=None, **kw):
    spec = WorkerSpec(role="trainer", local_world_size=n, entrypoint=entrypoint, args=args,
                      rdzv_handler=handler or c10d(), max_restarts=max_restarts,
                      monitor_interval=0.1, **kw)
    agent = LocalElasticAgent(spec, start_method="spawn")
    return agent, agent.run()


def read_int(path):
    with open(path) as f:
        return int(f.read())


# ---- worker functions (workers import this file as __mp_main__) ----

def rank_plus(offset):
    return int(os.environ["RANK"]) + offset


def environment():
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RUN_ID", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_ERROR_FILE")
    return {k: os.environ.get(k) for k in keys}


def raises_on_rank_one():
    if os.environ["RANK"] == "1":
        raise ValueError("bad value on rank 1")
    return "fine"


def records_attempt_then_fails(directory):
    with open(os.path.join(directory, f"rank{os.environ['RANK']}"), "a") as f:
        f.write(os.environ["TORCHELASTIC_RESTART_COUNT"] + "\n")
    sys.exit(2)


def kills_itself_on_rank_zero():
    if os.environ["RANK"] == "0":
        os.kill(os.getpid(), signal.SIGKILL)


def saves_then_dies_then_loads(directory):
    """Attempt 0 saves steps 0-4 in the agent's memory and rank 1 dies once
    rank 0 has saved too; attempt 1 returns what it loads back."""
    import torch
    import tide.checkpoint as ck

    rank = int(os.environ["RANK"])
    if os.environ["TORCHELASTIC_RESTART_COUNT"] == "0":
        for step in range(5):
            ck.save({"w": torch.full((3,), float(10 * rank + step))}, step=step)
        open(os.path.join(directory, f"saved{rank}"), "w").close()
        if rank == 1:
            while not os.path.exists(os.path.join(directory, "saved0")):
                time.sleep(0.01)
            os.kill(os.getpid(), signal.SIGKILL)
        time.sleep(60)  # stopped by the agent
    loaded = ck.load()
    return loaded.step, loaded.source, loaded.state["w"].tolist()


def writes_pid_then_hangs(directory):
    path = os.path.join(directory, f"pid{os.environ['RANK']}")
    with open(path + ".tmp", "w") as f:
        f.write(str(os.getpid()))
    os.rename(path + ".tmp", path)
    time.sleep(600)  # held until the launcher dies


def stuck_in_expires(queue):
    timer.configure(timer.LocalTimerClient(queue))
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    # 3 s: room for the steps that are not stuck on a loaded machine.
    with timer.expires(after=3):
        if attempt == 0 and os.environ["RANK"] == "1":
            time.sleep(600)  # stuck: the server must reclaim it
    return attempt


def stuck_with_torchs_file_client(path):
    from torch.distributed.elastic.timer import FileTimerClient
    from torch.distributed.elastic.timer import configure, expires
    configure(FileTimerClient(path))
    attempt = int(os.environ["TORCHELASTIC_RESTART_COUNT"])
    # 3 s: room for the steps that are not stuck on a loaded machine.
    with expires(after=3):
        if attempt == 0 and os.environ["RANK"] == "0":
            time.sleep(600)
    return attempt


# ---- a rendezvous handler written in Python ----

class PythonHandler(RendezvousHandler):
    """One node; `mode` says how next_rendezvous behaves."""

    def __init__(self, mode="ok"):
        self.mode = mode
        self.store = HashStore()
        self.rounds = 0
        self.polls = 0
        self.closed = False

    def get_backend(self):
        return "python"

    def next_rendezvous(self):
        if self.mode == "closed":
            raise RendezvousClosedError("the job is over")
        if self.mode == "fails":
            raise RendezvousError("round 7 collapsed")
        if self.mode == "raises":
            raise KeyError("no such node")
        self.rounds += 1
        return self.store, 0, 1

    def is_closed(self):
        return self.closed

    def set_closed(self):
        self.closed = True

    def num_nodes_waiting(self):
        self.polls += 1
        return 0

    def get_run_id(self):
        return "python-run"

    def shutdown(self):
        return True


class DictStore:
    """A store in plain Python with torch.distributed.Store's methods."""

    def __init__(self):
        self.data = {}
        self.calls = set()

    def _bytes(self, v):
        return v if isinstance(v, bytes) else v.encode()

    def set(self, key, value):
        self.calls.add("set")
        self.data[key] = self._bytes(value)

    def get(self, key):
        self.calls.add("get")
        return self.data[key]

    def add(self, key, amount):
        self.calls.add("add")
        value = int(self.data.get(key, b"0")) + amount
        self.data[key] = str(value).encode()
        return value

    def compare_set(self, key, expected, desired):
        self.calls.add("compare_set")
        current = self.data.get(key)
        if (current is None and not expected) or current == self._bytes(expected):
            self.data[key] = self._bytes(desired)
        return self.data.get(key, self._bytes(expected))

    def check(self, keys):
        return all(k in self.data for k in keys)

    def wait(self, keys, timeout=None):
        self.calls.add("wait")
        if not self.check(keys):
            raise RuntimeError(f"Socket Timeout: waiting for {keys}")

    def delete_key(self, key):
        return self.data.pop(key, None) is not None

    def num_keys(self):
        return len(self.data)


class DictStoreHandler(PythonHandler):
    def __init__(self):
        super().__init__()
        self.store = DictStore()


class TorchStoreHandler(PythonHandler):
    """Node `rank` of `world`, meeting in torch's own TCPStore."""

    def __init__(self, rank, world, port):
        super().__init__()
        import torch.distributed as dist
        self.dist = dist
        self.rank, self.world = rank, world
        sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "support"))
        from torch_facts import store_kwargs
        self.tcp = dist.TCPStore("127.0.0.1", port, world, rank == 0, **store_kwargs())

    def next_rendezvous(self):
        self.rounds += 1
        return self.dist.PrefixStore(f"round{self.rounds}", self.tcp), self.rank, self.world


class Raising(metrics.MetricHandler, events.EventHandler):
    def __init__(self):
        self.calls = 0

    def emit(self, metric_data):
        self.calls += 1
        raise RuntimeError("metric sink down")

    def record(self, event):
        self.calls += 1
        raise RuntimeError("event sink down")


class Collecting(metrics.MetricHandler, events.EventHandler):
    def __init__(self):
        self.metrics, self.events = [], []

    def emit(self, metric_data):
        self.metrics.append(metric_data)

    def record(self, event):
        self.events.append(event)


class AgentTest(unittest.TestCase):
    def tearDown(self):
        metrics.configure(metrics.NullMetricHandler())
        events.configure(None)

    def test_function_return_values_by_global_rank(self):
        agent, result = run(rank_plus, args=(10,), n=3)
        self.assertEqual(result.state, WorkerState.SUCCEEDED)
        self.assertFalse(result.is_failed())
        self.assertEqual(result.return_values, {0: 10, 1: 11, 2: 12})
        group = agent.get_worker_group()
        self.assertEqual([w.global_rank for w in group.workers], [0, 1, 2])
        self.assertEqual(group.state, WorkerState.SUCCEEDED)

    def test_the_static_backend(self):
        handler = get_rendezvous_handler(RendezvousParameters(
            backend="static", endpoint=f"127.0.0.1:{free_port()}", run_id="static-run",
            min_nodes=1, max_nodes=1, rank=0))
        self.assertEqual(handler.get_backend(), "static")
        _, result = run(environment, n=2, handler=handler)
        self.assertEqual(result.return_values[1]["TORCHELASTIC_RUN_ID"], "static-run")

    def test_an_unknown_backend_names_the_registered_ones(self):
        with self.assertRaisesRegex(ValueError, "c10d, etcd, etcd-v2, static"):
            get_rendezvous_handler(RendezvousParameters(
                backend="nope", endpoint="", run_id="x", min_nodes=1, max_nodes=1))

    def test_workers_get_torchruns_environment(self):
        _, result = run(environment, n=2)
        env = result.return_values
        self.assertEqual([env[r]["RANK"] for r in (0, 1)], ["0", "1"])
        self.assertEqual(env[1]["WORLD_SIZE"], "2")
        self.assertEqual(env[0]["TORCHELASTIC_RUN_ID"], "test")
        self.assertEqual(env[0]["TORCHELASTIC_RESTART_COUNT"], "0")
        self.assertTrue(env[0]["MASTER_PORT"].isdigit())
        self.assertNotEqual(env[0]["TORCHELASTIC_ERROR_FILE"], env[1]["TORCHELASTIC_ERROR_FILE"])

    def test_an_exception_is_a_failure_with_error_file_and_traceback(self):
        _, result = run(raises_on_rank_one, n=2)
        self.assertTrue(result.is_failed())
        self.assertEqual(list(result.failures), [1])
        f = result.failures[1]
        self.assertEqual((f.local_rank, f.exitcode), (1, 1))
        self.assertTrue(os.path.isfile(f.error_file))
        self.assertEqual(f.message["message"], "ValueError: bad value on rank 1")
        self.assertIn("raises_on_rank_one", f.message["extraInfo"]["py_callstack"])
        self.assertEqual(f.error_file_data["message"], f.message)
        self.assertEqual(f.signal_name(), "<N/A>")

    def test_restarts_up_to_max_restarts_then_fails(self):
        with tempfile.TemporaryDirectory() as d:
            # One worker: with more, the first to fail has the others
            # stopped, perhaps before they wrote.
            _, result = run(records_attempt_then_fails, args=(d,), n=1, max_restarts=2)
            self.assertTrue(result.is_failed())
            self.assertEqual(result.failures[0].exitcode, 2)
            with open(os.path.join(d, "rank0")) as f:
                self.assertEqual(f.read().split(), ["0", "1", "2"])

    def test_a_sigkilled_worker(self):
        _, result = run(kills_itself_on_rank_zero, n=2)
        self.assertTrue(result.is_failed())
        f = result.failures[0]
        self.assertEqual(f.exitcode, -signal.SIGKILL)
        self.assertEqual(f.signal_name(), "SIGKILL")
        self.assertEqual(f.message, f"Signal 9 (SIGKILL) received by PID {f.pid}")

    def test_checkpoints_in_memory_from_tiderun_variables(self):
        os.environ["PET_CHECKPOINT_MEMORY"] = "16M"
        try:
            with tempfile.TemporaryDirectory() as d:
                _, result = run(saves_then_dies_then_loads, args=(d,), n=2, max_restarts=1)
        finally:
            del os.environ["PET_CHECKPOINT_MEMORY"]
        self.assertEqual(result.state, WorkerState.SUCCEEDED)
        self.assertEqual(result.return_values, {0: (4, "memory", [4.0] * 3),
                                                1: (4, "memory", [14.0] * 3)})
        os.environ["PET_CHECKPOINT_DIR"] = "/tmp/unused"
        try:
            with self.assertRaisesRegex(ValueError, "set PET_CHECKPOINT_MEMORY too"):
                run(rank_plus, args=(0,), n=1)
        finally:
            del os.environ["PET_CHECKPOINT_DIR"]

    def test_a_program_entrypoint_with_local_rank_in_its_arguments(self):
        check = "import os, sys; sys.exit(0 if os.environ['LOCAL_RANK'] == sys.argv[1] else 5)"
        _, result = run(sys.executable, args=("-c", check, "${local_rank}"), n=2)
        self.assertEqual(result.state, WorkerState.SUCCEEDED)
        self.assertEqual(result.return_values, {})

    def test_a_failing_program_entrypoint(self):
        _, result = run(sys.executable, args=("-c", "import sys; sys.exit(4)"), n=1)
        self.assertEqual(result.failures[0].exitcode, 4)

    def test_fork_is_refused_with_the_alternative(self):
        spec = WorkerSpec(role="trainer", local_world_size=1, entrypoint=rank_plus,
                          args=(0,), rdzv_handler=PythonHandler())
        with self.assertRaisesRegex(ValueError, "start_method='spawn'"):
            LocalElasticAgent(spec, start_method="fork")

    def test_torch_2_3s_signature_with_default_logs_specs(self):
        printer = "import os; print('out of', os.environ['LOCAL_RANK'])"
        with tempfile.TemporaryDirectory() as d:
            spec = WorkerSpec(role="trainer", local_world_size=2, entrypoint=sys.executable,
                              args=("-c", printer), rdzv_handler=c10d(), max_restarts=0,
                              monitor_interval=0.1)
            logs = DefaultLogsSpecs(log_dir=os.path.join(d, "logs"), redirects=Std.OUT)
            agent = LocalElasticAgent(spec, logs, "spawn", 30)  # torch >= 2.3's order
            self.assertEqual(agent.run().state, WorkerState.SUCCEEDED)
            self.assertEqual(os.path.dirname(agent.run_log_dir), os.path.join(d, "logs"))
            for rank in (0, 1):
                path = os.path.join(agent.run_log_dir, "attempt_0", str(rank), "stdout.log")
                with open(path) as f:
                    self.assertEqual(f.read(), f"out of {rank}\n")

    def test_torch_2_3s_local_ranks_filter_and_line_prefix_reach_the_console(self):
        launcher = (
            "import sys\n"
            "from tide.elastic.agent.server import LocalElasticAgent, WorkerSpec\n"
            "from tide.elastic.multiprocessing import DefaultLogsSpecs, Std\n"
            "from tide.elastic.rendezvous import RendezvousParameters\n"
            "from tide.elastic.rendezvous.registry import get_rendezvous_handler\n"
            "handler = get_rendezvous_handler(RendezvousParameters(backend='c10d',\n"
            f"    endpoint='127.0.0.1:{free_port()}', run_id='logs', min_nodes=1, max_nodes=1))\n"
            "spec = WorkerSpec(role='trainer', local_world_size=2, entrypoint=sys.executable,\n"
            "    args=('-c', 'import os; print(\"line of\", os.environ[\"LOCAL_RANK\"])'),\n"
            "    rdzv_handler=handler, max_restarts=0, monitor_interval=0.1)\n"
            "logs = DefaultLogsSpecs(tee=Std.OUT, local_ranks_filter={1})\n"
            "agent = LocalElasticAgent(spec, logs_specs=logs,\n"
            "    log_line_prefix_template='<${role_name}:${local_rank}> ')\n"
            "sys.exit(agent.run().is_failed())\n")
        out = subprocess.run([sys.executable, "-c", launcher], stdout=subprocess.PIPE,
                             text=True, timeout=DEADLINE, check=True).stdout
        self.assertIn("<trainer:1> line of 1\n", out)
        self.assertNotIn("line of 0", out)

    def test_the_two_signatures_refuse_what_they_cannot_both_mean(self):
        spec = WorkerSpec(role="trainer", local_world_size=1, entrypoint=rank_plus,
                          args=(0,), rdzv_handler=PythonHandler())
        with tempfile.TemporaryDirectory() as d:
            logs = DefaultLogsSpecs(log_dir=d)
            with self.assertRaisesRegex(TypeError, "log_dir .* or logs_specs"):
                LocalElasticAgent(spec, logs, log_dir=d)
            with self.assertRaisesRegex(TypeError, "multiple values for argument 'start_method'"):
                LocalElasticAgent(spec, logs, "spawn", start_method="spawn")
            with self.assertRaisesRegex(TypeError, "at most 5 positional"):
                LocalElasticAgent(spec, logs, "spawn", 30, None, "extra")
            teeing = WorkerSpec(role="trainer", local_world_size=1, entrypoint=rank_plus,
                                args=(0,), rdzv_handler=PythonHandler(), tee=Std.ALL)
            with self.assertRaisesRegex(ValueError, "set them in one place"):
                LocalElasticAgent(teeing, logs)
            # torch 1.13's order is still read as such.
            LocalElasticAgent(spec, "spawn", 30, d)

    def test_a_queue_no_timer_server_knows_is_refused(self):
        queue = multiprocessing.get_context("spawn").Queue()
        with self.assertRaisesRegex(TypeError, "LocalTimerServer"):
            run(rank_plus, args=(queue,), n=1)

    def test_killing_the_launcher_leaves_no_worker(self):
        with tempfile.TemporaryDirectory() as d:
            launcher = subprocess.Popen([sys.executable, __file__, "--launch-and-hang", d])
            try:
                paths = [os.path.join(d, f"pid{r}") for r in (0, 1)]
                wait_until(lambda: all(os.path.exists(p) for p in paths), "workers started")
                pids = [read_int(p) for p in paths]
                launcher.kill()
                launcher.wait()
                wait_until(lambda: not any(alive(p) for p in pids), "workers gone")
            finally:
                launcher.kill()
                launcher.wait()

    def test_sigterm_stops_the_workers_and_raises_signal_exception(self):
        with tempfile.TemporaryDirectory() as d:
            out = os.path.join(d, "out")
            launcher = subprocess.Popen([sys.executable, __file__, "--launch-and-hang", d, out])
            try:
                paths = [os.path.join(d, f"pid{r}") for r in (0, 1)]
                wait_until(lambda: all(os.path.exists(p) for p in paths), "workers started")
                pids = [read_int(p) for p in paths]
                launcher.send_signal(signal.SIGTERM)
                self.assertEqual(launcher.wait(timeout=DEADLINE), 0)
                self.assertFalse(any(alive(p) for p in pids))
                with open(out) as f:
                    self.assertEqual(f.read(), "SignalException SIGTERM")
            finally:
                launcher.kill()
                launcher.wait()

    def test_a_python_rendezvous_handler_drives_the_rounds(self):
        handler = PythonHandler()
        with tempfile.TemporaryDirectory() as d:
            _, result = run(records_attempt_then_fails, args=(d,), n=1, max_restarts=1,
                            handler=handler)
        self.assertTrue(result.is_failed())
        self.assertEqual(handler.rounds, 2)
        _, result = run(environment, n=1, handler=handler)
        env = result.return_values[0]
        self.assertEqual(env["TORCHELASTIC_RUN_ID"], "python-run")
        self.assertEqual(handler.store.get("torchelastic/round0/MASTER_PORT").decode(),
                         env["MASTER_PORT"])

    def test_a_python_handlers_store_in_plain_python(self):
        handler = DictStoreHandler()
        _, result = run(environment, n=2, handler=handler)
        self.assertEqual(result.return_values[1]["MASTER_PORT"],
                         handler.store.data["torchelastic/round0/MASTER_PORT"].decode())
        self.assertTrue({"set", "get"} <= handler.store.calls, handler.store.calls)

    def test_two_nodes_meet_through_a_python_handler_on_torchs_store(self):
        port = free_port()
        nodes = [subprocess.Popen([sys.executable, __file__, "--torch-store-node", str(r),
                                   str(port)], stdout=subprocess.PIPE, text=True)
                 for r in (0, 1)]
        outs = [n.communicate(timeout=120)[0] for n in nodes]
        self.assertEqual([n.returncode for n in nodes], [0, 0], outs)
        self.assertEqual(outs[0].strip(), "{0: '0/4', 1: '1/4'}")
        self.assertEqual(outs[1].strip(), "{2: '2/4', 3: '3/4'}")

    def test_a_python_handler_that_is_closed_fails_or_raises(self):
        with self.assertRaisesRegex(RendezvousClosedError, "the job is over"):
            run(rank_plus, args=(0,), handler=PythonHandler("closed"))
        with self.assertRaisesRegex(RendezvousError, "round 7 collapsed"):
            run(rank_plus, args=(0,), handler=PythonHandler("fails"))
        with self.assertRaisesRegex(RendezvousError, "KeyError: 'no such node'"):
            run(rank_plus, args=(0,), handler=PythonHandler("raises"))

    def test_metric_and_event_handlers_receive_the_agents(self):
        sink = Collecting()
        metrics.configure(sink)
        events.configure(sink)
        run(rank_plus, args=(0,), n=2)
        names = {m.name for m in sink.metrics}
        self.assertIn("workers.trainer.run_success_no_retries", names)
        self.assertIn("workers.trainer.succeeded", names)
        self.assertEqual({m.group_name for m in sink.metrics}, {"torchelastic"})
        ended = [e for e in sink.events if e.name == "torchelastic.worker.status.SUCCEEDED"]
        self.assertEqual(sorted(e.metadata["global_rank"] for e in ended), [0, 1])
        self.assertEqual(ended[0].source, events.EventSource.AGENT)
        events.record(events.Event("mine", events.EventSource.WORKER, 5, {"k": 1.5}))
        self.assertEqual(sink.events[-1], events.Event("mine", events.EventSource.WORKER, 5,
                                                       {"k": 1.5}))

    def test_metric_and_event_handlers_that_raise_do_not_stop_the_agent(self):
        sink = Raising()
        metrics.configure(sink)
        events.configure(sink)
        _, result = run(rank_plus, args=(1,), n=2)
        self.assertEqual(result.return_values, {0: 1, 1: 2})
        self.assertGreater(sink.calls, 2)

    def test_a_worker_stuck_inside_expires_is_reaped_and_the_group_retried(self):
        queue = multiprocessing.get_context("spawn").Queue()
        server = timer.LocalTimerServer(queue, max_interval=0.01)
        server.start()
        try:
            _, result = run(stuck_in_expires, args=(queue,), n=2, max_restarts=1)
        finally:
            server.stop()
        self.assertEqual(result.return_values, {0: 1, 1: 1})

    def test_a_timer_server_signals_only_the_launchers_own_processes(self):
        # An expired timer of a process that is not this launcher's child (an
        # orphan: its parent exited) is refused; one of a child is enforced.
        # Requests are served in order: once the child is killed, the
        # orphan's earlier request has been seen.
        queue = timer.TimerQueue()
        server = timer.LocalTimerServer(queue, max_interval=0.01)
        server.start()
        arm = ("import sys, time; from tide.elastic import timer; "
               f"timer.LocalTimerClient(timer.TimerQueue({queue.path!r})).acquire('x', 1.0); "
               "print(flush=True); time.sleep(60)")
        with tempfile.TemporaryDirectory() as d:
            pid_file = os.path.join(d, "orphan")
            try:
                subprocess.run(["sh", "-c", f'{sys.executable} -c "{arm}" > {d}/armed & '
                                f'echo $! > {pid_file}.tmp; mv {pid_file}.tmp {pid_file}'],
                               check=True)
                wait_until(lambda: os.path.exists(pid_file), "the orphan started")
                orphan = read_int(pid_file)
                # The background shell opens `armed` after it has written
                # the pid: the file may not exist yet.
                armed = os.path.join(d, "armed")
                wait_until(lambda: os.path.exists(armed) and os.path.getsize(armed) > 0,
                           "the orphan armed")
                child = subprocess.Popen([sys.executable, "-c", arm],
                                         stdout=subprocess.DEVNULL)
                self.assertEqual(child.wait(timeout=DEADLINE), -signal.SIGKILL)
                self.assertTrue(alive(orphan), "the orphan's timer was enforced")
            finally:
                server.stop()
                if os.path.exists(pid_file):
                    os.kill(read_int(pid_file), signal.SIGKILL)

    def test_torchs_file_timer_client_against_tides_server(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "watchdog")
            server = timer.FileTimerServer(path, max_interval=0.01)
            server.start()
            try:
                _, result = run(stuck_with_torchs_file_client, args=(path,), n=2,
                                max_restarts=1)
            finally:
                server.stop()
        self.assertEqual(result.return_values, {0: 1, 1: 1})


def rank_of_world():
    return f"{os.environ['RANK']}/{os.environ['WORLD_SIZE']}"


def torch_store_node(rank, port):
    """A node of a two-node job whose Python handler meets on torch's TCPStore."""
    handler = TorchStoreHandler(int(rank), 2, int(port))
    _, result = run(rank_of_world, n=2, handler=handler)
    print(result.return_values if not result.is_failed() else result.failures)


def launch_and_hang(directory, out=None):
    """A launcher whose workers hang: killed or signalled by the tests."""
    try:
        run(writes_pid_then_hangs, args=(directory,), n=2)
    except SignalException as e:
        if out:
            with open(out, "w") as f:
                f.write(f"SignalException {e.sigval.name}")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--launch-and-hang"]:
        launch_and_hang(*sys.argv[2:])
    elif sys.argv[1:2] == ["--torch-store-node"]:
        torch_store_node(*sys.argv[2:])
    else:
        unittest.main()
