"""What tide's tests must know of the torch this interpreter imports.

torch >= 2.4 makes every TCPStore with its libuv backend unless told not to,
and a torch built without libuv (Debian's 2.6) then fails each one: a
program that makes a store itself must pass ``use_libuv=False`` there (or
set ``USE_LIBUV=0`` where torch reads it), as a user of that torch does.

As a script, prints 1 when this torch lacks libuv, else 0 (CMake asks it
at configure time).
"""

import functools
import importlib.util


@functools.cache
def lacks_libuv():
    if importlib.util.find_spec("torch") is None:
        return False
    import torch
    import torch.distributed as dist

    major, minor = (int(x) for x in torch.__version__.split(".")[:2])
    if (major, minor) < (2, 4):
        return False
    try:
        dist.TCPStore("127.0.0.1", 0, 1, True, use_libuv=True, wait_for_workers=False)
    except RuntimeError as e:
        if "libuv" in str(e):
            return True
        raise
    return False


def store_kwargs():
    """What to add to a TCPStore(...) call for this torch."""
    return {"use_libuv": False} if lacks_libuv() else {}


if __name__ == "__main__":
    print(1 if lacks_libuv() else 0)
