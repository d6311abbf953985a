"""Models over several processes: DistributedDataParallel (``_ddp``: wrapping, no gradient sync on
the batches that only accumulate, the user's module and its plain state dict), FSDP2 models (``_fsdp``:
recognising them, their checks, DCP checkpoint folders) and the gradients FSDP2 accumulates between two
optimizer steps (``_fsdp_grads``).

Only torch.

May import: nothing
"""
