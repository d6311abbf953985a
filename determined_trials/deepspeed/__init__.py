"""``det.deepspeed`` (also ``det.pytorch.deepspeed``): DeepSpeedTrial, its context, the model-parallel
unit, ``overwrite_deepspeed_config``, ``init()`` + ``Trainer``, and checkpoint consolidation.

Importing this package imports torch but not deepspeed; deepspeed is imported when an engine is
wrapped or ``init()`` starts communication. DeepSpeed's own INFO lines are held back from here on
(``$DET_DEEPSPEED_LOG_LEVEL=INFO`` shows them).

May import: errors, _info, _compat, _format, config, core.*, loop, _trial_context, pytorch.*
"""

from determined_trials.deepspeed._checkpoint import consolidate_checkpoint
from determined_trials.deepspeed._config import overwrite_deepspeed_config
from determined_trials.deepspeed._context import DeepSpeedTrialContext
from determined_trials.deepspeed._logs import quiet_deepspeed_logs
from determined_trials.deepspeed._mpu import ModelParallelUnit
from determined_trials.deepspeed._trainer import Trainer, init
from determined_trials.deepspeed._trial import DeepSpeedTrial
from determined_trials.loop import Batch, Epoch, Record

__all__ = [
    "Batch",
    "DeepSpeedTrial",
    "DeepSpeedTrialContext",
    "Epoch",
    "ModelParallelUnit",
    "Record",
    "Trainer",
    "consolidate_checkpoint",
    "init",
    "overwrite_deepspeed_config",
]

quiet_deepspeed_logs()
