"""The trial families the harness and the launchers run (PyTorchTrial, DeepSpeedTrial, TFKerasTrial): where
each one's base class, ``init()``/``Trainer`` and launcher live, as module paths (importing this module imports
no framework), and which family a trial class belongs to. The one place that imports a family's modules by
name; ``tests/test_import_rules.py`` checks the paths against the rooms launch/ may import."""

from __future__ import annotations

import dataclasses
import importlib
import inspect
from types import ModuleType

__all__ = ["FAMILIES", "PYTORCH", "TrialFamily", "claimed_family", "family_named", "family_of"]


@dataclasses.dataclass(frozen=True)
class TrialFamily:
    """One trial family: its base class ``name`` (defined in ``trial_module`` with ``check_trial_class``), the
    ``package`` with its ``init()`` and ``Trainer``, the ``launcher`` module that runs it on several processes,
    and whether its hyperparameters need ``global_batch_size`` (checked at ``experiment create``)."""

    name: str
    trial_module: str
    package: str
    launcher: str
    needs_global_batch_size: bool

    def trial(self) -> ModuleType:
        """The module of the base class and ``check_trial_class(cls)`` (imports the framework)."""
        return importlib.import_module(self.trial_module)

    def base_class(self) -> type:
        """The family's base class (imports the framework)."""
        base: type = getattr(self.trial(), self.name)
        return base

    def entry(self) -> ModuleType:
        """The package with the family's ``init()`` and ``Trainer`` (imports the framework)."""
        return importlib.import_module(self.package)


PYTORCH = TrialFamily("PyTorchTrial", "determined_trials.pytorch._trial", "determined_trials.pytorch",
                      "determined_trials.launch.torch_distributed", needs_global_batch_size=True)
FAMILIES = (
    PYTORCH,
    TrialFamily("DeepSpeedTrial", "determined_trials.deepspeed._trial", "determined_trials.deepspeed",
                "determined_trials.launch.deepspeed", needs_global_batch_size=False),
    TrialFamily("TFKerasTrial", "determined_trials.keras._trial", "determined_trials.keras",
                "determined_trials.launch.tensorflow", needs_global_batch_size=True),
)
_BY_NAME = {family.name: family for family in FAMILIES}


def family_named(name: str) -> TrialFamily | None:
    """The family whose base class is called ``name``, or None."""
    return _BY_NAME.get(name)


def claimed_family(cls: type) -> TrialFamily | None:
    """The family ``cls`` means to belong to: the first base class in its MRO named like a family's (a
    look-alike of another package included, so that a message can name the real one); nothing is imported."""
    for base in inspect.getmro(cls):
        family = _BY_NAME.get(base.__name__)
        if family is not None:
            return family
    return None


def family_of(cls: type) -> TrialFamily | None:
    """The family whose base class ``cls`` subclasses, or None. A family's modules are imported only when
    its base class's module is in ``cls``'s MRO, so a PyTorchTrial never imports TensorFlow."""
    modules = {base.__module__ for base in inspect.getmro(cls)}
    for family in FAMILIES:
        if family.trial_module in modules and issubclass(cls, family.base_class()):
            return family
    return None
