"""What the tests share: the ``support`` package of helpers (``helpers_*``: ``from support.helpers_launch import
Launch``), and beside them the files the tests run rather than import as helpers: trial classes (``trials_*``),
worker scripts (``worker_*``) and rank bodies (``ranks_*``). Those are run by path, copied into context folders
and imported by their file name in other processes (``--trial trials_keras.py:MLPTrial``), so they are imported
by that name everywhere (``from trials_pytorch import ResumeTrial``), never as ``support.trials_*``: one module,
one name. tests/README.md says more."""
