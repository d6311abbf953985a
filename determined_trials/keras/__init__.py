"""``det.keras``: TFKerasTrial for Keras 3 (TensorFlow backend) under the one loop, its context and
callbacks, ``init`` + ``Trainer``, ``DeterminedCallback`` for plain ``model.fit`` and checkpoint loading.

The only room that imports TensorFlow.

May import: errors, _info, _compat, _format, config, core.*, loop, _trial_context
"""

from determined_trials.keras._backend import require_tensorflow_backend

require_tensorflow_backend()

from determined_trials.keras import callbacks  # noqa: E402
from determined_trials.keras._context import TFKerasTrialContext  # noqa: E402
from determined_trials.keras._determined_callback import DeterminedCallback  # noqa: E402
from determined_trials.keras._load import load_model_from_checkpoint_path  # noqa: E402
from determined_trials.keras._trainer import Trainer, init  # noqa: E402
from determined_trials.keras._trial import TFKerasTrial  # noqa: E402
from determined_trials.keras.callbacks import TensorBoard  # noqa: E402
from determined_trials.loop import Batch, Epoch, Record, TrainUnit  # noqa: E402

__all__ = [
    "Batch",
    "DeterminedCallback",
    "Epoch",
    "Record",
    "TFKerasTrial",
    "TFKerasTrialContext",
    "TensorBoard",
    "TrainUnit",
    "Trainer",
    "callbacks",
    "init",
    "load_model_from_checkpoint_path",
]
