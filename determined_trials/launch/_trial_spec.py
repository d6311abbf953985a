"""``--trial`` specs (``path/to/file.py:Class`` or ``module:Class``): parse them, import the trial class
from the context directory, and say what is wrong in words a person can act on."""

from __future__ import annotations

import dataclasses
import difflib
import importlib
import importlib.util
import inspect
import os
import sys
import traceback
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

from determined_trials._compat import resolve_qualname
from determined_trials.launch._families import claimed_family, family_named
from determined_trials.launch._procs import run_child

__all__ = [
    "TrialSpec", "TrialSpecError", "family_launcher", "import_trial_class", "keep_trial_class", "parse_trial_spec",
]

_EXAMPLE = "e.g. --trial model_def.py:MyTrial or --trial model_def:MyTrial"


class TrialSpecError(Exception):
    """The ``--trial`` spec cannot give a trial class; the message says why and what to do."""


@dataclasses.dataclass(frozen=True)
class TrialSpec:
    """A parsed spec: the module to import (and its file, for the file form) and the class path."""

    text: str
    module: str
    class_path: str
    file: Path | None
    search_dirs: tuple[Path, ...]

    @property
    def where(self) -> str:
        """How to name the spec's module in a message."""
        return str(self.file) if self.file is not None else f"module {self.module!r}"


def parse_trial_spec(text: str, context_dir: str | os.PathLike[str] = ".") -> TrialSpec:
    """Parse FILEPATH:ClassName or module:ClassName (dotted class paths allowed) against ``context_dir``."""
    context = Path(context_dir).resolve()
    spec = (text or "").strip()
    if not spec:
        raise TrialSpecError(f"empty --trial spec; give FILEPATH:ClassName, {_EXAMPLE}")
    location, colon, class_path = spec.rpartition(":")
    if not colon or not location:
        raise TrialSpecError(f"--trial {spec!r} does not name a class; give FILEPATH:ClassName, {_EXAMPLE}")
    if not class_path or not all(part.isidentifier() for part in class_path.split(".")):
        raise TrialSpecError(f"--trial {spec!r}: {class_path!r} is not a Python class name; {_EXAMPLE}")
    if location.endswith(".py") or "/" in location or "\\" in location:
        return _file_spec(spec, location, class_path, context)
    if not all(part.isidentifier() for part in location.split(".")):
        raise TrialSpecError(
            f"--trial {spec!r}: {location!r} is not a module name; give a file path ({location}.py:{class_path}) "
            "or a dotted module name"
        )
    return TrialSpec(spec, location, class_path, None, (context,))


def _file_spec(spec: str, location: str, class_path: str, context: Path) -> TrialSpec:
    path = (context / location).resolve()
    if not path.exists():
        raise TrialSpecError(f"--trial {spec!r}: the trial file {location!r} does not exist (looked in {context})")
    if not path.is_file() or path.suffix != ".py":
        raise TrialSpecError(f"--trial {spec!r}: {location!r} is not a Python file; {_EXAMPLE}")
    relative = path.with_suffix("").relative_to(context).parts if path.is_relative_to(context) else ()
    if relative and all(part.isidentifier() for part in relative):
        # a file inside the context directory is imported as a (namespace) package module, so that
        # both `import sibling` and `from . import sibling` work
        dirs = (context,) if path.parent == context else (context, path.parent)
        return TrialSpec(spec, ".".join(relative), class_path, path, dirs)
    if not path.stem.isidentifier():
        raise TrialSpecError(f"--trial {spec!r}: {path.name!r} cannot be imported (not a valid module name); "
                             "rename the file to letters, digits and underscores")
    return TrialSpec(spec, path.stem, class_path, path, (path.parent,))


_kept_modules: dict[str, ModuleType] = {}  # imported by a warm parent for the trial processes it forks


def keep_trial_class(spec: TrialSpec) -> type:
    """``import_trial_class`` in a warm parent: the first ``import_trial_class`` of the same spec in each process
    forked from it reuses this import instead of importing the module again (whoever forks checks first that
    the module's files are unchanged: ``experiment._warm``)."""
    target = import_trial_class(spec)
    _kept_modules[spec.module] = sys.modules[spec.module]
    return target


def import_trial_class(spec: TrialSpec) -> type:
    """Import the spec's module (search dirs first on sys.path) and return its class."""
    for folder in reversed(spec.search_dirs):
        if str(folder) in sys.path:
            sys.path.remove(str(folder))
        sys.path.insert(0, str(folder))
    kept = _kept_modules.pop(spec.module, None)
    if kept is not None and sys.modules.get(spec.module) is kept and _same_file(kept, spec):
        return _trial_class(spec, kept)
    importlib.invalidate_caches()
    for name in [m for m in sys.modules if m == spec.module or m.startswith(spec.module + ".")]:
        del sys.modules[name]  # a module of that name imported earlier (e.g. from another folder)
    return _trial_class(spec, _import_module(spec))


def _same_file(module: ModuleType, spec: TrialSpec) -> bool:
    path = getattr(module, "__file__", None)
    return spec.file is None or (isinstance(path, str) and Path(path).resolve() == spec.file.resolve())


def _trial_class(spec: TrialSpec, module: ModuleType) -> type:
    try:
        target = resolve_qualname(module, spec.class_path)
    except AttributeError as err:
        raise TrialSpecError(_missing_class(spec, module, err.name or spec.class_path)) from None
    if not isinstance(target, type):
        kind = "function" if inspect.isroutine(target) else type(target).__name__
        raise TrialSpecError(f"--trial {spec.text!r}: {spec.class_path!r} in {spec.where} is a {kind}, not a "
                             f"trial class{_available(module)}")
    return target


def _import_module(spec: TrialSpec) -> ModuleType:
    if spec.file is None:
        try:
            found = importlib.util.find_spec(spec.module)
        except (ImportError, ValueError):
            found = None
        if found is None:
            raise TrialSpecError(
                f"--trial {spec.text!r}: no module {spec.module!r}: there is no "
                f"{spec.module.replace('.', '/')}.py in {spec.search_dirs[0]} and it is not installed"
            )
    try:
        return importlib.import_module(spec.module)
    except TrialSpecError:
        raise
    except (Exception, SystemExit) as exc:
        raise TrialSpecError(f"--trial {spec.text!r}: importing {spec.where} failed: "
                             f"{type(exc).__name__}: {exc}{_user_frame(exc, spec)}") from None


def _user_frame(exc: BaseException, spec: TrialSpec) -> str:
    """`` (at file:line)`` for the innermost frame in the user's folders, when there is one."""
    if isinstance(exc, SyntaxError) and exc.filename:
        return f" (at {exc.filename}:{exc.lineno})"
    roots = [str(folder) for folder in spec.search_dirs]
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if any(f.filename.startswith(r) for r in roots)]
    if not frames:
        return ""
    last = frames[-1]
    return f" (at {last.filename}:{last.lineno}: {(last.line or '').strip()})"


def family_launcher(spec_text: str | None, context_dir: str | os.PathLike[str], current: str,
                    stop: Sequence[int] = ()) -> str | None:
    """The launcher module for the ``--trial`` class's family when it is not ``current`` (a launcher's
    name, e.g. "torch_distributed"); None for a script, the same launcher or a class that does not load
    (the harness reports that). The trial module is imported in a child process: a launcher must not
    hold framework threads when it forks its workers. The child dies with the launcher, and is ended by
    a stop signal recorded in ``stop`` (``StopRequested``)."""
    if spec_text is None:
        return None
    probe = [sys.executable, "-m", "determined_trials.launch._trial_spec", spec_text, str(context_dir)]
    out = run_child(probe, timeout=300, stop=stop).strip()
    family = family_named(out.splitlines()[-1] if out else "")
    return family.launcher if family is not None and family.launcher.rsplit(".", 1)[-1] != current else None


def _trial_classes(module: ModuleType) -> list[str]:
    classes = [
        name for name, value in vars(module).items()
        if isinstance(value, type) and claimed_family(value) is not None and family_named(value.__name__) is None
    ]
    return sorted(classes)


def _available(module: ModuleType) -> str:
    names = _trial_classes(module)
    if not names:
        return "; it defines no trial classes (subclasses of det.pytorch.PyTorchTrial and the like)"
    return f"; the trial classes in it are: {', '.join(names)}"


def _missing_class(spec: TrialSpec, module: ModuleType, missing: str) -> str:
    close = difflib.get_close_matches(spec.class_path, _trial_classes(module), n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    return f"--trial {spec.text!r}: {spec.where} has no {missing!r}{_available(module)}.{hint}"


if __name__ == "__main__":  # print the family of a spec's class (used by family_launcher)
    try:
        family = claimed_family(import_trial_class(parse_trial_spec(sys.argv[1], sys.argv[2])))
        print(family.name if family is not None else "")
    except TrialSpecError:
        print("")
