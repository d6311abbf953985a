"""Resuming a DeepSpeedTrial checkpoint on another number of ranks: each ZeRO engine folder is converted to
DeepSpeed's universal checkpoint format (``ds_to_universal``) and the engines load it with
``load_universal_checkpoint`` on, which cuts every parameter's fp32 weights and Adam state anew for this
job's ranks. The conversion is done once per machine (its local chief) in a temporary folder."""

from __future__ import annotations

import argparse
import contextlib
import io
import logging
import re
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from determined_trials.deepspeed._context import DeepSpeedTrialContext

__all__ = ["saved_world_size", "universal_view"]

logger = logging.getLogger("determined_trials.deepspeed")

_RANK_FILE = re.compile(r"^det_state_rank(\d+)\.pth$")
_ENGINE_DIR = re.compile(r"^model\d+$")


def saved_world_size(path: Path) -> int:
    """How many ranks wrote the checkpoint folder ``path`` (its ``det_state_rank<R>.pth`` files)."""
    ranks = [int(m.group(1)) for f in path.iterdir() if (m := _RANK_FILE.match(f.name))]
    if not ranks:
        raise FileNotFoundError(f"{path} has no det_state_rank<R>.pth: it is not a DeepSpeedTrial checkpoint")
    return max(ranks) + 1


def _is_zero_folder(folder: Path) -> bool:
    return folder.is_dir() and any(folder.glob("*optim_states.pt")) and any(folder.glob("zero_pp_rank_*"))


def _convert(engine_dir: Path, out: Path) -> None:
    """``ds_to_universal`` of one engine folder, in this process (no worker pool), its prints kept out of the log.
    A plain model's ZeRO-1/2 checkpoint lacks the ``universal_checkpoint_info`` that Megatron-style clients
    write; ``inject_missing_state`` adds its version entry, all a model without tensor parallelism needs."""
    from deepspeed.checkpoint import ds_to_universal

    args = argparse.Namespace(input_folder=str(engine_dir), output_folder=str(out), num_extract_workers=1,
                              num_merge_workers=1, keep_temp_folder=False, strict=True, inject_missing_state=True)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(printed):
        ds_to_universal.main(args)
    logger.debug("ds_to_universal %s:\n%s", engine_dir, printed.getvalue())


def _build_view(path: Path) -> str:
    """A temporary folder mirroring ``path``: ZeRO engine folders converted, every other entry linked."""
    view = Path(tempfile.mkdtemp(prefix="det-ds-universal-"))
    for entry in sorted(path.iterdir()):
        if _ENGINE_DIR.match(entry.name) and _is_zero_folder(entry):
            _convert(entry, view / entry.name)
        else:
            (view / entry.name).symlink_to(entry.resolve())
    return str(view)


@contextlib.contextmanager
def universal_view(path: Path, context: DeepSpeedTrialContext) -> Iterator[Path]:
    """The checkpoint ``path`` as a folder whose ZeRO engine checkpoints are universal, with every wrapped
    engine set to load universal checkpoints while inside (``trial.load`` then reshards as it loads)."""
    dist = context.distributed
    if context.use_pipeline_parallel:
        raise RuntimeError(f"checkpoint {path} was written by {saved_world_size(path)} rank(s); a pipeline engine "
                           f"resumes only on as many ranks (this job has {dist.get_size()})")
    view: str | None = None
    error: str | None = None
    if dist.get_local_rank() == 0:
        try:
            view = _build_view(path)
        except Exception as exc:  # every rank must learn of it, not wait for a folder
            error = f"{type(exc).__name__}: {exc}"
    view, error = dist.broadcast_local((view, error))
    if error is not None:
        raise RuntimeError(f"could not convert checkpoint {path} to DeepSpeed's universal format to resume it on "
                           f"{dist.get_size()} rank(s): {error}")
    assert view is not None
    engines: list[Any] = [e for e in context.models if e.zero_optimization_stage() > 0]
    for engine in engines:
        engine._config.load_universal_checkpoint = True
    try:
        yield Path(view)
    finally:
        for engine in engines:
            engine._config.load_universal_checkpoint = False
        dist.allgather_local(None)  # every local rank has read the view
        if dist.get_local_rank() == 0:
            shutil.rmtree(view, ignore_errors=True)
