"""tide: a native runtime for fault-tolerant and elastic distributed training.

From Python, tide serves as a backend of torch.distributed.rpc
(``import tide.torch_rpc`` registers ``torch.distributed.rpc.BackendType.TIDE``)
and as ``tide.elastic``, torch.distributed.elastic's API on tide's C++ agent.
"""

import os as _os
import socket as _socket
import threading as _threading

_beat_lock = _threading.Lock()
_beat_socket = None


def heartbeat(step=None):
    """Tells the agent this worker is alive and, with ``step``, which training
    step it has reached (so the agent can time its steps and flag it as a
    straggler; docs/observability.md#stragglers). Cheap: one datagram, never
    blocking (dropped when the agent's queue is full).

    Returns False, doing nothing, outside a tide agent that takes heartbeats
    (no ``TIDE_HEARTBEAT_SOCKET``). Raises ValueError for a negative step and
    OSError when the agent cannot be reached.
    """
    global _beat_socket
    path = _os.environ.get("TIDE_HEARTBEAT_SOCKET")
    if not path:
        return False
    if step is not None and (not isinstance(step, int) or step < 0):
        raise ValueError(f"heartbeat: step must be an int >= 0, got {step!r}")
    data = b"." if step is None else str(step).encode()
    with _beat_lock:
        if _beat_socket is None:
            s = _socket.socket(_socket.AF_UNIX, _socket.SOCK_DGRAM)
            s.connect(path)
            s.setblocking(False)
            _beat_socket = s
        try:
            _beat_socket.send(data)
        except BlockingIOError:
            pass  # the agent's queue is full of fresh beats
    return True
