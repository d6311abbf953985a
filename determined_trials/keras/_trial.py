"""``TFKerasTrial``: the user's model, data and Keras callbacks, in Determined's shape."""

from __future__ import annotations

import abc
import inspect
import warnings
from typing import Any

from determined_trials.keras._context import TFKerasTrialContext

__all__ = ["TFKerasTrial", "check_trial_class"]


class TFKerasTrial(abc.ABC):
    """Subclass and implement ``build_model`` (which calls ``context.wrap_model`` and ``compile``),
    ``build_training_data_loader`` and ``build_validation_data_loader``.

    Data: ``(x, y[, sample_weight])`` NumPy arrays (batched by the harness with the per-slot batch
    size), a ``keras.utils.PyDataset`` (each item a per-slot batch) or a ``tf.data.Dataset`` of
    per-slot batches passed through ``context.wrap_dataset``.
    """

    trial_context_class = TFKerasTrialContext

    def __init__(self, context: TFKerasTrialContext) -> None:
        self.context = context

    @abc.abstractmethod
    def build_model(self) -> Any:
        """Build, ``context.wrap_model`` and ``compile`` the Keras model; return it."""

    @abc.abstractmethod
    def build_training_data_loader(self) -> Any:
        """The training data (see the class docstring for the accepted kinds)."""

    @abc.abstractmethod
    def build_validation_data_loader(self) -> Any:
        """The validation data (same kinds as the training data)."""

    def session_config(self) -> Any:
        """TF1 session settings: accepted for ported code and ignored (Keras 3 has no sessions)."""
        return None

    def keras_callbacks(self) -> list[Any]:
        """Keras callbacks (``keras.callbacks.Callback`` or ``det.keras.callbacks.Callback``) to run."""
        return []


def check_trial_class(cls: type) -> None:
    """Reject what is not a complete TFKerasTrial subclass, with the reason; warn about session_config."""
    if not (isinstance(cls, type) and issubclass(cls, TFKerasTrial)):
        raise TypeError(f"{cls!r} is not a subclass of det.keras.TFKerasTrial")
    if inspect.isabstract(cls):
        missing = ", ".join(sorted(getattr(cls, "__abstractmethods__", ())))
        raise TypeError(f"{cls.__name__} does not define {missing}; a TFKerasTrial needs them")
    if cls.session_config is not TFKerasTrial.session_config:
        warnings.warn(f"{cls.__name__}.session_config() is ignored: Keras 3 has no TF1 sessions; "
                      "configure threads with tf.config.threading instead", stacklevel=3)
