"""TensorBoard files a trial's ranks wrote on a Ray node, brought back to the runner's run folder: the
node packs the trial's folders under ``<run folder>/tensorboard/`` after its part ended, the runner
adds the files it does not have yet (on a run folder every node shares, nothing)."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

__all__ = ["MAX_TENSORBOARD_BYTES", "merge_tensorboard", "pack_tensorboard"]

MAX_TENSORBOARD_BYTES = 256 * 1024 * 1024  # what one node sends back at most (larger: left on the node)


def _trial_folders(run_dir: Path, experiment_id: int, trial_id: int) -> list[Path]:
    parent = run_dir / "tensorboard" / f"experiment_{experiment_id}"
    if not parent.is_dir():
        return []
    name = f"trial_{trial_id}"
    return sorted(p for p in parent.iterdir() if p.is_dir() and (p.name == name or p.name.startswith(name + "-")))


def pack_tensorboard(run_dir: Path, experiment_id: int, trial_id: int) -> bytes:
    """The trial's TensorBoard folders on this node as a gzipped tar (paths relative to ``run_dir``);
    empty when there are none or they are larger than ``MAX_TENSORBOARD_BYTES``."""
    folders = _trial_folders(run_dir, experiment_id, trial_id)
    files = [f for folder in folders for f in folder.rglob("*") if f.is_file()]
    if not files or sum(f.stat().st_size for f in files) > MAX_TENSORBOARD_BYTES:
        return b""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for path in files:
            tar.add(path, arcname=str(path.relative_to(run_dir)), recursive=False)
    return buffer.getvalue()


def merge_tensorboard(archive: bytes, run_dir: Path) -> list[Path]:
    """Add the archive's files that ``run_dir`` lacks (or holds with another size); the paths added.
    Only regular files under ``tensorboard/`` are taken."""
    if not archive:
        return []
    added: list[Path] = []
    with tarfile.open(fileobj=io.BytesIO(archive), mode="r:gz") as tar:
        for member in tar.getmembers():
            parts = Path(member.name).parts
            if not member.isfile() or not parts or parts[0] != "tensorboard" or ".." in parts:
                continue
            target = run_dir / member.name
            if target.is_file() and target.stat().st_size == member.size:
                continue
            source = tar.extractfile(member)
            if source is None:
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source.read())
            added.append(target)
    return added
