"""The bytes and values of a state as one hash: for checkpoint_test.py's
worker, and for reading a written snapshot with torch alone."""
import hashlib

import torch


def digest(obj):
    """The bytes and values of a state, as one hash."""
    h = hashlib.sha256()

    def walk(o):
        if isinstance(o, torch.Tensor):
            h.update(f"T{o.dtype}{tuple(o.shape)}{o.device}".encode())
            h.update(o.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        elif isinstance(o, dict):
            h.update(f"D{type(o).__name__}".encode())
            for k, v in o.items():
                h.update(repr(k).encode())
                walk(v)
        elif isinstance(o, (list, tuple)):
            h.update(f"L{type(o).__name__}{len(o)}".encode())
            for v in o:
                walk(v)
        else:
            h.update(repr(o).encode())

    walk(obj)
    return h.hexdigest()
