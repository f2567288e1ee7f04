"""torch's RPC test fixture for the TIDE backend (tide.torch_rpc).

torch's generic suites (torch.testing._internal.distributed.rpc_utils) run
against any backend through a fixture naming it and its options, like torch's
own TensorPipeRpcAgentTestFixture.
"""
import torch.distributed.rpc as rpc
from torch.testing._internal.distributed.rpc.rpc_agent_test_fixture import RpcAgentTestFixture

import tide.torch_rpc  # noqa: F401  registers BackendType.TIDE

# What a call fails with when its peer or this agent goes away.
SHUTDOWN_ERRORS = [
    "connection to .* lost",
    "failed to send to",
    "shut down before the reply came",
    "RPC is no longer running",
]


class TideRpcAgentTestFixture(RpcAgentTestFixture):
    @property
    def rpc_backend(self):
        return rpc.backend_registry.BackendType["TIDE"]

    @property
    def rpc_backend_options(self):
        return rpc.backend_registry.construct_rpc_backend_options(
            self.rpc_backend, init_method=self.init_method
        )

    def get_shutdown_error_regex(self):
        return "|".join(f"({e})" for e in SHUTDOWN_ERRORS)

    def get_timeout_error_regex(self):
        return "RPC ran for more than"
