"""Saves one checkpoint, then writes a second one slowly until the test SIGKILLs it.

Usage: python worker_ckpt_kill.py <storage spec (dir or JSON)> <store_path|upload>
Prints JSON lines: {"first": id}, {"second": id} (store_path only), then "writing" once bytes flow.
"""

from __future__ import annotations

import hashlib
import json
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from determined_trials.core import CheckpointContext
from determined_trials.core._distributed import dummy_distributed
from determined_trials.core.storage import storage_from_spec

CHUNK = 1 << 20


def payload(seed: int, size: int) -> bytes:
    return random.Random(seed).randbytes(size)


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def say(obj: Any) -> None:
    print(json.dumps(obj) if not isinstance(obj, str) else obj, flush=True)


def write_slowly(path: Path) -> None:
    with open(path, "wb") as f:
        for i in range(100_000):
            f.write(payload(i, CHUNK))
            f.flush()
            if i == 2:
                say("writing")
            time.sleep(0.02)


def slow_put(storage: Any) -> None:
    """Make every bucket upload of a file slow, announcing when the first file has landed."""
    original = storage.put

    def put(storage_id: str, rank: int, src: Path, files: list[str]) -> None:
        for n, rel in enumerate(files):
            original(storage_id, rank, src, [rel])
            if n == 1:
                say("writing")
            time.sleep(0.2)

    storage.put = put


def main() -> None:
    spec: Any = sys.argv[1]
    if spec.startswith("{"):
        spec = json.loads(spec)
    storage = storage_from_spec(spec, default_dir=Path("unused"))
    ctx = CheckpointContext(dummy_distributed(), storage)
    with ctx.store_path({"steps_completed": 1}) as (path, first):
        (path / "sub").mkdir()
        (path / "model.bin").write_bytes(payload(-1, 3 * CHUNK + 17))
        (path / "sub" / "opt.bin").write_bytes(payload(-2, 1234))
    say({"first": first, "model": digest(payload(-1, 3 * CHUNK + 17)), "opt": digest(payload(-2, 1234))})
    if sys.argv[2] == "store_path":
        with ctx.store_path({"steps_completed": 2}) as (path, second):
            say({"second": second})
            write_slowly(path / "model.bin")
    else:
        slow_put(storage)
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(200):
                Path(tmp, f"part-{i:03d}.bin").write_bytes(payload(i, 1000))
            ctx.upload(tmp, {"steps_completed": 2})
    say("finished (unexpected)")


if __name__ == "__main__":
    main()
