"""The trial of tests/experiment/test_experiment_warm.py (copied as model_def.py): a tiny PyTorchTrial that writes,
at its first batch, whether it was forked warm and what it sees of earlier trials, and per hparam ``mode``
in its first attempt crashes, grows a module-level list and one in an imported module, kills itself with
SIGKILL, or edits helper.py. It logs (next to itself) the pid of each process importing it, and of each one
running the exit hook its import registers."""

import json
import os
import signal
import sys
import weakref
from pathlib import Path

import helper  # noqa: F401 - a module of the model folder: an edited one must be imported again
import torch

import determined_trials
from determined_trials import pytorch

LEAK: list[bytes] = []


class _Sentinel:
    pass


def _log(name: str) -> None:
    with open(Path(__file__).with_name(name), "a") as f:
        f.write(f"{os.getpid()}\n")


_log("imported.log")  # each process that imports this module (a warm trial reuses its parent's import)
_SENTINEL = _Sentinel()
weakref.finalize(_SENTINEL, _log, "finalized.log")  # runs at the exit of the process that made it, not a fork's


class WarmTrial(pytorch.PyTorchTrial):
    def __init__(self, context):
        self.context = context
        self.model = context.wrap_model(torch.nn.Linear(4, 1))
        self.opt = context.wrap_optimizer(torch.optim.SGD(self.model.parameters(), lr=context.get_hparam("lr")))
        self.mode = context.get_hparam("mode")

    def _data(self, n, seed):
        x = torch.randn(n, 4, generator=torch.Generator().manual_seed(seed))
        return pytorch.DataLoader(torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True)),
                                  batch_size=self.context.get_per_slot_batch_size(), shuffle=True)

    def build_training_data_loader(self):
        return self._data(64, 1)

    def build_validation_data_loader(self):
        return self._data(16, 2)

    def train_batch(self, batch, epoch_idx, batch_idx):
        if batch_idx == 0:
            self._mark()
        if batch_idx == 1:
            self._act()
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.model(x), y)
        self.context.backward(loss)
        self.context.step_optimizer(self.opt)
        return {"loss": loss}

    def evaluate_batch(self, batch):
        x, y = batch
        return {"validation_loss": torch.nn.functional.mse_loss(self.model(x), y)}

    def _mark(self):
        seen = {"warm": "determined_trials.experiment._zygote" in sys.modules, "leak": len(LEAK),
                "package_leak": len(getattr(determined_trials, "_test_leak", [])), "helper": helper.VALUE}
        out = Path(os.environ["DET_RUN_DIR"]) / f"mark_{self.context.get_trial_id()}_{os.getpid()}.json"
        out.write_text(json.dumps(seen))

    def _act(self):
        first = Path(os.environ["DET_RUN_DIR"]) / f"acted_{self.context.get_trial_id()}"
        if first.exists():  # a restart: train
            return
        first.write_text("")
        if self.mode == "crash":
            raise RuntimeError("the planned crash")
        if self.mode == "leak":
            LEAK.extend(b"x" * 1024 for _ in range(10_000))
            determined_trials._test_leak = list(LEAK)
        if self.mode == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        if self.mode == "edit":
            Path("helper.py").write_text("VALUE = 2\n")
