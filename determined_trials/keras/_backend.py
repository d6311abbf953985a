"""Keras 3 on TensorFlow only: check ``KERAS_BACKEND`` before Keras is imported, then import it."""

from __future__ import annotations

import os
import sys
from types import ModuleType

__all__ = ["BACKEND_ENV", "require_tensorflow_backend"]

BACKEND_ENV = "KERAS_BACKEND"


def require_tensorflow_backend() -> ModuleType:
    """Import Keras with the TensorFlow backend; a clear error names ``KERAS_BACKEND`` otherwise."""
    wanted = os.environ.get(BACKEND_ENV, "").strip().lower()
    if wanted and wanted != "tensorflow":
        raise ImportError(
            f"determined_trials.keras runs Keras 3 on TensorFlow, but {BACKEND_ENV}={wanted!r}. Fix: unset "
            f"{BACKEND_ENV} or set {BACKEND_ENV}=tensorflow before importing Keras"
        )
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    if "keras" not in sys.modules:
        os.environ[BACKEND_ENV] = "tensorflow"
    import keras

    if keras.backend.backend() != "tensorflow":
        raise ImportError(
            f"Keras was already imported with the {keras.backend.backend()!r} backend; determined_trials.keras "
            f"needs TensorFlow. Fix: set {BACKEND_ENV}=tensorflow before anything imports Keras"
        )
    return keras
