"""Metrics, as torch.distributed.elastic.metrics: the agent's metrics (torch's
names) and the ones Python puts go to the handler configured per group.

    class MyMetricHandler(metrics.MetricHandler):
        def emit(self, metric_data: metrics.MetricData):
            ...
    metrics.configure(MyMetricHandler())
"""
from tide.elastic.metrics.api import (  # noqa: F401
    ConsoleMetricHandler,
    MetricData,
    MetricHandler,
    MetricStream,
    NullMetricHandler,
    configure,
    getStream,
    prof,
    put_metric,
)
