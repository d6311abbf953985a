"""A PyTorchTrial's checkpoint files: what they hold and how they are written and read back.

Owns the checkpoint I/O (``_io``: ``state_dict.pth``, ``load_data.json``, RNG states, the large-state
template), the host buffers of background checkpoints (``_snapshot``) and FSDP2's sharded checkpoints
through torch.distributed.checkpoint (``_dcp``, imported only when used). The DeepSpeed adapter and
``det-trials`` use it too.

Imports ``pytorch`` only for the trial and context types; ``pytorch.parallel`` for the user's module under
DDP, ``torch.compile`` and FSDP2.

May import: _trial_context, loop, pytorch, pytorch.parallel
"""
