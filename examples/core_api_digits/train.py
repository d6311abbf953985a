"""A plain PyTorch training script on scikit-learn's digits, ported to the Core API.

It reports training and validation metrics, saves a checkpoint each epoch with ``store_path``,
resumes with ``restore_path`` from ``core_context.info.latest_checkpoint`` (the launcher's, or
``--resume latest`` / ``--resume UUID`` handed to ``det.core.init``: the resumed run continues its
trial), stops cleanly on preemption (SIGTERM / SIGUSR1) and trains as long as the searcher's
operations say. Run it: ``python train.py`` (add ``--preempt-after-epochs 2`` to see a preemption).
"""

from __future__ import annotations

import argparse
import contextlib
import json
from pathlib import Path
from typing import Any

import torch
from sklearn.datasets import load_digits
from sklearn.model_selection import train_test_split
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import determined_trials as det

HERE = Path(__file__).resolve().parent


def build_data(batch_size: int, seed: int) -> tuple[DataLoader, DataLoader]:
    """Digits (8x8 images, 10 classes) split 80/20 into seeded training and validation loaders."""
    x, y = load_digits(return_X_y=True)
    x_train, x_val, y_train, y_val = train_test_split(x / 16.0, y, test_size=0.2, random_state=0)

    def dataset(xs: Any, ys: Any) -> TensorDataset:
        return TensorDataset(torch.tensor(xs, dtype=torch.float32), torch.tensor(ys, dtype=torch.long))

    generator = torch.Generator().manual_seed(seed)
    train = DataLoader(dataset(x_train, y_train), batch_size=batch_size, shuffle=True, generator=generator)
    val = DataLoader(dataset(x_val, y_val), batch_size=256)
    return train, val


def build_model(hidden_size: int) -> nn.Module:
    return nn.Sequential(nn.Linear(64, hidden_size), nn.ReLU(), nn.Linear(hidden_size, 10))


def train_one_epoch(model: nn.Module, loader: DataLoader, optimizer: torch.optim.Optimizer) -> dict[str, float]:
    model.train()
    total, count = 0.0, 0
    for xs, ys in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(xs), ys)
        loss.backward()
        optimizer.step()
        total += loss.item() * len(ys)
        count += len(ys)
    return {"loss": total / count}


@torch.no_grad()
def validate(model: nn.Module, loader: DataLoader) -> dict[str, float]:
    model.eval()
    loss, correct, count = 0.0, 0, 0
    for xs, ys in loader:
        logits = model(xs)
        loss += nn.functional.cross_entropy(logits, ys, reduction="sum").item()
        correct += int((logits.argmax(dim=1) == ys).sum())
        count += len(ys)
    return {"validation_loss": loss / count, "validation_accuracy": correct / count}


def save(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, epochs: int, rng: torch.Tensor) -> None:
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "rng": rng}, path / "state.pt")
    (path / "progress.json").write_text(json.dumps({"epochs_completed": epochs}))


def load(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, loader: DataLoader) -> int:
    state = torch.load(path / "state.pt", weights_only=True)
    model.load_state_dict(state["model"])
    optimizer.load_state_dict(state["optimizer"])
    loader.generator.set_state(state["rng"])  # type: ignore[union-attr]
    return int(json.loads((path / "progress.json").read_text())["epochs_completed"])


def main(core_context: det.core.Context, preempt_after: int | None) -> None:
    hparams = core_context.info.trial.hparams
    torch.manual_seed(core_context.info.trial.trial_seed)
    train_loader, val_loader = build_data(hparams["batch_size"], core_context.info.trial.trial_seed)
    model = build_model(hparams["hidden_size"])
    optimizer = torch.optim.SGD(model.parameters(), lr=hparams["learning_rate"], momentum=hparams["momentum"])
    batches_per_epoch = len(train_loader)

    epochs_done = 0
    uuid = core_context.info.latest_checkpoint  # the launcher's, or init(latest_checkpoint=--resume)
    restore = core_context.checkpoint.restore_path(uuid) if uuid else contextlib.nullcontext()
    with restore as path:
        if path is not None:
            epochs_done = load(path, model, optimizer, train_loader)
            print(f"resumed from checkpoint {uuid} after {epochs_done} epochs")

    metrics: dict[str, float] = validate(model, val_loader)
    storage_id = uuid
    for op in core_context.searcher.operations():
        while epochs_done < op.length:
            train_metrics = train_one_epoch(model, train_loader, optimizer)
            epochs_done += 1
            steps = epochs_done * batches_per_epoch
            core_context.train.report_training_metrics(steps_completed=steps, metrics=train_metrics)
            metrics = validate(model, val_loader)
            core_context.train.report_validation_metrics(steps_completed=steps, metrics=metrics)
            op.report_progress(epochs_done)
            print(f"epoch {epochs_done}: loss {train_metrics['loss']:.4f}, "
                  f"validation accuracy {metrics['validation_accuracy']:.4f}")
            checkpoint_metadata = {"steps_completed": steps, "epochs_completed": epochs_done}
            with core_context.checkpoint.store_path(checkpoint_metadata) as (ckpt_path, new_id):
                save(ckpt_path, model, optimizer, epochs_done, train_loader.generator.get_state())  # type: ignore[union-attr]
            storage_id = new_id
            if preempt_after is not None and epochs_done == preempt_after:
                core_context.preempt.request_preemption()
            if core_context.preempt.should_preempt():
                print(f"preempted after epoch {epochs_done}; resume with --resume {storage_id}")
                return
        op.report_completed(metrics["validation_accuracy"])
    print(f"done: validation accuracy {metrics['validation_accuracy']:.4f}, last checkpoint {storage_id}, "
          f"trial {core_context.info.trial.trial_id} in {core_context.info.run_dir}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", default=str(HERE / "const.yaml"), help="experiment configuration")
    parser.add_argument("--run-dir", default=None, help="run folder (default: $DET_RUN_DIR or ./det-runs)")
    parser.add_argument("--resume", default=None, help="checkpoint uuid to resume from, or 'latest'")
    parser.add_argument("--preempt-after-epochs", type=int, default=None,
                        help="simulate a preemption signal after this many epochs")
    return parser.parse_args()


if __name__ == "__main__":
    args = parse_args()
    with det.core.init(config=args.config, run_dir=args.run_dir, latest_checkpoint=args.resume) as core_context:
        main(core_context, args.preempt_after_epochs)
