"""Starting DeepSpeed's communication: gloo on CPU, nccl on CUDA, one process or a launcher's ranks.

``$DET_DEEPSPEED_SHM_COMM=0`` skips DeepSpeed's shared-memory collective op on CPU, whose first use
JIT-compiles a C++ extension (~35 s once per machine, cached in ``$TORCH_EXTENSIONS_DIR``); gloo
then does every collective. The test suite sets it.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket

import torch

from determined_trials import core
from determined_trials.deepspeed._logs import quiet_deepspeed_logs
from determined_trials.pytorch import collective_timeout

__all__ = ["SHM_COMM_ENV", "start_deepspeed_distributed"]

SHM_COMM_ENV = "DET_DEEPSPEED_SHM_COMM"
logger = logging.getLogger("determined_trials.deepspeed")


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _skip_shm_op_if_asked() -> None:
    raw = os.environ.get(SHM_COMM_ENV, "1").strip().lower()
    if raw not in ("0", "false", "no", "off"):
        return
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False  # DeepSpeed then uses gloo only


def _tell_the_local_size() -> None:
    """Under torchrun (or ``launch.torch_distributed``) set ``LOCAL_SIZE``, the ranks on this machine as
    DeepSpeed's own launcher sets it, from ``LOCAL_WORLD_SIZE``: without it DeepSpeed's CPU accelerator counts
    its devices by running ``numactl --hardware``, a process forked in every ZeRO-3 backward (about 1 ms a
    batch). A lone process sets nothing: a job it launched later would inherit the variable."""
    local = os.environ.get("LOCAL_WORLD_SIZE")
    if local:
        os.environ.setdefault("LOCAL_SIZE", local)


def start_deepspeed_distributed() -> core.DistributedContext | None:
    """Initialise torch.distributed through DeepSpeed (once per process) and return the job's
    DistributedContext, or None for a job of one process.

    Under a launcher (torchrun, ``deepspeed``: MASTER_ADDR and RANK set), also of one slot, the process
    group comes from the environment (torchrun's workers must use its agent's store); a lone process gets
    a group of one on a free loopback port (``deepspeed.initialize`` needs one) and ``LOCAL_RANK=0``, which
    DeepSpeed requires.
    """
    quiet_deepspeed_logs()  # also when the trial's own module imported deepspeed first
    import deepspeed
    import torch.distributed as dist

    _skip_shm_op_if_asked()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    timeout = datetime.timedelta(seconds=collective_timeout())
    size = int(os.environ.get("WORLD_SIZE", "1") or 1)
    launched = "MASTER_ADDR" in os.environ and "RANK" in os.environ  # also of one slot: env:// (its store)
    if size <= 1 and not launched and not dist.is_initialized():
        os.environ.setdefault("LOCAL_RANK", "0")
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1,
                                timeout=timeout)
    os.environ.setdefault("LOCAL_RANK", "0")
    _tell_the_local_size()
    deepspeed.init_distributed(dist_backend=backend, auto_mpi_discovery=False, timeout=timeout, verbose=False)
    if size <= 1:
        return None
    return core.DistributedContext.from_deepspeed()
