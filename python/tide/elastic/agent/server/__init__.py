"""The agent, as torch.distributed.elastic.agent.server: WorkerSpec,
LocalElasticAgent, RunResult, WorkerState, Worker, WorkerGroup."""
from tide.elastic.agent.server.api import (  # noqa: F401
    ElasticAgent,
    RunResult,
    Worker,
    WorkerGroup,
    WorkerSpec,
    WorkerState,
)
from tide.elastic.agent.server.local_elastic_agent import (  # noqa: F401
    TORCHELASTIC_ENABLE_FILE_TIMER,
    TORCHELASTIC_TIMER_FILE,
    LocalElasticAgent,
)
