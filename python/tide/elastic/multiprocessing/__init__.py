"""torch.distributed.elastic.multiprocessing's names used around the agent:
Std (which streams go to log files), LogsSpecs and DefaultLogsSpecs (torch
>= 2.3: where they go), SignalException, and errors."""
from tide.elastic.multiprocessing.api import (  # noqa: F401
    DefaultLogsSpecs,
    LogsSpecs,
    SignalException,
    Std,
)
from tide.elastic.multiprocessing.errors import ProcessFailure, record  # noqa: F401
