"""Trials on a Ray cluster (``det-trials experiment create --ray``): the executor (``_executor``:
``RayExecutor``, ``ray_runner_options``), one actor a node for each trial (``_node``: ``TrialActor``), how
a trial is spread over nodes (``_layout``), a running trial's actors (``_handle``) and the files that travel
back (``_files``: TensorBoard). Ray is imported only here, and only inside functions: only ``--ray`` pays
for it; the runner imports this room lazily.

May import: core.channel, core.store, launch, experiment
"""

from determined_trials.experiment.ray._executor import ray_runner_options

__all__ = [
    "ray_runner_options",
]
