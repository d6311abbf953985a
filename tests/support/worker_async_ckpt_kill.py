"""Trains trials_pytorch.ResumeTrial with a checkpoint every 2 batches until the test SIGKILLs it.

Usage: worker_async_ckpt_kill.py RUN_DIR write|record copy|write-now. The second checkpoint is held
on the background writer thread: ``write`` before it is published (prints ``writing``: with ``copy``
after a partial ``state_dict.pth`` is written, with ``write-now`` after the training thread wrote the
files and before the writer publishes them), ``record`` after it is published but before the store
records it (prints ``published``). The training thread then waits for that write at the next
checkpoint.
"""

import faulthandler
import json
import sys
import threading
from pathlib import Path
from typing import Any

from trials_pytorch import ResumeTrial, config

import determined_trials.pytorch._adapter as adapter_module
import determined_trials.pytorch._experimental as experimental
from determined_trials import pytorch
from determined_trials.core import LocalStore
from determined_trials.core.storage import DirectoryStorage

_writes = {"n": 0}


def _say(line: str) -> None:
    sys.stdout.write(f"{line}\n")  # one write: the training thread's summary lines may be printed meanwhile
    sys.stdout.flush()


def _hold(marker: str) -> None:
    _say(marker)
    threading.Event().wait()  # until SIGKILL


def _patch(mode: str, background: str) -> None:
    write, add, commit = adapter_module.write_trial_state, LocalStore.add_checkpoint, DirectoryStorage.commit

    def slow_write(snapshot: dict[str, Any], path: Path) -> None:
        _writes["n"] += 1
        if mode == "write" and _writes["n"] == 2:
            (path / "state_dict.pth").write_bytes(b"partial")
            _hold("writing")
        write(snapshot, path)

    def slow_commit(self: DirectoryStorage, storage_id: str, metadata: dict[str, Any]) -> dict[str, int]:
        if background == "write-now":
            _writes["n"] += 1
            if mode == "write" and _writes["n"] == 2:
                _hold("writing")
        return commit(self, storage_id, metadata)

    def slow_add(self: LocalStore, **kwargs: Any) -> None:
        if mode == "record" and not kwargs.get("pending") and _writes["n"] == 2:
            _hold("published")
        add(self, **kwargs)

    adapter_module.write_trial_state = slow_write  # type: ignore[assignment]
    LocalStore.add_checkpoint = slow_add  # type: ignore[method-assign]
    DirectoryStorage.commit = slow_commit  # type: ignore[method-assign]
    if background == "copy":
        experimental.SNAPSHOT_MIN_BYTES = 0


def main() -> None:
    run_dir, mode, background = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    faulthandler.dump_traceback_later(150, exit=False)  # if the test waits long: where every thread is
    _patch(mode, background)
    conf = config({"global_batch_size": 4, "lr": 0.01, "workers": 0, "hidden": 8})
    with pytorch.init(exp_conf=conf, run_dir=run_dir) as context:
        _say(json.dumps({"trial_id": context.get_trial_id()}))
        trainer = pytorch.Trainer(ResumeTrial(context), context)
        trainer.fit(max_length=pytorch.Batch(15), checkpoint_period=pytorch.Batch(2), show_progress=False)
    _say("finished (unexpected)")


if __name__ == "__main__":
    main()
