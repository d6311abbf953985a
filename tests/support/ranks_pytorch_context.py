"""Rank bodies for tests/pytorch/test_pytorch_context.py: DDP + gradient aggregation over two gloo processes; the
reducer calls Determined code makes by hand (reduce_metrics, run_cross_slot_reduction) over two processes."""

from __future__ import annotations

from typing import Any

import torch

import determined_trials as det
from determined_trials.loop import Clock
from determined_trials.pytorch import PyTorchTrialContext

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
            ctx = PyTorchTrialContext(core_context=core, device="cpu")  # CPU tensors, gloo: on the CPU anywhere
            inner = torch.nn.Linear(1, 1, bias=False)
            inner.tag = "inner-attribute"  # type: ignore[assignment]
            torch.nn.init.ones_(inner.weight)
            model = ctx.wrap_model(inner)
            opt = ctx.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))
            grads, stepped = [], []
            for batch_idx, (x, y) in enumerate(DATA[dist.rank]):
                clock = Clock(batches_trained=batch_idx)  # the batch loop's clock at this batch
                clock.start(10)
                clock.begin()
                ctx._read_clock(clock.view)
                ctx._start_batch()
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


def reducers_by_hand(dist: Any, run_dir: str) -> dict[str, Any]:
    """Rank r updates a sum reducer with r + 1 and r + 10 and a validation-only list reducer with r:
    ``reduce_metrics`` on every rank, and ``run_cross_slot_reduction`` of what the chief gathered."""
    with det.core.init(distributed=dist, run_dir=run_dir, config=CONFIG) as core:
        ctx = PyTorchTrialContext(core_context=core, device="cpu")
        total = ctx.wrap_reducer(sum, name="total", for_validation=False)
        seen = ctx.wrap_reducer(lambda values: sorted(values), name="seen", for_training=False)
        total.update(dist.rank + 1)
        total.update(dist.rank + 10)
        seen.update(dist.rank)
        training, validation = ctx.reduce_metrics(for_training=True), ctx.reduce_metrics(for_training=False)
        gathered = dist.gather([total.per_slot_reduce(), seen.per_slot_reduce()])
        by_hand = None if gathered is None else ctx.run_cross_slot_reduction([total, seen], gathered)
        ctx.reset_reducers()
        after_reset = ctx.reduce_metrics(for_training=True)
    return {"training": training, "validation": validation, "by_hand": by_hand, "after_reset": after_reset}
