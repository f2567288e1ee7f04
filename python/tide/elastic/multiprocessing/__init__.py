"""torch.distributed.elastic.multiprocessing's names used around the agent:
Std (which streams go to log files), SignalException, and errors."""
from tide.elastic.multiprocessing.api import SignalException, Std  # noqa: F401
from tide.elastic.multiprocessing.errors import ProcessFailure, record  # noqa: F401
