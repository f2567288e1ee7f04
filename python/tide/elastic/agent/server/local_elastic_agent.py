"""LocalElasticAgent, as torch.distributed.elastic.agent.server.local_elastic_agent,
on tide's C++ agent: the rendezvous, the workers' start, the watching (exits
are seen at once), the restarts, the exit barrier, error files and logs are
the C++ agent's; Python builds its spec and reads its result.

A function entrypoint runs in a fresh interpreter per worker, as torch's
"spawn": the launcher's __main__ module is imported there as __mp_main__ (so
functions defined in it work, and its `if __name__ == "__main__":` block does
not run again), then the function is called with its arguments under
@record. Its return value comes back in RunResult.return_values."""
import multiprocessing.queues
import multiprocessing.spawn
import os
import pickle
import shutil
import signal
import sys
import tempfile
import threading
import warnings
from typing import Any, Dict, List, Optional

import tide
from tide import _elastic
from tide.elastic.agent.server.api import (
    DEFAULT_ROLE,
    ElasticAgent,
    RunResult,
    Worker,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
)
from tide.elastic.multiprocessing.api import SignalException, Std
from tide.elastic.multiprocessing.errors import ProcessFailure
from tide.elastic.timer.local_timer import TimerQueue, timer_queue_of

TORCHELASTIC_ENABLE_FILE_TIMER = "TORCHELASTIC_ENABLE_FILE_TIMER"
TORCHELASTIC_TIMER_FILE = "TORCHELASTIC_TIMER_FILE"

_QUEUE_TYPES = (multiprocessing.queues.Queue, multiprocessing.queues.SimpleQueue)


class _ArgsPickler(pickle.Pickler):
    """Pickles a function entrypoint and its arguments for the workers. A
    multiprocessing queue cannot cross into them; one given to a
    LocalTimerServer crosses as the server's TimerQueue."""

    def reducer_override(self, obj: Any):
        if isinstance(obj, _QUEUE_TYPES):
            queue = timer_queue_of(obj)
            if queue is None:
                raise TypeError(
                    "a multiprocessing queue cannot be passed to tide's workers (tide's agent "
                    "starts them, not multiprocessing); for timers, give it to "
                    "tide.elastic.timer.LocalTimerServer first or pass a "
                    "tide.elastic.timer.TimerQueue; for anything else use a store or a file")
            return TimerQueue, (queue.path,)
        return NotImplemented


class LocalElasticAgent(ElasticAgent):
    """Runs one node's workers of `spec` on tide's agent.

    Both torch's signatures:
      torch 1.13:   LocalElasticAgent(spec, start_method="spawn",
                                      exit_barrier_timeout=300, log_dir=None)
      torch >= 2.3: LocalElasticAgent(spec, logs_specs, start_method="spawn",
                                      exit_barrier_timeout=300,
                                      log_line_prefix_template=None)
    (a LogsSpecs in second place, or logs_specs= by name, is the 2.3 form).

    start_method: "spawn" only (workers are fresh interpreters; torch's "fork"
    and "forkserver" would run workers from a copy of the launcher, which
    tide's agent does not). exit_barrier_timeout: seconds a finished node
    waits for the others. log_dir, or logs_specs' root_log_dir: where the
    run's logs and error files go (default: a new directory under $TMPDIR).
    logs_specs also gives the streams (redirects, tee) and local_ranks_filter,
    which torch 1.13 read from WorkerSpec. log_line_prefix_template: the
    prefix of each tee'd line, with ${role_name}, ${rank} and ${local_rank}
    (default "[<role><local_rank>]:")."""

    _TORCH_1_13_ORDER = ("start_method", "exit_barrier_timeout", "log_dir")
    _TORCH_2_3_ORDER = ("logs_specs", "start_method", "exit_barrier_timeout",
                        "log_line_prefix_template")

    def __init__(self, spec: WorkerSpec, *args: Any, **kwargs: Any) -> None:
        order = self._TORCH_1_13_ORDER
        if args and not isinstance(args[0], str):
            order = self._TORCH_2_3_ORDER
        if len(args) > len(order):
            raise TypeError(f"LocalElasticAgent() takes at most {len(order) + 1} positional "
                            f"arguments ({len(args) + 1} given)")
        for name, value in zip(order, args):
            if name in kwargs:
                raise TypeError(f"LocalElasticAgent() got multiple values for argument {name!r}")
            kwargs[name] = value
        self._init(spec, **kwargs)

    def _init(self, spec: WorkerSpec, start_method: str = "spawn",
              exit_barrier_timeout: float = 300, log_dir: Optional[str] = None,
              logs_specs: Any = None, log_line_prefix_template: Optional[str] = None) -> None:
        if start_method != "spawn":
            raise ValueError(
                f"start_method={start_method!r}: tide's agent starts each worker as a fresh "
                "interpreter, as 'spawn' does; use start_method='spawn' (the function must "
                "be importable, or defined in the launcher's __main__ module)")
        self._spec = spec
        self._exit_barrier_timeout = exit_barrier_timeout
        self._redirects, self._tee, self._local_ranks_filter = spec.redirects, spec.tee, None
        if logs_specs is not None:
            if log_dir is not None:
                raise TypeError("give log_dir (torch 1.13) or logs_specs (torch >= 2.3), "
                                "not both")
            if spec.redirects != Std.NONE or spec.tee != Std.NONE:
                raise ValueError(
                    "redirects/tee are set both in WorkerSpec (torch 1.13) and by "
                    "logs_specs (torch >= 2.3); set them in one place")
            root = logs_specs.root_log_dir  # "None" when a LogsSpecs has none
            log_dir = root if root and root != "None" else None
            self._redirects = getattr(logs_specs, "_redirects", Std.NONE)
            self._tee = getattr(logs_specs, "_tee", Std.NONE)
            self._local_ranks_filter = getattr(logs_specs, "_local_ranks_filter", None)
            if type(logs_specs).__name__ != "DefaultLogsSpecs":
                warnings.warn(
                    f"{type(logs_specs).__name__}: tide's agent reads its log_dir, redirects, "
                    "tee and local_ranks_filter and lays the files out as DefaultLogsSpecs "
                    "does; its reify() is not called")
        self._log_dir = log_dir or ""
        self._log_line_prefix_template = log_line_prefix_template or ""
        self._worker_group = WorkerGroup(spec)
        self._native = None
        self._run_log_dir = ""

    def get_worker_group(self, role: str = DEFAULT_ROLE) -> WorkerGroup:
        return self._worker_group

    @property
    def run_log_dir(self) -> str:
        """This run's directory of logs and error files, once run() started."""
        return self._run_log_dir

    def run(self, role: str = DEFAULT_ROLE) -> RunResult:
        spec = self._spec
        workdir = tempfile.mkdtemp(prefix="tide_elastic_")
        try:
            native_spec = {
                "role": spec.role,
                "local_world_size": spec.local_world_size,
                "argv": self._argv(workdir),
                "env": self._env(),
                "rdzv_handler": spec.rdzv_handler,
                "max_restarts": spec.max_restarts,
                "monitor_interval": float(spec.monitor_interval),
                "redirects": _std(self._redirects),
                "tee": _std(self._tee),
                "local_ranks_filter": sorted(self._local_ranks_filter or ()),
                "log_line_prefix_template": self._log_line_prefix_template,
                "log_dir": self._log_dir,
                "master_addr": spec.master_addr,
                "master_port": spec.master_port,
                "exit_barrier_timeout": float(self._exit_barrier_timeout),
                "timer_file": _file_timer(),
                # In-memory checkpoints (docs/checkpoints.md): tiderun's
                # variables, read from the launcher's environment.
                "checkpoint_memory": os.environ.get("PET_CHECKPOINT_MEMORY", ""),
                "checkpoint_dir": os.environ.get("PET_CHECKPOINT_DIR", ""),
                "checkpoint_keep": int(os.environ.get("PET_CHECKPOINT_KEEP", "2")),
                "python": sys.executable,
            }
            self._native = _elastic.Agent(native_spec)
            out = self._native.run(
                handle_signals=threading.current_thread() is threading.main_thread())
            self._run_log_dir = self._native.run_log_dir()
            self._sync_group(out["group"])
            sig = out["stopped_by_signal"]
            if sig:
                raise SignalException(f"Process {os.getpid()} got signal: {sig}",
                                      sigval=signal.Signals(sig))
            state = WorkerState(out["state"])
            if state == WorkerState.FAILED:
                return RunResult(state, failures={
                    int(rank): _failure(f) for rank, f in out["failures"].items()})
            return RunResult(state, return_values=self._return_values(workdir))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)

    def _argv(self, workdir: str) -> List[str]:
        spec = self._spec
        bootstrap = [sys.executable, "-u", "-m", "tide.elastic._worker"]
        if isinstance(spec.entrypoint, str):
            args = [str(a) for a in spec.args]
            if any("${local_rank}" in a for a in args):
                return bootstrap + ["--exec", spec.entrypoint] + args
            return [spec.entrypoint] + args
        payload = os.path.join(workdir, "payload.pkl")
        preparation = multiprocessing.spawn.get_preparation_data("tide-worker")
        preparation["authkey"] = bytes(preparation["authkey"])  # plain bytes pickle
        with open(payload, "wb") as f:
            pickle.dump((preparation, _dumps((spec.entrypoint, tuple(spec.args)))), f)
        return bootstrap + [payload]

    def _env(self) -> Dict[str, str]:
        # The workers import tide.elastic._worker from where this tide is.
        root = os.path.dirname(os.path.dirname(os.path.abspath(tide.__file__)))
        path = os.environ.get("PYTHONPATH", "")
        return {"PYTHONPATH": root + (os.pathsep + path if path else "")}

    def _return_values(self, workdir: str) -> Dict[int, Any]:
        if isinstance(self._spec.entrypoint, str):
            return {}
        out = {}
        for w in self._worker_group.workers:
            with open(os.path.join(workdir, f"return_{w.local_rank}.pkl"), "rb") as f:
                out[w.global_rank] = pickle.load(f)
        return out

    def _sync_group(self, g: Dict[str, Any]) -> None:
        group = self._worker_group
        group.workers = []
        for d in g["workers"]:
            w = Worker(d["local_rank"], d["global_rank"], d["role_rank"], d["world_size"],
                       d["role_world_size"])
            w.id = d["pid"] if d["pid"] > 0 else None
            group.workers.append(w)
        group.group_rank = g["group_rank"]
        group.group_world_size = g["group_world_size"]
        group.state = WorkerState(g["state"])
        group.store = g["store"]


def _dumps(obj: Any) -> bytes:
    import io
    buf = io.BytesIO()
    _ArgsPickler(buf, protocol=pickle.HIGHEST_PROTOCOL).dump(obj)
    return buf.getvalue()


def _std(value: Any):
    if isinstance(value, dict):
        return {int(k): int(v) for k, v in value.items()}
    return int(value)


def _file_timer():
    # torch's switch for a file timer server run by the agent.
    if os.environ.get(TORCHELASTIC_ENABLE_FILE_TIMER) != "1":
        return None
    return os.environ.get(TORCHELASTIC_TIMER_FILE, "")


def _failure(d: Dict[str, Any]) -> ProcessFailure:
    f = ProcessFailure(local_rank=d["local_rank"], pid=d["pid"], exitcode=d["exitcode"],
                       error_file=d["error_file"])
    if not os.path.isfile(d["error_file"]):
        f.timestamp = int(d["timestamp"])
    return f
