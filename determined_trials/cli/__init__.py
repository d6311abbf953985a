"""The ``det-trials`` command: experiments, trials and checkpoints of a run folder (``main`` parses the
arguments; one module per command group; tables, logs, kill and delete).

Any room below it; ``ui`` only inside ``det-trials ui`` (its starlette and uvicorn are an extra).

May import: errors, _info, _compat, _format, config, core.*, loop, _trial_context,
searcher, pytorch.*, deepspeed, keras, testing, launch, experiment.*, ui, determined_trials
"""
