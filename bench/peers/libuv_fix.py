"""TCPStore's default use_libuv following USE_LIBUV, for a torch that asks for
libuv by default and was built without it (Debian 13's 2.6).

There, torchrun's rendezvous, and its workers' env:// path under the agent's
store, make a TCPStore without saying use_libuv, whatever USE_LIBUV says, and
fail ("use_libuv was requested but PyTorch was build without libuv
support"). follow_use_libuv() makes the default what USE_LIBUV says, as
torch's own env:// path reads it; with USE_LIBUV=0 they work. A no-op for a
torch whose TCPStore has no use_libuv (1.13).

bench/peers/torchrun.py applies it to the launcher, bench/launch/ddp_step.py
to the workers (under either launcher, at no measurable cost): a user of that
torch would need the same two fixes. bench/peers/torch_store_server.py
applies it to torch's store server.
"""
import os
import sys

import torch.distributed as dist


def follow_use_libuv():
    original = dist.TCPStore
    if "use_libuv" not in (original.__init__.__doc__ or ""):
        return
    use_libuv = os.environ.get("USE_LIBUV", "1") != "0"

    class TCPStore(original):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("use_libuv", use_libuv)
            super().__init__(*args, **kwargs)

    # torch.distributed and its Python modules that took the class by name.
    for name, module in list(sys.modules.items()):
        if (name.startswith("torch.distributed") and
                getattr(module, "TCPStore", None) is original and
                getattr(module, "__file__", "").endswith(".py")):
            module.TCPStore = TCPStore
