"""MetricHandler, MetricData, configure, put_metric and prof, as
torch.distributed.elastic.metrics.api. Handlers are held by tide's C++ metrics
(the agent's own metrics reach a Python handler with the GIL taken for each
emit); an exception a handler raises is logged and the caller goes on."""
import abc
import atexit
import functools
import time
from typing import Dict, Optional

from tide import _elastic

_DEFAULT_GROUP = "torchelastic"


class MetricData:
    __slots__ = ["timestamp", "group_name", "name", "value"]

    def __init__(self, timestamp: float, group_name: str, name: str, value: int) -> None:
        self.timestamp = timestamp
        self.group_name = group_name
        self.name = name
        self.value = value

    def __repr__(self) -> str:
        return (f"MetricData(timestamp={self.timestamp}, group_name={self.group_name!r}, "
                f"name={self.name!r}, value={self.value})")


class MetricHandler(abc.ABC):
    @abc.abstractmethod
    def emit(self, metric_data: MetricData) -> None:
        ...


class ConsoleMetricHandler(MetricHandler):
    """Prints "[<timestamp>][<group>]: <name>=<value>" (tide's C++ handler)."""

    def emit(self, metric_data: MetricData) -> None:
        print(f"[{metric_data.timestamp}][{metric_data.group_name}]: "
              f"{metric_data.name}={metric_data.value}")


class NullMetricHandler(MetricHandler):
    """Drops every metric (the default)."""

    def emit(self, metric_data: MetricData) -> None:
        pass


_handlers: Dict[Optional[str], MetricHandler] = {}


def configure(handler: MetricHandler, group: Optional[str] = None) -> None:
    """Sends the metrics of `group` (every group without a handler of its own
    when None) to handler."""
    _handlers[group] = handler
    if type(handler) is NullMetricHandler:
        native = "null"
    elif type(handler) is ConsoleMetricHandler:
        native = "console"
    else:
        def native(timestamp, group_name, name, value):
            handler.emit(MetricData(timestamp, group_name, name, value))
    _elastic.configure_metrics(native, group or "")


def getStream(group: str) -> "MetricStream":
    return MetricStream(group, _handlers.get(group) or _handlers.get(None)
                        or NullMetricHandler())


class MetricStream:
    def __init__(self, group_name: str, handler: MetricHandler) -> None:
        self.group_name = group_name
        self.handler = handler

    def add_value(self, metric_name: str, metric_value: int) -> None:
        put_metric(metric_name, metric_value, self.group_name)


def put_metric(metric_name: str, metric_value: int,
               metric_group: str = _DEFAULT_GROUP) -> None:
    """Emits one metric now to its group's handler."""
    _elastic.put_metric(metric_name, int(metric_value), metric_group)


def prof(fn=None, group: str = _DEFAULT_GROUP):
    """Decorates a function: puts <name>.success or .failure (1) and
    <name>.duration.ms for each call, <name> being Class.method or
    module.function."""

    def wrap(f):
        # torch's naming: Class.method, or module.function (the module's last
        # component).
        key = f.__qualname__
        if "." not in key and f.__module__:
            key = f"{f.__module__.split('.')[-1]}.{key}"

        @functools.wraps(f)
        def wrapper(*args, **kwargs):
            start = time.time()
            try:
                result = f(*args, **kwargs)
                put_metric(f"{key}.success", 1, group)
                return result
            except Exception:
                put_metric(f"{key}.failure", 1, group)
                raise
            finally:
                put_metric(f"{key}.duration.ms", int((time.time() - start) * 1000), group)

        return wrapper

    return wrap(fn) if fn else wrap


@atexit.register
def _drop_python_handlers() -> None:
    # The C++ side outlives the interpreter: it must not call into it then.
    for group in list(_handlers):
        _elastic.configure_metrics("null", group or "")
