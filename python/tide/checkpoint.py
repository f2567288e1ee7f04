"""Checkpoints held in memory by the node's tide agent (docs/checkpoints.md).

Under ``tiderun --checkpoint-memory SIZE`` the agent reserves a region of
/dev/shm for its workers and keeps it across their restarts. A worker saves
its state into it, byte for byte, tensors never pickled, and a restarted
worker (a cold one or a ``--prestart`` one) loads it back from memory in
place of a disk read::

    import tide.checkpoint

    state, step = tide.checkpoint.load(model.state_dict())  # in place
    start = 0 if step is None else step + 1
    for step in range(start, steps):
        train_step()
        tide.checkpoint.save(model.state_dict(), step=step)

Each local rank has two slots, written in turn: a save marks its slot as
being written before its first byte and complete after its last, so a worker
killed in the middle of a save leaves its previous snapshot in force.

The region's layout is src/checkpoint/region.h's; this module reads and
writes the same bytes.
"""

import ctypes as _ctypes
import functools as _functools
import json as _json
import mmap as _mmap
from collections import OrderedDict as _OrderedDict
import os as _os
import pickle as _pickle
import struct as _struct
import threading as _threading

__all__ = ["CheckpointError", "Loaded", "available", "load", "save"]

_REGION = _struct.Struct("<8sIIQQIII")  # magic, version, slots, slot bytes,
#                                          bytes, own per rank, first replica, peer
_PEER_AT = 40  # the peer field's offset in the region's header
_SLOT = _struct.Struct("<8sIIQqqQQQ")  # magic, version, state, seq, step,
#                                        rank, meta bytes, data bytes, flags
_HEADER = 4096  # the region's header, and each slot's
_STATE_AT = 12  # the state's offset in a slot's header
_FLAGS_AT = 56
_EMPTY, _WRITING, _COMPLETE = 0, 1, 2
_REPLICATED, _FROM_PEER = 1, 2  # flags
_ALIGN = 64
_MADV_POPULATE_READ = 22  # linux/mman.h
# Reads from /dev/shm run about twice as fast in pieces of this size as in
# one memmove of a whole large tensor (glibc's non-temporal path); writes
# into it, the other way round (bench/checkpoint).
_READ_PIECE = 64 << 20

_lock = _threading.Lock()
_region = None


class CheckpointError(RuntimeError):
    """A snapshot that cannot be saved or loaded; says why."""


class Loaded(tuple):
    """What ``load`` returns: ``(state, step)``, and ``source``, where the
    state came from: ``"memory"`` (this node's agent), ``"peer"`` (a copy
    another node's agent made or sent), ``"disk"`` (--checkpoint-dir) or
    ``"none"`` (no snapshot: ``state`` and ``step`` are None)."""

    def __new__(cls, state, step, source):
        loaded = super().__new__(cls, (state, step))
        loaded.source = source
        return loaded

    @property
    def state(self):
        return self[0]

    @property
    def step(self):
        return self[1]


class _Tensor:
    """Where a tensor stood in the state: its place in the table."""

    __slots__ = ("index",)

    def __init__(self, index):
        self.index = index

    def __reduce__(self):
        return (_Tensor, (self.index,))


class _Region:
    def __init__(self, path):
        try:
            fd = _os.open(path, _os.O_RDWR | _os.O_CLOEXEC)
        except OSError as e:
            raise CheckpointError(f"cannot open the checkpoint memory {path}: {e}") from None
        try:
            size = _os.fstat(fd).st_size
            self.mm = _mmap.mmap(fd, size, _mmap.MAP_SHARED)
        finally:
            _os.close(fd)
        magic, version, self.slots, self.slot_bytes, self.bytes, self.own, \
            self.replicas_from, _ = _REGION.unpack_from(self.mm, 0)
        if magic != b"TIDECKPR" or version != 2 or self.bytes > size:
            raise CheckpointError(f"{path} is not a tide checkpoint region (version 2)")
        self.path = path
        self.address = _ctypes.addressof(_ctypes.c_char.from_buffer(self.mm))

    def offset(self, slot):
        return _HEADER + slot * self.slot_bytes

    def peer(self):
        """Whether an agent of another node takes this node's snapshots."""
        return _struct.unpack_from("<I", self.mm, _PEER_AT)[0] == 1

    def flags(self, slot):
        return _struct.unpack_from("<Q", self.mm, self.offset(slot) + _FLAGS_AT)[0]

    def head(self, slot):
        """The slot's header, or None when it holds no complete snapshot."""
        fields = _SLOT.unpack_from(self.mm, self.offset(slot))
        if fields[0] != b"TIDECKPS" or fields[1] != 1 or fields[2] != _COMPLETE:
            return None
        return fields


def _open():
    global _region
    with _lock:
        if _region is None:
            path = _os.environ.get("TIDE_CHECKPOINT_REGION")
            if not path:
                raise CheckpointError(
                    "no checkpoint memory here: run the script under tiderun "
                    "--checkpoint-memory SIZE (TIDE_CHECKPOINT_REGION is not set)")
            _region = _Region(path)
        return _region


def available():
    """Whether this worker has a node's checkpoint memory to save into."""
    return bool(_os.environ.get("TIDE_CHECKPOINT_REGION"))


def _rank(name):
    value = _os.environ.get(name)
    if value is None:
        raise CheckpointError(f"{name} is not set: tide.checkpoint runs in a worker of tiderun")
    return int(value)


def _human(n):
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if n < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024


def _path(path):
    return "state" + "".join(f"[{k!r}]" for k in path)


def _flatten(obj, path, tensors):
    """The state with each tensor replaced by its _Tensor, and the tensors
    (with their paths) in the order of their indexes."""
    import torch

    if isinstance(obj, torch.Tensor):
        if obj.layout != torch.strided or obj.is_quantized:
            raise CheckpointError(
                f"save: {_path(path)} is a {obj.layout} tensor; only dense tensors are supported")
        tensors.append((path, obj))
        return _Tensor(len(tensors) - 1)
    if type(obj) in (dict, _OrderedDict):
        out = type(obj)((k, _flatten(v, path + (k,), tensors)) for k, v in obj.items())
        if hasattr(obj, "_metadata"):  # a module's state_dict: its versions
            out._metadata = obj._metadata
        return out
    if type(obj) in (list, tuple):
        return type(obj)(_flatten(v, path + (i,), tensors) for i, v in enumerate(obj))
    return obj


def _unpicklable(obj, path=()):
    """The path of the first leaf that pickle refuses, and why."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            found = _unpicklable(v, path + (k,))
            if found:
                return found
        return None
    if isinstance(obj, (list, tuple)):
        for i, v in enumerate(obj):
            found = _unpicklable(v, path + (i,))
            if found:
                return found
        return None
    try:
        _pickle.dumps(obj, protocol=_pickle.HIGHEST_PROTOCOL)
    except Exception as e:  # noqa: BLE001 - any reason pickle has
        return path, e
    return None


def _align(n):
    return (n + _ALIGN - 1) // _ALIGN * _ALIGN


def _bytes_view(region, offset, nbytes):
    import torch

    return torch.frombuffer(region.mm, dtype=torch.uint8, count=nbytes, offset=offset)


def _plain(t):
    """Whether t's bytes are one run in this process' memory."""
    return t.device.type == "cpu" and t.is_contiguous()


def _copy_in(region, offset, t):
    """t's bytes into the region at offset."""
    import torch

    nbytes = t.numel() * t.element_size()
    if _plain(t):
        _ctypes.memmove(region.address + offset, t.data_ptr(), nbytes)
        return
    src = t.detach()
    if not src.is_contiguous():
        src = src.contiguous()
    _bytes_view(region, offset, nbytes).copy_(src.reshape(-1).view(torch.uint8))


def _copy_out(region, offset, t, view):
    """The bytes at offset into t; view() makes a tensor of them as t's
    dtype and shape, for a t on another device or not contiguous."""
    if _plain(t):
        nbytes = t.numel() * t.element_size()
        for at in range(0, nbytes, _READ_PIECE):
            _ctypes.memmove(t.data_ptr() + at, region.address + offset + at,
                            min(_READ_PIECE, nbytes - at))
        return
    t.copy_(view())


def save(state_dict, step):
    """Copies ``state_dict`` (tensors, and dicts, lists and tuples of them and
    of other picklable values, nested) into this rank's slot of the node's
    checkpoint memory as the snapshot of ``step``, and returns once the copy
    is in. Tensors are copied byte for byte (from any device); the rest is
    pickled. The previous snapshot stays in force until this one is
    complete.

    Raises CheckpointError when the state does not fit in a slot, holds a
    tensor that is not dense, or a value pickle refuses (named by its path);
    the previous snapshot is kept.
    """
    if not isinstance(step, int) or step < 0:
        raise CheckpointError(f"save: step must be an int >= 0, got {step!r}")
    region = _open()
    rank, local = _rank("RANK"), _rank("LOCAL_RANK")
    if not 0 <= local < region.replicas_from // region.own:
        raise CheckpointError(
            f"save: local rank {local} has no slot in {region.path} "
            f"({region.replicas_from // region.own} local ranks)")
    tensors = []
    skeleton = _flatten(state_dict, (), tensors)
    table = [(str(t.dtype).replace("torch.", ""), tuple(t.shape), str(t.device)) for _, t in tensors]
    try:
        meta = _neutral_meta(state_dict, tensors, table) or \
            _pickle.dumps((skeleton, table), protocol=_pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - named below
        path, why = _unpicklable(skeleton)
        raise CheckpointError(
            f"save: {_path(path)} cannot be serialized ({type(why).__name__}: {why}); "
            "the previous snapshot is kept") from None
    offsets = []
    end = _HEADER + _align(len(meta))
    for _, t in tensors:
        offsets.append(end)
        end += _align(t.numel() * t.element_size())
    if end > region.slot_bytes:
        raise CheckpointError(
            f"save: the state of step {step} needs {_human(end)} and a snapshot slot holds "
            f"{_human(region.slot_bytes)} ({region.replicas_from // region.own} local ranks "
            f"share {_human(region.bytes)} of --checkpoint-memory, {_slots(region)} each); "
            "the previous snapshot is kept")

    with _lock:
        mine = range(local * region.own, (local + 1) * region.own)
        heads = {s: region.head(s) for s in mine}
        ours = sorted((h[3], s) for s, h in heads.items() if h and h[5] == rank)
        if ours and region.peer():
            _wait_for_peer(region, ours[-1][1], heads[ours[-1][1]])
        # Write over a slot that holds none of this rank's snapshots, else
        # over its oldest: the newest stays in force.
        free = [s for s in mine if not (heads[s] and heads[s][5] == rank)]
        slot = free[0] if free else ours[0][1]
        seq = max((h[3] for h in heads.values() if h), default=0) + 1
        base = region.offset(slot)
        mm = region.mm
        _struct.pack_into("<I", mm, base + _STATE_AT, _WRITING)
        mm[base + _HEADER:base + _HEADER + len(meta)] = meta
        for (path, t), offset in zip(tensors, offsets):
            if t.numel() > 0:
                _copy_in(region, base + offset, t)
        _SLOT.pack_into(mm, base, b"TIDECKPS", 1, _WRITING, seq, step, rank,
                        len(meta), end - _HEADER - _align(len(meta)), 0)
        _struct.pack_into("<I", mm, base + _STATE_AT, _COMPLETE)


def _neutral_meta(state, tensors, table):
    """The meta of a state that is a dict of tensors with string keys in the
    form the C++ API reads too (JSON: the tensors in order, with their keys,
    dtypes, shapes and devices); None for any other state."""
    if type(state) not in (dict, _OrderedDict) or hasattr(state, "_metadata") or \
            len(tensors) != len(state) or any(len(path) != 1 for path, _ in tensors) or \
            not all(isinstance(k, str) for k in state):
        return None  # not every value a tensor, or not every key a string
    return _json.dumps({"format": "tide-state", "version": 1, "tensors": [
        {"key": path[0], "dtype": dtype, "shape": list(shape), "device": device}
        for (path, _), (dtype, shape, device) in zip(tensors, table)]}).encode()


def _read_meta(meta):
    """(skeleton, table) from a snapshot's meta: a pickle (Python's), or
    the JSON both APIs write."""
    if meta[:1] != b"{":
        return _pickle.loads(meta)
    try:
        doc = _json.loads(bytes(meta))
        entries = doc["tensors"]
        skeleton = {e["key"]: _Tensor(i) for i, e in enumerate(entries)}
        table = [(e["dtype"], tuple(e["shape"]), e["device"]) for e in entries]
    except (ValueError, KeyError, TypeError) as e:
        raise CheckpointError(f"load: a snapshot's meta is not tide's ({e})") from None
    return skeleton, table


def _slots(region):
    return f"{region.own} slots" + (" and two for a peer's copy" if region.own == 3 else "")


def _wait_for_peer(region, slot, head):
    """Waits until the peer node's agent holds this rank's newest snapshot
    (in slot), so that every rank always has a step that both this node
    and its peer hold (docs/checkpoints.md, "A copy on a peer node"). The
    agent clears the region's peer field when it has no peer: no wait."""
    import time

    pause = 0.0002
    while region.peer() and not region.flags(slot) & _REPLICATED and _still(region, slot, head):
        time.sleep(pause)
        pause = min(pause * 2, 0.005)


def _held(region, rank):
    """This global rank's complete snapshots in the region, as step ->
    (slot, header); of two of the same step, the one written last."""
    held = {}
    for slot in range(region.slots):
        head = region.head(slot)
        if head is not None and head[5] == rank:
            if head[4] not in held or head[3] > held[head[4]][1][3]:
                held[head[4]] = (slot, head)
    return held


def _still(region, slot, head):
    """Whether slot still holds the complete snapshot head says (its flags
    may have changed: the agent marks it once the peer holds it)."""
    now = region.head(slot)
    return now is not None and now[3:6] == head[3:6]


def _source(region, slot, head):
    """"peer" for a peer node's copy (held here, or fetched by the agent
    from another node), else "memory"."""
    return "peer" if slot >= region.replicas_from or head[8] & _FROM_PEER else "memory"


class _Snapshot:
    """A complete snapshot in the region: its structure, and where each of
    its tensors' bytes are."""

    def __init__(self, region, slot, head):
        self.region, self.head = region, head
        self.base = region.offset(slot)
        meta_bytes = head[6]
        start = self.base + _HEADER
        self.skeleton, self.table = _read_meta(region.mm[start:start + meta_bytes])
        self.offsets = []
        end = _HEADER + _align(meta_bytes)
        for dtype, shape, _ in self.table:
            self.offsets.append(end)
            end += _align(_numel(shape) * _element_size(dtype))

    def spec(self, ref):
        dtype, shape, _ = self.table[ref.index]
        return dtype, tuple(shape)

    def view(self, ref):
        """The tensor's bytes in the region, as the tensor (no copy)."""
        import torch

        dtype, shape, _ = self.table[ref.index]
        dtype = getattr(torch, dtype)
        nbytes = _numel(shape) * _element_size(str(dtype).replace("torch.", ""))
        if nbytes == 0:
            return torch.empty(shape, dtype=dtype)
        return _bytes_view(self.region, self.base + self.offsets[ref.index], nbytes) \
            .view(dtype).view(shape)

    def into(self, t, ref):
        if t.numel() > 0:
            _copy_out(self.region, self.base + self.offsets[ref.index], t, lambda: self.view(ref))
        return t

    def new(self, ref):
        import torch

        dtype, shape, device = self.table[ref.index]
        return self.into(torch.empty(shape, dtype=getattr(torch, dtype), device=device), ref)


class _Loaded:
    """The tensors of a file that torch.load read, as _Snapshot's are used."""

    @staticmethod
    def spec(t):
        return str(t.dtype).replace("torch.", ""), tuple(t.shape)

    @staticmethod
    def into(t, loaded):
        t.copy_(loaded)
        return t

    @staticmethod
    def new(loaded):
        return loaded


def _restore(saved, target, source, is_tensor, path=()):
    """saved's state, copied into target where target has a tensor of the
    same key, shape and dtype (in place), new elsewhere; is_tensor tells
    saved's tensor leaves, whose bytes source copies."""
    import torch

    if is_tensor(saved):
        if not isinstance(target, torch.Tensor):
            return source.new(saved)
        dtype, shape = source.spec(saved)
        if tuple(target.shape) != shape or target.dtype != getattr(torch, dtype):
            raise CheckpointError(
                f"load: {_path(path)} was saved as torch.{dtype} {shape} "
                f"and is {target.dtype} {tuple(target.shape)} here")
        with torch.no_grad():
            return source.into(target, saved)
    if isinstance(saved, dict):
        out = target if isinstance(target, dict) else type(saved)()
        for k, v in saved.items():
            out[k] = _restore(v, out.get(k), source, is_tensor, path + (k,))
        return out
    if type(saved) in (list, tuple):
        fits = type(target) is list and type(saved) is list and len(target) == len(saved)
        items = [_restore(v, target[i] if fits else None, source, is_tensor, path + (i,))
                 for i, v in enumerate(saved)]
        if fits:
            target[:] = items
            return target
        return type(saved)(items)
    return saved


def _files(rank):
    """This rank's step files in TIDE_CHECKPOINT_DIR, as step -> path."""
    directory = _os.environ.get("TIDE_CHECKPOINT_DIR")
    if not directory:
        return {}
    folder = _os.path.join(directory, f"rank-{rank}")
    try:
        names = _os.listdir(folder)
    except OSError:
        return {}
    return {int(n[5:-3]): _os.path.join(folder, n) for n in names
            if n.startswith("step-") and n.endswith(".pt") and n[5:-3].isdigit()}


def _steps(steps):
    return ", ".join(str(s) for s in sorted(steps)) or "none"


def _agree(held, step, process_group):
    """The step every rank of the group loads: the newest that each of them
    holds (in memory or on disk), or the one asked for; None when no rank
    holds any. Raises CheckpointError, on every rank alike, when the ranks
    hold snapshots but none in common."""
    import torch.distributed as dist

    ranks = [held]
    if process_group is not False and dist.is_available() and dist.is_initialized():
        ranks = _gather(held, process_group)
    if step is not None:
        lacking = [r for r, h in enumerate(ranks) if step not in h]
        if lacking:
            raise CheckpointError(
                f"load: step {step} is not held by every rank (not by rank(s) "
                f"{_steps(lacking)}; this rank holds {_steps(held)})")
        return step
    common = set.intersection(*(set(h) for h in ranks))
    if common:
        return max(common)
    if any(ranks):
        raise CheckpointError(
            "load: no step is held by every rank, so none can resume in step with the "
            "others; " + "; ".join(f"rank {r}: {_steps(h)}" for r, h in enumerate(ranks)))
    return None


# The tensors of the last _gather, kept: torch < 2.8 destroys a gloo group
# holding the GIL while it joins the group's threads, and a thread that
# drops the last reference to a Python-made tensor of a finished collective
# waits for the GIL, so destroy_process_group() right after a load could
# hang for good (pytorch/pytorch#154976). Kept here, the last reference to
# them is Python's.
_gathered = None


def _gather(held, group):
    """The steps each rank of the group holds (held: this rank's, sorted),
    gathered as all_gather_object would, but with tensors this module keeps."""
    import torch
    import torch.distributed as dist

    global _gathered
    device = torch.device("cpu")
    if dist.get_backend(group) == "nccl":
        device = torch.device("cuda", torch.cuda.current_device())
    n = dist.get_world_size(group)
    count = torch.tensor([len(held)], dtype=torch.int64, device=device)
    counts = [torch.zeros(1, dtype=torch.int64, device=device) for _ in range(n)]
    dist.all_gather(counts, count, group=group)
    longest = max(max(int(c.item()) for c in counts), 1)
    mine = torch.tensor(held + [-1] * (longest - len(held)), dtype=torch.int64, device=device)
    steps = [torch.empty_like(mine) for _ in range(n)]
    dist.all_gather(steps, mine, group=group)
    _gathered = (count, counts, mine, steps)
    return [t[:int(c.item())].tolist() for t, c in zip(steps, counts)]


def load(state_dict=None, *, step=None, process_group=None):
    """The latest snapshot that every rank holds, as ``(state, step)`` with
    ``.source`` saying where this rank's came from: ``"memory"`` (the node's
    agent), ``"peer"`` (a copy of another node's, kept here or fetched by the
    agent when this node replaced a lost one), ``"disk"`` (--checkpoint-dir,
    when memory lacks it: a new job), or ``"none"`` with ``(None, None)``
    when no rank has one.

    When torch.distributed is initialized, ``load`` is collective, as
    torch.distributed.checkpoint.load is: every rank of ``process_group``
    (the default group when None) calls it, and all of them get the same
    step, the newest that each of them holds. A rank killed in the middle of
    a save holds one step less than the others; each rank keeps its two
    latest snapshots, so they meet on the older one. ``process_group=False``
    loads this rank's newest alone. ``step=N`` loads step N (CheckpointError
    when a rank lacks it).

    With ``state_dict`` (say ``model.state_dict()``, whose tensors are the
    model's own), the snapshot is copied into it in place, as
    torch.distributed.checkpoint.load does: each tensor into the tensor at
    the same key (same shape and dtype, else CheckpointError), values of
    other kinds set in its dicts and lists; ``state`` is that dict. Without
    it, ``state`` is new, its tensors on the devices they were saved from.
    """
    import torch

    region = _open()
    rank = _rank("RANK")
    with _lock:
        memory = _held(region, rank)
    files = _files(rank)
    step = _agree(sorted(set(memory) | set(files)), step, process_group)
    if step is None:
        return Loaded(None, None, "none")
    with _lock:
        slot, head = memory.get(step, (None, None))
        if slot is not None and _still(region, slot, head):
            _populate(region, region.offset(slot), _HEADER + _align(head[6]) + head[7])
            snapshot = _Snapshot(region, slot, head)
            state = _restore(snapshot.skeleton, state_dict, snapshot,
                             lambda x: isinstance(x, _Tensor))
            return Loaded(state, step, _source(region, slot, head))
    if step not in files:
        raise CheckpointError(f"load: the snapshot of step {step} was written over while "
                              "loading; call load before saving")
    # Our own writer's file, of what this job saved: as trusted as the save
    # (torch >= 2.6 would otherwise refuse non-tensor values it does not know).
    saved = torch.load(files[step], weights_only=False)
    state = _restore(saved, state_dict, _Loaded, lambda x: isinstance(x, torch.Tensor))
    return Loaded(state, step, "disk")


def _populate(region, offset, nbytes):
    """Maps the pages of [offset, offset + nbytes) in one call, far faster
    than faulting them in one by one as a copy reads them (Linux >= 5.14;
    elsewhere the copy faults them in)."""
    try:
        region.mm.madvise(_MADV_POPULATE_READ, offset, min(nbytes, region.bytes - offset))
    except (OSError, ValueError):
        pass


def _numel(shape):
    n = 1
    for d in shape:
        n *= d
    return n


@_functools.lru_cache(maxsize=None)
def _element_size(dtype):
    import torch

    return torch.empty((), dtype=getattr(torch, dtype)).element_size()


def _write_one(region, slot, head, directory, keep):
    """Writes the snapshot in slot as <directory>/rank-<R>/step-<N>.pt
    (torch.save of the state, read straight from the region) and keeps the
    last `keep` of the rank; False when the worker wrote over the slot
    meanwhile (the file is then dropped)."""
    import torch

    rank, step = head[5], head[4]
    folder = _os.path.join(directory, f"rank-{rank}")
    _os.makedirs(folder, exist_ok=True)
    final = _os.path.join(folder, f"step-{step}.pt")
    tmp = _os.path.join(folder, f".step-{step}.pt.tmp")
    try:
        snapshot = _Snapshot(region, slot, head)
        state = _restore(snapshot.skeleton, None, _Views(snapshot),
                         lambda x: isinstance(x, _Tensor))
        torch.save(state, tmp)
    except Exception:  # noqa: BLE001 - a slot written over while read
        if _still(region, slot, head):
            raise
        _unlink(tmp)
        return False
    if not _still(region, slot, head):
        _unlink(tmp)
        return False
    with open(tmp, "rb+") as f:
        _os.fsync(f.fileno())
    _os.replace(tmp, final)
    fd = _os.open(folder, _os.O_RDONLY)
    try:
        _os.fsync(fd)
    finally:
        _os.close(fd)
    steps = sorted(int(n[5:-3]) for n in _os.listdir(folder)
                   if n.startswith("step-") and n.endswith(".pt") and n[5:-3].isdigit())
    for old in steps[:-keep]:
        _unlink(_os.path.join(folder, f"step-{old}.pt"))
    return True


class _Views:
    """A snapshot's tensors as views of the region, for torch.save to write
    without a copy."""

    def __init__(self, snapshot):
        self.snapshot = snapshot

    def new(self, ref):
        return self.snapshot.view(ref)


def _unlink(path):
    try:
        _os.unlink(path)
    except FileNotFoundError:
        pass


def _write_behind(region_path, directory, keep, poll=0.05):
    """The agent's writer process: writes each rank's newest snapshot to
    `directory` whenever it changes, until SIGTERM (or the agent's end);
    then writes the newest once more and exits."""
    import signal

    region = _Region(region_path)
    agent = _os.getppid()
    stop = _threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    written = {}  # rank -> (step, seq) on disk
    while True:
        last = stop.is_set() or _os.getppid() != agent
        ranks = {}
        for slot in range(region.replicas_from):  # not a peer's copies
            head = region.head(slot)
            if head is not None:
                best = ranks.get(head[5])
                if best is None or (head[4], head[3]) > (best[1][4], best[1][3]):
                    ranks[head[5]] = (slot, head)
        for rank, (slot, head) in sorted(ranks.items()):
            if written.get(rank) != (head[4], head[3]) and \
                    _write_one(region, slot, head, directory, keep):
                written[rank] = (head[4], head[3])
        if last:
            return
        stop.wait(poll)


if __name__ == "__main__":
    import sys

    # The module itself, not this __main__ copy of it: snapshots' structures
    # hold tide.checkpoint's classes.
    from tide.checkpoint import _write_behind as write_behind

    if len(sys.argv) != 5 or sys.argv[1] != "--write-behind":
        sys.exit("usage: python -m tide.checkpoint --write-behind REGION DIR KEEP")
    write_behind(sys.argv[2], sys.argv[3], int(sys.argv[4]))
elif _os.environ.get("TIDE_CHECKPOINT_REGION") and "LOCAL_RANK" not in _os.environ:
    # A prestarted interpreter (tiderun --prestart) imports this module while
    # it waits for its worker: it maps the region then. Not its pages: it
    # does not know its rank yet, and page tables for the whole region would
    # cost every worker's exit.
    try:
        _open()
    except Exception:  # noqa: BLE001 - the worker will say what is wrong
        pass
