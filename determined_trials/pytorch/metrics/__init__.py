"""Metrics of a PyTorch workload: the reducers a trial registers (``_reducer``: ``Reducer``,
``MetricReducer`` and the registry), the per-key device accumulators (``_accumulator``) and the training
and validation metrics built on them (``_metrics``), reduced across ranks by ``loop.reduce_across_ranks``.

Only torch and numpy.

May import: nothing
"""

from determined_trials.pytorch.metrics._metrics import TrainingMetrics, ValidationMetrics
from determined_trials.pytorch.metrics._reducer import MetricReducer, Reducer, ReducerRegistry

__all__ = [
    "MetricReducer",
    "Reducer",
    "ReducerRegistry",
    "TrainingMetrics",
    "ValidationMetrics",
]
