"""Rank body for tests/test_pytorch_context.py: DDP + gradient aggregation over two gloo processes."""

from __future__ import annotations

from typing import Any

import torch

import determined_trials as det
from determined_trials.pytorch._context import PyTorchTrialContext

# rank -> [(x, y) of batch 0, (x, y) of batch 1]; loss (w*x - y)^2, gradient 2(w*x - y)x at w=1
DATA = {0: [(1.0, 3.0), (2.0, 0.0)], 1: [(3.0, 3.0), (2.0, -1.0)]}
CONFIG = {"searcher": {"name": "single", "metric": "loss", "max_length": 2},
          "optimizations": {"aggregation_frequency": 2}}


def ddp_aggregation(dist: Any, store_file: str, run_dir: str) -> dict[str, Any]:
    """Two batches, aggregation 2: batch 0 must not all-reduce, batch 1 steps with the average.
    The process group meets in a file of the test's own folder: no TCP port another job could take."""
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{store_file}", rank=dist.rank, world_size=dist.size
    )
    try:
        with det.core.init(distributed=dist, run_dir=run_dir, config=CONFIG) as core:
            ctx = PyTorchTrialContext(core_context=core)
            inner = torch.nn.Linear(1, 1, bias=False)
            inner.tag = "inner-attribute"  # type: ignore[assignment]
            torch.nn.init.ones_(inner.weight)
            model = ctx.wrap_model(inner)
            opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
            grads, stepped = [], []
            for batch_idx, (x, y) in enumerate(DATA[dist.rank]):
                ctx._start_batch(batch_idx, 10)
                loss = ((model(torch.tensor([[x]])) - y) ** 2).sum()
                ctx.backward(loss)
                grad = inner.weight.grad
                grads.append(None if grad is None else float(grad))
                ctx.step_optimizer(opt)
                stepped.append(ctx._optimizer_stepped_this_batch)
                ctx._end_batch()
            result = {"wrapper": type(model).__name__, "tag": model.tag, "grads": grads,
                    "stepped": stepped, "weight": inner.weight.item()}
    finally:
        torch.distributed.destroy_process_group()
    return result
