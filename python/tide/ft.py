"""Training that does not stop: per-step fault tolerance across replica
groups (docs/fault_tolerance.md), with TorchFT's names.

A job runs as N replica groups, each a full copy of the model (one
``tiderun`` per group, or one per node of it). Every step, the groups agree
on who takes part (a quorum), average their gradients over the groups of
that quorum, and vote; the optimizer steps only when every rank of every
group in the quorum succeeded. When a group fails, its agent declares it out
at once: the others abort that step, form a quorum without it and go on,
their processes untouched. When it comes back, it is admitted at the next
step and first takes the state of a healthy group (healing)::

    from tide.ft import Manager, allreduce_gradients

    manager = Manager(
        load_state_dict=lambda sd: (model.load_state_dict(sd["model"]),
                                    optimizer.load_state_dict(sd["optim"])),
        state_dict=lambda: {"model": model.state_dict(),
                            "optim": optimizer.state_dict()},
        min_replica_size=1)
    while manager.current_step() < steps:
        manager.start_quorum()
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        allreduce_gradients(manager, model)
        if manager.should_commit():
            optimizer.step()

Under ``tiderun --ft-store HOST:PORT --replica-group-id G
--num-replica-groups N`` the Manager finds the store, its group and its
incarnation in the environment; elsewhere pass them.

TorchFT's DistributedDataParallel, DistributedSampler, LocalSGD and DiLoCo
are here too (docs/fault_tolerance.md).

The quorum and the commit vote are tide's C++ (tide::ft::QuorumClient),
kept in a tide store or in etcd; the groups' gradients travel over a gloo
process group formed again whenever the quorum's members change.
"""

import json as _json
import os as _os
import time as _time
import re as _re
from datetime import timedelta as _timedelta

from tide import _elastic

__all__ = ["Manager", "OptimizerWrapper", "Optimizer", "DistributedDataParallel",
           "DistributedSampler", "LocalSGD", "DiLoCo", "ProcessGroupGloo",
           "ProcessGroupNCCL", "ProcessGroupBabyNCCL", "allreduce_gradients",
           "ReplicaGroupError"]

_INCARNATION = _re.compile(r"[^A-Za-z0-9._-]")
# TorchFT Manager arguments for machinery tide does not have.
_TORCHFT_ONLY = frozenset({
    "use_async_quorum", "lighthouse_addr", "store_addr", "store_port", "port",
    "hostname", "connect_timeout", "checkpoint_transport", "init_sync",
    "quorum_retries"})
# The Manager's own part of the state a healing group receives.
_OWN = "tide.ft"


class ReplicaGroupError(RuntimeError):
    """This group cannot take part: it was voted out, or refused, or the
    configuration is incomplete. Says why."""


def _seconds(t):
    return t.total_seconds() if hasattr(t, "total_seconds") else float(t)


def _env(name, given, convert=str):
    if given is not None:
        return given
    v = _os.environ.get(name)
    return convert(v) if v not in (None, "") else None


class Manager:
    """One process of one replica group, taking part in the quorum of every
    step (TorchFT's ``torchft.Manager``; its arguments, where tide has the
    same thing).

    pg: None, or ``ProcessGroupGloo(timeout=...)`` to bound the collectives
        across groups (tide.ft forms a gloo group of its own per quorum).
    load_state_dict, state_dict: how this process's state is given to a
        group that heals from it, and taken from the one it heals from.
        Tensors travel as raw bytes, the rest of the structure as JSON
        (numbers, strings, lists, tuples, dicts): nothing is pickled.
    min_replica_size: a step commits only with this many groups in its
        quorum (default: TIDE_FT_MIN_REPLICA_SIZE, else 1).
    timeout: how long a collective across groups may take before it counts
        as failed (and the step is voted down).
    quorum_timeout: how long a quorum or a vote may take.
    store: where the groups meet (TIDE_FT_STORE): ``HOST:PORT[/JOB]`` of a
        tide store, or ``etcd:HOST:PORT[,...][/JOB]``.
    replica_id: this group's id (REPLICA_GROUP_ID); under tiderun, always
        the id its tiderun gives (REPLICA_GROUP_ID).
    num_replica_groups: the first quorum waits for this many (NUM_REPLICA_GROUPS).
    rank, world_size: this process's rank in its group and the group's size
        (RANK, WORLD_SIZE).
    incarnation: what tells this run of the group from its earlier ones
        (TIDE_FT_INCARNATION, set by tiderun; else TORCHELASTIC_RUN_ID and
        TORCHELASTIC_RESTART_COUNT). Every rank of the group must use the same.
    step: the step this process's state is at when it starts (0).

    TorchFT's arguments for its own machinery (its lighthouse, its
    servers, its asynchronous quorum: use_async_quorum, lighthouse_addr,
    store_addr, store_port, port, hostname, connect_timeout,
    checkpoint_transport, init_sync, quorum_retries) are accepted and
    unused: tide's groups meet in ``store`` and heal over tide's transport.
    """

    def __init__(self, pg=None, load_state_dict=None, state_dict=None,
                 min_replica_size=None, timeout=_timedelta(seconds=60),
                 quorum_timeout=_timedelta(seconds=60), store=None,
                 replica_id=None, num_replica_groups=None, rank=None,
                 world_size=None, incarnation=None, step=0,
                 join_timeout=_timedelta(seconds=60),
                 heartbeat_interval=_timedelta(milliseconds=100),
                 heartbeat_timeout=_timedelta(seconds=5), max_retries=None,
                 **torchft_only):
        unknown = sorted(set(torchft_only) - _TORCHFT_ONLY)
        if unknown:
            raise TypeError(f"Manager() got unexpected keyword arguments {unknown}")
        if not (pg is None or isinstance(pg, ProcessGroupGloo)):
            raise ReplicaGroupError(
                "tide.ft forms a gloo process group of its own for each "
                "quorum: pass pg=None or tide.ft.ProcessGroupGloo()")
        self._store_address = _env("TIDE_FT_STORE", store)
        self._replica_id = _env("REPLICA_GROUP_ID", replica_id)
        if "TIDE_FT_INCARNATION" in _os.environ and "REPLICA_GROUP_ID" in _os.environ:
            # Under tiderun the group is its tiderun's: the agent declares it
            # out under that id the moment a worker fails. A replica_id of
            # the script's own (TorchFT's scripts pass one) names nothing
            # the agent knows, and would leave failures to the heartbeat.
            self._replica_id = _os.environ["REPLICA_GROUP_ID"]
        if not self._store_address or self._replica_id is None:
            raise ReplicaGroupError(
                "tide.ft.Manager needs the store where the replica groups meet "
                "(tide has no lighthouse) and this group's id: run under "
                "tiderun --ft-store HOST:PORT --replica-group-id ID, or pass "
                "store= and replica_id=")
        self._rank = _env("RANK", rank, int) or 0
        self._world_size = _env("WORLD_SIZE", world_size, int) or 1
        if incarnation is None:
            incarnation = _os.environ.get("TIDE_FT_INCARNATION")
        if incarnation is None and "TORCHELASTIC_RUN_ID" in _os.environ:
            incarnation = "{}.{}".format(
                _os.environ["TORCHELASTIC_RUN_ID"],
                _os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
        if incarnation is None:
            raise ReplicaGroupError(
                "tide.ft.Manager cannot tell this run of the group from the "
                "last: run under tiderun or torchrun, or pass incarnation= "
                "(the same on every rank of the group, new at each restart)")
        self._incarnation = _INCARNATION.sub("-", str(incarnation))[:128]
        self._min = _env("TIDE_FT_MIN_REPLICA_SIZE", min_replica_size, int) or 1
        groups = _env("NUM_REPLICA_GROUPS", num_replica_groups, int) or 1
        self._timeout = _timedelta(seconds=_seconds(timeout))
        # The collectives' own bound: the ProcessGroupGloo's, else timeout.
        self._pg_timeout = self._timeout
        if pg is not None and pg.timeout is not None:
            self._pg_timeout = _timedelta(seconds=_seconds(pg.timeout))
        # Every registered pair's state travels under its key (TorchFT's
        # register_state_dict_fn; the constructor's pair is "default").
        self._load_state_dict_fns = {}
        self._state_dict_fns = {}
        if load_state_dict is not None and state_dict is not None:
            self.register_state_dict_fn("default", load_state_dict, state_dict)
        self._batches_committed = 0
        self._max_retries = max_retries
        self._failures = 0
        self._client = _elastic.QuorumClient(
            self._store_address, str(self._replica_id), self._incarnation,
            self._rank, self._world_size, self._min, groups,
            _seconds(join_timeout), _seconds(quorum_timeout),
            _seconds(heartbeat_interval), _seconds(heartbeat_timeout), step)
        self._quorum = None
        self._pg = None
        self._pg_id = None
        self._error = None
        # The last heal: when it began (time.time()), how long it took, from
        # which member, to which step.
        self.last_heal = None
        self._kept = []  # tensors a collective may still reference
        # Healing's wire: where a group that heals from this one sends to.
        self._kv = _elastic.connect_quorum_store(self._store_address, _seconds(quorum_timeout))
        # The same connection as torch's Store, for gloo's rendezvous of each
        # quorum's process group (a tide store or etcd alike).
        self._pg_store = _torch_store(self._kv)
        # Every group must hold the same secret: TIDE_FT_TOKEN (a group's
        # own TIDE_RPC_TOKEN is its alone). None: this user's processes on
        # this host only.
        self._transfer = _elastic.StateTransfer(
            _listen_host(self._store_address), _os.environ.get("TIDE_FT_TOKEN", ""))
        self._kv.set(f"heal/{self._replica_id}:{self._incarnation}/{self._rank}",
                     self._transfer.address)

    # --- TorchFT's Manager ---

    def register_state_dict_fn(self, key, load_state_dict, state_dict):
        """Adds a piece of the state a healing group receives: state_dict()
        gives it, load_state_dict(sd) takes it, under ``key`` (unique)."""
        if key == _OWN:
            raise ReplicaGroupError(f"the key {key!r} is the Manager's own: choose another")
        if key in self._state_dict_fns:
            raise ReplicaGroupError(f"a state dict function is registered as {key!r} already")
        self._load_state_dict_fns[key] = load_state_dict
        self._state_dict_fns[key] = state_dict

    def _state(self):
        sd = {k: fn() for k, fn in self._state_dict_fns.items()}
        sd[_OWN] = {"batches_committed": self._batches_committed}
        return sd

    def _load_state(self, sd):
        # The step is the quorum's; the batches committed, the source's.
        self._batches_committed = int(sd.get(_OWN, {}).get(
            "batches_committed", self._batches_committed))
        for k, fn in self._load_state_dict_fns.items():
            if k not in sd:
                raise ReplicaGroupError(
                    f"healing: the state received has no {k!r} (it has {sorted(sd)})")
            fn(sd[k])

    def start_quorum(self, allow_heal=True, shrink_only=False, timeout=None):
        """Joins this step's quorum: at once when its members are the last
        step's; otherwise a new one, with a new process group across the
        groups, and, for a group behind the others, its state taken from
        one of them first (healing). A group others heal from sends them
        its state_dict() here."""
        del shrink_only, timeout  # tide's quorum keeps every live member
        self._error = None
        try:
            q = self._client.start_quorum()
        except RuntimeError as e:
            raise ReplicaGroupError(str(e)) from e
        self._quorum = q
        if q.id != self._pg_id:
            # Every rank of every member is here (or the round is already
            # lost): only then form the process group, so that nobody waits
            # in gloo's connect for a peer that is gone.
            if self._client.meet():
                self._configure(q)
            else:
                self.report_error(ReplicaGroupError(
                    f"quorum {q.id}: a member was out before the groups met"))
        if self._error is None and q.heal and allow_heal:
            try:
                started = _time.time()
                self._receive_state(q)
                self.last_heal = {"started": started, "seconds": _time.time() - started,
                                  "source": q.heal_from, "step": q.max_step}
            except Exception as e:
                # Part of this process's state may be the source's now: it
                # must not go on with it (nor ever be healed from).
                raise ReplicaGroupError(
                    f"healing from {q.heal_from} failed midway ({e}); this "
                    "process's state is incomplete, so it stops: its agent "
                    "starts the group again, to heal anew") from e
            self._client.healed(q.max_step)
        if self._error is None and q.heal_to:
            try:
                for dst in q.heal_to:
                    self._send_state(q, dst)
            except Exception as e:  # noqa: BLE001 - voted down, not raised
                self.report_error(e)

    def should_commit(self, timeout=None):
        """Votes on this step: True only when every rank of every group in
        the quorum says its step succeeded (no error reported, enough
        groups). Then, and only then, step the optimizer."""
        del timeout
        if self._quorum is None:
            raise ReplicaGroupError("should_commit() before start_quorum()")
        committed = self._client.should_commit(self._error is None)
        self._failures = 0 if committed else self._failures + 1
        if committed:
            self._batches_committed += self.num_participants()
        if (not committed and self._max_retries is not None
                and self._failures > self._max_retries):
            raise ReplicaGroupError(
                f"{self._failures} steps in a row did not commit "
                f"(max_retries={self._max_retries}); the last error: "
                f"{self._error!r}")
        return committed

    def wait_quorum(self):
        """The quorum is ready: start_quorum() returns once it is (there is
        no quorum still forming in the background to wait for)."""
        if self._quorum is None:
            raise ReplicaGroupError("wait_quorum() before start_quorum()")

    def state_dict(self):
        """This Manager's own state, for the job's checkpoints (TorchFT's):
        the step and the batches committed."""
        return {"step": self.current_step(), "batches_committed": self._batches_committed}

    def load_state_dict(self, state_dict):
        """Takes the step and batches committed of a checkpoint (from
        state_dict()), before the first start_quorum(): a group's step is
        fixed once it is in a quorum. A group that loads an older step than
        the others' heals; a newer one is refused when it joins."""
        if self._quorum is not None:
            raise ReplicaGroupError(
                "load_state_dict() after start_quorum(): a group in a quorum "
                "cannot move its step; load the checkpoint before the first step")
        try:
            step, batches = int(state_dict["step"]), int(state_dict["batches_committed"])
        except (KeyError, TypeError, ValueError) as e:
            raise ReplicaGroupError(
                "load_state_dict() takes what state_dict() gives: {'step': int, "
                f"'batches_committed': int}}, not {state_dict!r}") from e
        if step < 0 or batches < 0:
            raise ReplicaGroupError(f"load_state_dict(): a negative count in {state_dict!r}")
        self._client.healed(step)
        self._batches_committed = batches

    def batches_committed(self):
        """Batches committed so far, over every group: the sum of the
        participants of each step this process committed."""
        return self._batches_committed

    def num_participants(self):
        """The replica groups in this step's quorum."""
        return self._quorum.replica_world_size if self._quorum else 0

    def participating_rank(self):
        """This group's rank among the groups of the quorum."""
        return self._quorum.replica_rank if self._quorum else None

    def is_participating(self):
        return self._quorum is not None

    def current_step(self):
        """The step this process's state is at: committed steps (or the
        step healed to)."""
        return self._client.step

    def quorum_id(self):
        return self._quorum.id if self._quorum else -1

    def report_error(self, e):
        """This step failed here (a collective raised): it will be voted
        down, and the quorum formed again."""
        if self._error is None:
            self._error = e

    def errored(self):
        return self._error

    def allreduce(self, tensor, should_quantize=False):
        """Averages ``tensor`` (CPU) in place over the groups of the quorum,
        and returns a finished work (``wait()``, ``get_future()``), as
        TorchFT's does. A failure is reported, not raised: the step is then
        voted down."""
        del should_quantize  # full precision over gloo
        if self._error is None and self._pg is not None:
            import torch.distributed as dist
            try:
                self._kept = [tensor]
                self._pg.allreduce([tensor], dist.AllreduceOptions()).wait()
                tensor.div_(self._quorum.replica_world_size)
            except Exception as e:  # noqa: BLE001 - voted down, not raised
                self.report_error(e)
                self._drop_pg()
        return _Done(tensor)

    def _drop_pg(self):
        """Ends this process's part of the quorum's process group, closing
        its connections: a peer still waiting in a collective for this one
        (gloo's ring does not pass a failure on) gets an error now instead
        of at its timeout. Safe here: no collective of this process is in
        flight, and the tensors the last one used are still referenced
        (torch < 2.8 destroys a gloo group holding the GIL)."""
        pg, self._pg, self._pg_id = self._pg, None, None
        del pg

    def shutdown(self, wait=True):
        """This group leaves: the others go on without waiting for it."""
        del wait
        if self._rank == 0:
            self._client.leave("shut down")

    # --- process groups across the groups ---

    def _configure(self, q):
        import torch.distributed as dist
        self._drop_pg()
        prefix = f"{q.store_prefix}{self._rank}"
        try:
            self._pg = dist.ProcessGroupGloo(
                dist.PrefixStore(prefix, self._pg_store), q.replica_rank,
                q.replica_world_size, self._pg_timeout)
            self._pg_id = q.id
        except Exception as e:  # noqa: BLE001 - voted down, not raised
            self.report_error(e)

    # --- healing: the state over tide's transport ---

    def _send_state(self, q, dst):
        tensors = []
        meta = _json.dumps(_encode(self._state(), tensors))
        member = q.members[dst][0]
        to = self._kv.get(f"heal/{member}/{self._rank}")
        self._transfer.send(
            to, q.id, meta,
            [(t.data_ptr(), t.numel() * t.element_size()) for t in tensors],
            _seconds(self._timeout))

    def _receive_state(self, q):
        import torch
        data = _json.loads(self._transfer.receive_meta(q.id, _seconds(self._timeout)))
        specs = _specs(data)
        # Into this process's own tensor wherever its state has one at the
        # same place with the same dtype and shape (TorchFT's in-place
        # receive): no new memory to fault in, and load_state_dict() then
        # copies nothing new. Elsewhere (an optimizer's state not made yet),
        # new tensors.
        mine, tensors = {}, []
        for path, entry in _paths(_encode(self._state(), tensors)):
            mine[path] = tensors[entry["T"]]
        own = [None] * len(specs)
        for path, entry in _paths(data):
            i, dtype, shape = entry["T"], specs[entry["T"]][1], specs[entry["T"]][2]
            t = mine.get(path)
            if t is None or t.dtype != dtype or tuple(t.shape) != shape:
                t = torch.empty(shape, dtype=dtype)
            own[i] = t
        self._transfer.receive_into(
            q.id, [(t.data_ptr(), t.numel() * t.element_size()) for t in own],
            _seconds(self._timeout))
        self._load_state(_decode(data, own))


class _Done:
    """A collective's work that has already ended (torch's Work's wait()
    and get_future())."""

    def __init__(self, tensor):
        self._tensor = tensor

    def wait(self, timeout=None):
        del timeout
        return True

    def get_future(self):
        import torch
        fut = torch.futures.Future()
        fut.set_result(self._tensor)
        return fut


class OptimizerWrapper:
    """TorchFT's OptimizerWrapper: ``zero_grad()`` starts the step's quorum
    (and heals), ``step()`` steps the optimizer only when the step commits.
    Everything else is the wrapped optimizer's."""

    def __init__(self, manager, optim):
        self.manager = manager
        self.optim = optim

    def zero_grad(self, set_to_none=True):
        self.manager.start_quorum()
        self.optim.zero_grad(set_to_none)

    def step(self, closure=None):
        if closure is not None:
            raise ReplicaGroupError("OptimizerWrapper.step() takes no closure")
        if self.manager.should_commit():
            self.optim.step()

    def __getattr__(self, name):
        return getattr(self.optim, name)


Optimizer = OptimizerWrapper  # the name TorchFT's package exports


class ProcessGroupGloo:
    """TorchFT's ProcessGroupGloo as a Manager's ``pg``: the Manager forms a
    gloo group of its own for each quorum, and its collectives are bounded
    by this timeout (else by the Manager's)."""

    def __init__(self, timeout=None):
        if timeout is not None and _seconds(timeout) <= 0:
            raise ReplicaGroupError(f"ProcessGroupGloo: timeout must be positive, not {timeout!r}")
        self.timeout = timeout


class ProcessGroupNCCL:
    """Not in tide.ft yet: across groups it averages CPU tensors over gloo.
    NCCL needs the old communicator aborted at each quorum change
    (docs/fault_tolerance.md, "Limits")."""

    def __init__(self, *args, **kwargs):
        del args, kwargs
        raise ReplicaGroupError(
            "tide.ft averages over the replica groups with gloo (CPU tensors); "
            "NCCL across groups is not supported yet: pass "
            "tide.ft.ProcessGroupGloo() (docs/fault_tolerance.md)")


ProcessGroupBabyNCCL = ProcessGroupNCCL


def __getattr__(name):
    # The classes made of torch's are built at first use: tide.ft itself
    # imports without torch.
    if name in ("DistributedDataParallel", "DistributedSampler"):
        globals().update(_torch_classes())
        return globals()[name]
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _torch_classes():
    import contextlib
    import torch
    import torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler as _Sampler

    class DistributedDataParallel(torch.nn.Module):
        """TorchFT's DistributedDataParallel(manager, module): at the end of
        each backward pass through ``module``, its gradients are averaged
        over the groups of the quorum in one collective
        (``allreduce_gradients``). Across groups only, as TorchFT's: within
        a group of several ranks, average as usual too (or run one rank a
        group). ``no_sync()`` skips the average, for gradient accumulation;
        torch DDP's other keyword arguments are accepted and mean nothing
        here. ``self.module`` is the wrapped module; the wrapper's own
        state_dict() has the "module." prefix, as torch DDP's has."""

        def __init__(self, manager, module, **kwargs):
            super().__init__()
            del kwargs
            self.module = module
            self._manager = manager
            self._sync = True
            self._queued = False
            for p in module.parameters():
                if p.requires_grad:
                    p.register_hook(self._on_grad)

        def _on_grad(self, grad):
            # The first gradient of a backward pass queues the average for
            # when the pass has put every gradient in place.
            del grad
            if self._sync and not self._queued:
                self._queued = True
                torch.autograd.Variable._execution_engine.queue_callback(self._average)

        def _average(self):
            self._queued = False
            allreduce_gradients(self._manager, self.module)

        @contextlib.contextmanager
        def no_sync(self):
            before, self._sync = self._sync, False
            try:
                yield
            finally:
                self._sync = before

        def forward(self, *args, **kwargs):
            self._queued = False  # a new pass (the last may have raised)
            return self.module(*args, **kwargs)

    class DistributedSampler(_Sampler):
        """TorchFT's DistributedSampler: the dataset in
        ``num_replicas x num_replica_groups`` shards, this rank's being
        ``group_rank + num_replicas x replica_rank``. num_replica_groups is
        the most groups the job runs (a group's shard is skipped while it is
        out). group_rank and num_replicas default to this process's rank and
        world size in its group (torch.distributed's, else RANK and
        WORLD_SIZE)."""

        def __init__(self, dataset, replica_rank, num_replica_groups,
                     group_rank=None, num_replicas=None, **kwargs):
            initialized = dist.is_available() and dist.is_initialized()
            if group_rank is None:
                group_rank = dist.get_rank() if initialized else int(_os.environ.get("RANK", 0))
            if num_replicas is None:
                num_replicas = (dist.get_world_size() if initialized
                                else int(_os.environ.get("WORLD_SIZE", 1)))
            if not 0 <= int(replica_rank) < int(num_replica_groups):
                raise ReplicaGroupError(
                    f"DistributedSampler: replica_rank {replica_rank!r} is not "
                    f"in 0..{int(num_replica_groups) - 1} (num_replica_groups)")
            if not 0 <= group_rank < num_replicas:
                raise ReplicaGroupError(
                    f"DistributedSampler: group_rank {group_rank} is not in "
                    f"0..{num_replicas - 1} (num_replicas)")
            self.global_rank = group_rank + num_replicas * int(replica_rank)
            self.global_world_size = num_replicas * int(num_replica_groups)
            super().__init__(dataset, num_replicas=self.global_world_size,
                             rank=self.global_rank, **kwargs)

    return {"DistributedDataParallel": DistributedDataParallel,
            "DistributedSampler": DistributedSampler}


def _listen_host(address):
    """Where this process takes a healing state: TIDE_FT_HOST, else this
    host's loopback when the store is on it, else this host's name."""
    if _os.environ.get("TIDE_FT_HOST"):
        return _os.environ["TIDE_FT_HOST"]
    host = address.split("etcd:", 1)[-1].split("/", 1)[0].split(",")[0].rpartition(":")[0]
    if host in ("127.0.0.1", "localhost", "[::1]", "::1"):
        return "127.0.0.1"
    import socket
    return socket.gethostname()


def _encode(obj, tensors):
    """A state dict as JSON-able data, its tensors replaced by their index,
    dtype and shape (and appended to ``tensors``): nothing is pickled, so
    nothing a peer sends can run code here."""
    import torch
    if isinstance(obj, torch.Tensor):
        t = obj.detach().contiguous()
        if t.device.type != "cpu":
            t = t.cpu()
        tensors.append(t)
        return {"T": len(tensors) - 1, "dtype": str(t.dtype).split(".")[-1],
                "shape": list(t.shape)}
    if obj is None or isinstance(obj, (bool, int, float, str)):
        return obj
    if isinstance(obj, dict):
        return {"d": [[_encode(k, tensors), _encode(v, tensors)]
                      for k, v in obj.items()]}
    if isinstance(obj, (list, tuple)):
        return {"t" if isinstance(obj, tuple) else "l":
                [_encode(v, tensors) for v in obj]}
    raise ReplicaGroupError(
        f"healing: a state dict holds tensors, numbers, strings, lists, "
        f"tuples and dicts, not {type(obj).__name__}")


def _specs(data):
    """The (index, dtype, shape) of each tensor ``data`` names, by index."""
    import torch
    out = []
    for _, entry in _paths(data):
        dtype = getattr(torch, str(entry.get("dtype")), None)
        if not isinstance(dtype, torch.dtype):
            raise ReplicaGroupError(f"healing: no dtype {entry.get('dtype')!r}")
        out.append((int(entry["T"]), dtype, tuple(int(x) for x in entry["shape"])))
    out.sort(key=lambda x: x[0])
    if [i for i, _, _ in out] != list(range(len(out))):
        raise ReplicaGroupError("healing: the tensors described are not 0..n-1")
    return out


def _paths(data, at=()):
    """(path, tensor entry) of each tensor of an encoded state: a path is
    the keys and indices that lead to it."""
    if isinstance(data, dict):
        if "T" in data:
            yield at, data
        elif "d" in data:
            for k, v in data["d"]:
                yield from _paths(v, at + (_json.dumps(k),))
        else:
            for i, v in enumerate(data.get("l", data.get("t", []))):
                yield from _paths(v, at + (i,))


def _decode(data, tensors):
    if isinstance(data, dict):
        if "T" in data:
            return tensors[data["T"]]
        if "d" in data:
            return {_decode(k, tensors): _decode(v, tensors) for k, v in data["d"]}
        if "t" in data:
            return tuple(_decode(v, tensors) for v in data["t"])
        return [_decode(v, tensors) for v in data["l"]]
    return data


def _torch_store(inner):
    """A tide store (tide._elastic.Store) as a torch.distributed.Store."""
    import torch.distributed as dist

    class TideStore(dist.Store):
        def __init__(self):
            super().__init__()

        def set(self, key, value):
            inner.set(key, value)

        def get(self, key):
            return inner.get(key)

        def add(self, key, amount):
            return inner.add(key, amount)

        def compare_set(self, key, expected, desired):
            return inner.compare_set(key, expected, desired)

        def wait(self, keys, timeout=None):
            if timeout is None:
                inner.wait(keys)
            else:
                inner.wait(keys, timeout)

        def check(self, keys):
            return inner.check(keys)

        def delete_key(self, key):
            return inner.delete_key(key)

        def num_keys(self):
            return inner.num_keys()

        def set_timeout(self, timeout):
            inner.set_timeout(timeout)

    return TideStore()


def allreduce_gradients(manager, model):
    """Averages ``model``'s gradients over the groups of the quorum, in one
    flat buffer (one collective)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    averages = _average_over_groups(manager, grads, True)
    for g, a in zip(grads, averages or ()):
        g.copy_(a)


def _average_over_groups(manager, tensors, contributes):
    """The average over the groups of the quorum of ``tensors``, counting
    only the groups that contribute (one collective: each group's weight, 1
    or 0, travels with its tensors); None when there is nothing to average
    or the collective failed (then the step is voted down)."""
    import torch
    if not tensors:
        return None
    w = 1.0 if contributes else 0.0
    with torch.no_grad():
        flat = torch.cat([t.detach().reshape(-1) * w for t in tensors]
                         + [torch.full((1,), w, dtype=tensors[0].dtype)])
        manager.allreduce(flat)
        if manager.errored() is not None:
            return None
        weight = float(flat[-1])
        if weight <= 0:
            manager.report_error(ReplicaGroupError(
                "no group of the quorum brought its own state to the average"))
            return None
        out, offset = [], 0
        for t in tensors:
            out.append((flat[offset:offset + t.numel()] / weight).view_as(t))
            offset += t.numel()
        return out


class LocalSGD:
    """TorchFT's LocalSGD, a context manager around a training loop: each
    group steps ``optimizer`` on its own; after every ``sync_every`` of its
    steps the groups of a quorum average their parameters (one collective)
    and, when that sync commits, every group takes the average (one that
    does not commit keeps its own). A group that heals at a sync brings
    nothing of its own to the average: it holds the state of the group it
    healed from. ``manager.current_step()`` counts the committed syncs::

        with LocalSGD(manager, model, optimizer, sync_every=50):
            while manager.current_step() < syncs:
                optimizer.zero_grad()
                loss_fn(model(x), y).backward()
                optimizer.step()          # every 50th also syncs
    """

    def __init__(self, manager, model, optimizer, sync_every):
        if int(sync_every) < 1:
            raise ReplicaGroupError(f"sync_every must be at least 1, not {sync_every!r}")
        self._manager = manager
        self._model = model
        self._optimizer = optimizer
        self._sync_every = int(sync_every)
        self._local_step = 0
        self._own_step = None

    def __enter__(self):
        # The optimizer's step, then the sync when one is due (an attribute
        # of this optimizer only: torch < 2 has no step hooks).
        inner = self._optimizer.step
        self._own_step = vars(self._optimizer).get("step")

        def step(*args, **kwargs):
            out = inner(*args, **kwargs)
            self._local_step += 1
            if self._local_step >= self._sync_every:
                self.sync()
            return out

        self._optimizer.step = step
        return self

    def __exit__(self, *exc):
        if self._own_step is None:
            del self._optimizer.step
        else:
            self._optimizer.step = self._own_step
        return False

    def _start(self):
        """This sync's quorum; True when this group brings its own state
        (it did not heal in it)."""
        self._local_step = 0
        before = self._manager.current_step()
        self._manager.start_quorum()
        return self._manager.current_step() == before

    def sync(self):
        import torch
        params = list(self._model.parameters())
        averages = _average_over_groups(self._manager, params, self._start())
        if self._manager.should_commit():
            with torch.no_grad():
                for p, a in zip(params, averages or ()):
                    p.copy_(a)


class DiLoCo(LocalSGD):
    """TorchFT's DiLoCo: ``inner_optimizer`` steps each group on its own;
    after every ``sync_every`` of its steps the groups average how far they
    moved from the last synced ("global") weights, the pseudo-gradient
    global - local, and ``outer_optimizer`` (over the same parameters)
    steps the global weights by that average when the sync commits. A sync
    that does not commit takes every group back to the global weights. The
    global weights and the outer optimizer's state go with this group's
    state to a group that heals from it (under the key "diloco"); a group
    that heals at a sync brings a pseudo-gradient of its own to none.
    backup_device: where the global weights are kept (CPU)."""

    def __init__(self, manager, model, inner_optimizer, outer_optimizer, sync_every,
                 backup_device=None, pin_memory=True):
        import torch
        super().__init__(manager, model, inner_optimizer, sync_every)
        del pin_memory  # CPU tensors over gloo
        self._outer = outer_optimizer
        with torch.no_grad():
            self._global = [p.detach().to(backup_device or "cpu", copy=True)
                            for p in model.parameters()]
        manager.register_state_dict_fn("diloco", self._load, self._state)

    def _state(self):
        return {"global": self._global, "outer": self._outer.state_dict()}

    def _load(self, sd):
        import torch
        with torch.no_grad():
            for g, p, t in zip(self._global, self._model.parameters(), sd["global"]):
                g.copy_(t)
                p.copy_(t)
        self._outer.load_state_dict(sd["outer"])

    def sync(self):
        import torch
        params = list(self._model.parameters())
        contributes = self._start()
        with torch.no_grad():
            deltas = [g.to(p.device) - p for p, g in zip(params, self._global)]
            for p, g in zip(params, self._global):
                p.copy_(g)
        averages = _average_over_groups(self._manager, deltas, contributes)
        if self._manager.should_commit():
            for p, a in zip(params, averages or ()):
                p.grad = a
            self._outer.step()
            with torch.no_grad():
                for g, p in zip(self._global, params):
                    g.copy_(p)
        self._outer.zero_grad()
