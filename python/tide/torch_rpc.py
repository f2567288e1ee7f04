"""tide's transport as a backend of torch.distributed.rpc.

Importing this module registers the backend ``TIDE``; a program switches to it
with one word::

    import torch.distributed.rpc as rpc
    import tide.torch_rpc

    rpc.init_rpc("worker0", rank=0, world_size=2, backend=rpc.BackendType.TIDE)

torch's own frontend runs unchanged on it (rpc_sync, rpc_async, remote, RRefs,
distributed autograd, DistributedOptimizer, RemoteModule); tide's agent carries
the messages: shared memory between processes of a host, TCP (with lanes for
large tensors) between hosts. See docs/rpc.md, "From Python".
"""
import ipaddress
import os
import socket
import urllib.parse

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc
from torch.distributed.rpc import api, backend_registry, constants

from ._torch_rpc_built_for import TORCH_VERSION as _BUILT_FOR

# The module links torch's C++ library, whose interface changes from one
# release to the next: loaded into another torch it would fail on a missing
# symbol, or worse, load.
if torch.__version__ != _BUILT_FOR:
    raise ImportError(
        f"tide.torch_rpc was built for torch {_BUILT_FOR}, but this interpreter has torch "
        f"{torch.__version__}: build tide again against it (pip install . in this "
        "environment, or scripts/build.sh)")

from . import _torch_rpc  # noqa: E402

__all__ = ["TideRpcBackendOptions", "TideAgent", "BACKEND"]

TideAgent = _torch_rpc.TideAgent


class TideRpcBackendOptions(_torch_rpc.TideRpcBackendOptions):
    """Options of the TIDE backend, mirroring TensorPipeRpcBackendOptions.

    Args:
        num_worker_threads: threads serving requests and completing futures (16).
        rpc_timeout: default timeout of a call, in seconds (60; 0: none).
        init_method: where the workers meet ("env://", "tcp://host:port",
            "file://path"), as torch's.
        transports: ["shm", "tcp"] (default) or ["tcp"]: shm carries messages
            between processes of one host and network namespace.
        lanes: extra TCP connections a tensor of 1 MiB or more is cut over (2).
        token: a shared secret every worker proves it holds, never sent
            (empty, the default: the environment's TIDE_RPC_TOKEN, which
            tiderun sets for its workers).
        poll_us: how long idle threads poll before they sleep (300 us).
        listen_host: the address to listen on (default: TIDE_RPC_LISTEN_HOST,
            else the local address that routes to the init_method's host,
            127.0.0.1 for a local or file:// one).
        device_maps, devices: not supported (CPU tensors only); a non-empty
            value is an error.
    """

    def __init__(
        self,
        *,
        num_worker_threads=constants.DEFAULT_NUM_WORKER_THREADS,
        rpc_timeout=constants.DEFAULT_RPC_TIMEOUT_SEC,
        init_method=constants.DEFAULT_INIT_METHOD,
        transports=None,
        lanes=2,
        token=None,
        poll_us=300,
        listen_host=None,
        device_maps=None,
        devices=None,
    ):
        super().__init__()
        if device_maps or devices:
            raise ValueError(
                "the TIDE rpc backend carries CPU tensors only; device_maps and "
                "devices are not supported (use the TENSORPIPE backend for CUDA)"
            )
        if rpc_timeout < 0:
            raise ValueError(f"rpc_timeout must be >= 0 seconds, got {rpc_timeout}")
        self.rpc_timeout = rpc_timeout
        self.init_method = init_method
        self.num_worker_threads = num_worker_threads
        self.transports = list(transports) if transports is not None else ["shm", "tcp"]
        self.lanes = lanes
        self.token = token or ""
        self.poll_us = poll_us
        self.listen_host = listen_host or ""

    @property
    def device_maps(self):
        return {}

    @property
    def devices(self):
        return []

    def set_device_map(self, to, device_map):
        raise ValueError(
            "the TIDE rpc backend carries CPU tensors only; set_device_map is not "
            "supported (use the TENSORPIPE backend for CUDA)"
        )

    def set_devices(self, devices):
        self.set_device_map(None, None)


def _route_to(host, port):
    """The local address the kernel would use to reach host:port."""
    try:
        ip = ipaddress.ip_address(socket.gethostbyname(host))
        if ip.is_loopback:
            return "127.0.0.1"
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect((str(ip), int(port or 1)))
            return s.getsockname()[0]
    except (OSError, ValueError):
        return "127.0.0.1"


def _listen_host(options):
    if options.listen_host:
        return options.listen_host
    if os.environ.get("TIDE_RPC_LISTEN_HOST"):
        return os.environ["TIDE_RPC_LISTEN_HOST"]
    url = urllib.parse.urlparse(options.init_method)
    if url.scheme == "env":
        return _route_to(os.environ.get("MASTER_ADDR", "127.0.0.1"), os.environ.get("MASTER_PORT"))
    if url.scheme == "tcp" and url.hostname:
        return _route_to(url.hostname, url.port)
    return "127.0.0.1"


def _construct_options_handler(rpc_timeout, init_method, num_worker_threads=constants.DEFAULT_NUM_WORKER_THREADS, **kwargs):
    return TideRpcBackendOptions(
        rpc_timeout=rpc_timeout,
        init_method=init_method,
        num_worker_threads=num_worker_threads,
        **kwargs,
    )


def _init_backend_handler(store, name, rank, world_size, rpc_backend_options):
    if not isinstance(store, dist.Store):
        raise TypeError(f"`store` must be a c10d::Store, got {store!r}")
    if not isinstance(rpc_backend_options, _torch_rpc.TideRpcBackendOptions):
        raise TypeError(
            "`rpc_backend_options` of the TIDE backend must be a "
            f"tide.torch_rpc.TideRpcBackendOptions, got {type(rpc_backend_options).__name__}"
        )
    if not world_size:
        raise ValueError(
            "the TIDE rpc backend needs world_size (a static group); dynamic "
            "groups that workers join and leave are not supported"
        )
    rpc_backend_options.listen_host = _listen_host(rpc_backend_options)
    agent = TideAgent(store, name, rank, world_size, rpc_backend_options)
    api._init_rpc_states(agent)
    return agent


def _register():
    if not backend_registry.backend_registered("TIDE"):
        backend_registry.register_backend("TIDE", _construct_options_handler, _init_backend_handler)
    # register_backend replaces the enum inside backend_registry only:
    # torch.distributed.rpc.BackendType would still be the old one, and
    # init_rpc would reject even its TENSORPIPE member.
    rpc.BackendType = backend_registry.BackendType
    return backend_registry.BackendType["TIDE"]


BACKEND = _register()
