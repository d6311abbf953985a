"""The ``det-trials`` command: experiments, trials and checkpoints of a run folder (``main`` parses the
arguments; one module per command group; tables, logs, kill and delete).

May import any room below it (``ui``, ``experiment``, ``launch``, ``core`` and its store, ``config``); ``ui`` only
inside ``det-trials ui`` (its starlette and uvicorn are an extra).
"""
