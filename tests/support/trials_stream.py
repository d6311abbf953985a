"""PyTorchTrials over streams (IterableDatasets) for the stream tests: a Hugging Face streaming dataset read
from local JSON-lines shards, a user's own stateful stream and a plain generator-backed one."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn
from trials_pytorch import train_step

from determined_trials import pytorch

StepMode = pytorch.LRScheduler.StepMode

SHARD_SIZES = (9, 10, 11, 12)  # uneven: the ranks' parts differ in length


def write_shards(folder: Path, sizes: tuple[int, ...] = SHARD_SIZES) -> list[str]:
    """JSON-lines shards of ``sizes`` records ``{"i": index}``; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    paths, index = [], 0
    for shard, size in enumerate(sizes):
        path = folder / f"shard{shard}.jsonl"
        path.write_text("".join(json.dumps({"i": index + k}) + "\n" for k in range(size)))
        paths.append(str(path))
        index += size
    return paths


def features(index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Inputs and targets of records ``index`` (a pure function of the index)."""
    x = torch.stack([torch.sin(index * 0.3 + k) for k in range(4)], dim=1).float()
    return x, x.sum(dim=1, keepdim=True) * 0.5


class CountingStream(torch.utils.data.IterableDataset[Any]):
    """A user's own stream of records ``{"i": k, "noise": u}``, k < n: it saves its position (``state_dict``),
    learns its rank from ``set_shard`` and splits its rank's part among data-loader workers by
    ``get_worker_info()``. ``u`` is an augmentation's draw from torch's global RNG, in whichever process reads."""

    def __init__(self, n: int) -> None:
        self.n, self.rank, self.world = n, 0, 1
        self.next_index, self._loaded = 0, False

    def set_shard(self, rank: int, world_size: int) -> None:
        self.rank, self.world = rank, world_size

    def __iter__(self) -> Iterator[dict[str, Any]]:
        if not self._loaded:  # a new pass starts at 0; a loaded position is taken up once
            self.next_index = 0
        self._loaded = False
        return self._records()

    def _records(self) -> Iterator[dict[str, Any]]:
        info = torch.utils.data.get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        readers, me = self.world * workers, self.rank * workers + worker
        while self.next_index < self.n:
            k = self.next_index
            self.next_index += 1
            if k % readers == me:
                yield {"i": k, "noise": torch.rand(()) * 0.01}

    def state_dict(self) -> dict[str, int]:
        return {"next_index": self.next_index}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.next_index, self._loaded = state["next_index"], True

    @staticmethod
    def merge_state_dicts(states: list[dict[str, int]]) -> dict[str, int] | None:
        """Reader j of R read records j, j + R, ... below its ``next_index``: when together they read every
        record before the furthest one and none after, the pass goes on from there under any layout."""
        readers, ends = len(states), [state["next_index"] for state in states]
        upto = max(ends)
        unread = [end + (j - end) % readers for j, end in enumerate(ends)]  # each reader's next record
        return {"next_index": upto} if min(unread) >= upto else None


class PlainStream(torch.utils.data.IterableDataset[Any]):
    """A generator-backed stream that cannot save its position (the replay path)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def __iter__(self) -> Iterator[dict[str, int]]:
        return ({"i": k} for k in range(self.n))


def make_stream(kind: str, data_dir: str, n: int = sum(SHARD_SIZES)) -> Any:
    if kind == "hf":
        import datasets

        files = sorted(str(p) for p in Path(data_dir).glob("shard*.jsonl"))
        return datasets.load_dataset("json", data_files=files, split="train", streaming=True)
    return CountingStream(n) if kind == "user" else PlainStream(n)


class StreamTrial(pytorch.PyTorchTrial):
    """An MLP with dropout, Adam and a per-batch StepLR over a stream. hparams: kind (hf, user, plain),
    data_dir, workers, global_batch_size, lr. ``stop_after``: set_stop_requested on that batch_idx;
    ``flag_path``/``flag_batch``/``batch_sleep``: the SIGTERM test's window (each also an hparam, for the
    launcher). With hparam ``print`` every rank prints ``rank R seen EPOCH BATCH [records]`` per batch."""

    def __init__(self, context: pytorch.PyTorchTrialContext, stop_after: int | None = None,
                 flag_path: str | None = None, flag_batch: int = 3, batch_sleep: float = 0.0,
                 epoch_scheduler: bool = False) -> None:
        self.context = context
        hp = context.get_hparams()
        stop_after, flag_batch = hp.get("stop_after", stop_after), hp.get("flag_batch", flag_batch)
        flag_path, batch_sleep = hp.get("flag_path", flag_path), hp.get("batch_sleep", batch_sleep)
        self.print = bool(hp.get("print", False))
        self.stop_after, self.flag_path, self.flag_batch, self.batch_sleep = stop_after, flag_path, flag_batch, batch_sleep
        self.seen: list[tuple[int, int, list[int]]] = []
        self.validated: list[list[int]] = []
        model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Dropout(0.3), nn.Linear(8, 1))
        self.model = context.wrap_model(model)
        self.optimizer = context.wrap_optimizer(torch.optim.Adam(self.model.parameters(), lr=context.get_hparam("lr")))
        mode = StepMode.STEP_EVERY_EPOCH if epoch_scheduler else StepMode.STEP_EVERY_BATCH
        self.scheduler = context.wrap_lr_scheduler(
            torch.optim.lr_scheduler.StepLR(self.optimizer, step_size=3, gamma=0.8), mode)

    def _loader(self, n: int | None = None) -> pytorch.DataLoader:
        hp = self.context.get_hparams()
        stream = make_stream(hp["kind"], hp["data_dir"], **({} if n is None else {"n": n}))
        return pytorch.DataLoader(stream, batch_size=self.context.get_per_slot_batch_size(),
                                  num_workers=hp.get("workers", 0))

    def build_training_data_loader(self) -> pytorch.DataLoader:
        return self._loader()

    def build_validation_data_loader(self) -> pytorch.DataLoader:
        return self._loader()

    def train_batch(self, batch: Any, epoch_idx: int, batch_idx: int) -> Any:
        index = batch["i"]
        self.seen.append((epoch_idx, batch_idx, index.tolist()))
        if self.print:
            print(f"rank {self.context.distributed.get_rank()} seen {epoch_idx} {batch_idx} {index.tolist()}",
                  flush=True)
        x, y = features(index)
        if "noise" in batch:
            x = x + batch["noise"].unsqueeze(1)
        return train_step(self, nn.functional.mse_loss(self.model(x), y), batch_idx)

    def evaluate_batch(self, batch: Any) -> dict[str, Any]:
        self.validated.append(batch["i"].tolist())
        x, y = features(batch["i"])
        return {"validation_loss": nn.functional.mse_loss(self.model(x), y), "records": float(len(x))}
