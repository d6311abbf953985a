"""The layer rules of docs/architecture.md: core/ and loop/ never import torch or tensorflow; every room imports
only the rooms its docstring's ``May import:`` line names, no module imports itself back through others, and no
package imports another package's underscore modules (it imports what that package's ``__init__`` exports)."""

from __future__ import annotations

import ast
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

FRAMEWORKS = ("torch", "tensorflow", "keras", "deepspeed")


def _modules_after(code: str) -> set[str]:
    script = textwrap.dedent(code) + "\nimport sys, json\nprint(json.dumps(sorted(sys.modules)))\n"
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    import json

    return set(json.loads(out.stdout.strip().splitlines()[-1]))


@pytest.mark.parametrize("module", ["determined_trials", "determined_trials.core", "determined_trials.loop",
                                    "determined_trials.config", "determined_trials.cli.main",
                                    "determined_trials.searcher"])
def test_import_pulls_in_no_framework(module: str) -> None:
    loaded = _modules_after(f"import {module}")
    assert not {m.split(".")[0] for m in loaded} & set(FRAMEWORKS)


def test_star_import_costs_what_the_plain_import_costs() -> None:
    """The lazy framework subpackages are not in ``__all__``: ``import *`` imports no framework (it
    would import torch, DeepSpeed and TensorFlow), yet they stay reachable and listed by ``dir``."""
    plain = _modules_after("import determined_trials")
    star = _modules_after("from determined_trials import *")
    assert star == plain
    import determined_trials as det

    assert {"pytorch", "deepspeed", "keras"} <= set(dir(det)) and not {"pytorch", "deepspeed", "keras"} & set(det.__all__)
    assert all(hasattr(det, name) for name in det.__all__)


def test_using_the_core_api_pulls_in_no_framework(tmp_path: object) -> None:
    loaded = _modules_after(f"""
        import determined_trials as det
        with det.core.init(run_dir={str(tmp_path)!r}) as ctx:
            ctx.train.report_training_metrics(1, {{"loss": 1.0}})
            ctx.train.report_validation_metrics(1, {{"validation_loss": 1.0}})
            with ctx.checkpoint.store_path({{"steps_completed": 1}}) as (path, uuid):
                (path / "x").write_text("x")
            ctx.preempt.should_preempt()
    """)
    assert not {m.split(".")[0] for m in loaded} & set(FRAMEWORKS)


def test_pytorch_pulls_in_no_tensorflow() -> None:
    loaded = {m.split(".")[0] for m in _modules_after("import determined_trials.pytorch, determined_trials.launch")}
    assert not loaded & {"tensorflow", "keras"}


def test_keras_with_another_backend_names_keras_backend() -> None:
    import os

    env = {**os.environ, "KERAS_BACKEND": "jax"}
    out = subprocess.run([sys.executable, "-c", "import determined_trials.keras"], capture_output=True, text=True,
                         timeout=120, env=env)
    assert out.returncode != 0
    assert "KERAS_BACKEND='jax'" in out.stderr and "ImportError" in out.stderr

@pytest.mark.parametrize("module", ["determined_trials", "determined_trials.experiment", "determined_trials.cli.main",
                                    "determined_trials.core"])
def test_ray_is_imported_only_for_ray_experiments(module: str) -> None:
    assert "ray" not in {m.split(".")[0] for m in _modules_after(f"import {module}")}


@pytest.mark.slow
def test_a_local_experiment_never_imports_ray(tmp_path: Path) -> None:
    (tmp_path / "ctx").mkdir()
    (tmp_path / "ctx" / "train.py").write_text(textwrap.dedent("""
        import determined_trials as det
        with det.core.init() as ctx:
            for op in ctx.searcher.operations():
                op.report_completed(0.5)
    """))
    config = {"entrypoint": "python3 train.py", "searcher": {"name": "single", "metric": "loss", "max_length": 1}}
    loaded = _modules_after(f"""
        from determined_trials.experiment import create_experiment
        result = create_experiment({config!r}, {str(tmp_path / 'ctx')!r}, run_dir={str(tmp_path / 'runs')!r})
        assert result.state == "COMPLETED", result
    """)
    assert "determined_trials.experiment._runner" in loaded
    assert "ray" not in {m.split(".")[0] for m in loaded}

@pytest.mark.parametrize("module", ["determined_trials.pytorch", "determined_trials.deepspeed",
                                    "determined_trials.pytorch.deepspeed"])
def test_the_torch_packages_import_no_deepspeed(module: str) -> None:
    """deepspeed is imported when an engine is wrapped or det.deepspeed.init() runs, not before."""
    loaded = _modules_after(f"import {module}")
    assert "deepspeed" not in {m.split(".")[0] for m in loaded}


# -- the rooms of docs/architecture.md and who may import whom -----------------------------------------------
#
# A room is a package (its __init__.py) or a module directly in determined_trials/ (errors, _info, ...). Its
# docstring has one line "May import: a, b.c, d.*" (or "May import: nothing"; a line that ends in a comma goes
# on in the next): the rooms its modules may import besides their own, where "d.*" is the room d and every
# room inside it and "determined_trials" the package's own __init__ (the room ""). Nesting implies nothing: a
# room names the sub-rooms it imports, a sub-room its parent. The declarations are the rules; ALLOWED is read
# from them.

PACKAGE = Path(__file__).resolve().parent.parent / "determined_trials"
DECLARATION = "May import:"


def _room_files() -> dict[str, Path]:
    """Each room's dotted name (below determined_trials; "" for the package itself) -> the file that declares it."""
    rooms = {".".join(p.parent.relative_to(PACKAGE).parts): p for p in PACKAGE.rglob("__init__.py")}
    rooms.update({p.stem: p for p in PACKAGE.glob("*.py") if p.name != "__init__.py"})
    return rooms


def _declaration(path: Path) -> list[str] | None:
    """The names of the ``May import:`` line in ``path``'s docstring (continued on the next line while a line
    ends with a comma); None unless there is exactly one such line."""
    lines = [line.strip() for line in (ast.get_docstring(ast.parse(path.read_text())) or "").splitlines()]
    starts = [i for i, line in enumerate(lines) if line.startswith(DECLARATION)]
    if len(starts) != 1:
        return None
    text, i = lines[starts[0]].removeprefix(DECLARATION), starts[0]
    while text.endswith(",") and i + 1 < len(lines):
        i += 1
        text += lines[i]
    names = [name.strip() for name in text.split(",")]
    return [] if names == ["nothing"] else names


def _expand(names: list[str], rooms: set[str]) -> set[str]:
    """Declared names -> rooms: ``determined_trials`` is "", ``d.*`` is d and every room inside it."""
    out = set()
    for name in names:
        base = "" if name == "determined_trials" else name.removesuffix(".*")
        out |= {r for r in rooms if r == base or (name.endswith(".*") and r.startswith(base + "."))}
    return out


def _allowed() -> dict[str, set[str]]:
    files = _room_files()
    return {room: _expand(_declaration(path) or [], set(files)) for room, path in files.items()}


# room -> the rooms its modules may import (a room always imports itself), as the rooms declare it. The longest
# room that prefixes a module's dotted name (below determined_trials) is its room.
ALLOWED: dict[str, set[str]] = _allowed()
# Named exceptions (module, module), each for a public import path that must stay where Determined has it.
EXCEPTIONS = {
    ("pytorch.deepspeed", "deepspeed"),  # `det.pytorch.deepspeed` is det.deepspeed itself (the original's path)
}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE).with_suffix("").parts
        found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


def _imported(name: str, path: Path, source: str, modules: dict[str, Path]) -> Iterator[tuple[ast.stmt, str, list[str]]]:
    """Each import statement of module ``name`` with the module (below determined_trials) it names and the names it
    takes from it: ``from determined_trials.a import _b`` (a module) is ``("a._b", [])``, ``from
    determined_trials.a._b import X`` is ``("a._b", ["X"])``; relative imports resolved, other packages skipped."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found = [(a.name, []) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = ["determined_trials", *name.split(".")] if name else ["determined_trials"]
                base = base if path.name == "__init__.py" else base[:-1]
                base = base[: len(base) - node.level + 1]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            short = module.removeprefix("determined_trials").removeprefix(".")
            submodules = [a.name for a in node.names if f"{short}.{a.name}".lstrip(".") in modules]
            names = [a.name for a in node.names if a.name not in submodules]
            found = [(f"{module}.{sub}", []) for sub in submodules] + ([(module, names)] if names else [])
        else:
            continue
        for target, names in found:
            if target == "determined_trials" or target.startswith("determined_trials."):
                short = target.removeprefix("determined_trials").removeprefix(".")
                while short not in modules and "." in short:
                    short = short.rsplit(".", 1)[0]
                if short in modules and short != name:
                    yield node, short, names


def _reexports(modules: dict[str, Path]) -> dict[tuple[str, str], str]:
    """(package, name) -> the module that defines a name a package's ``__init__`` imports (re-exports), followed
    through packages that re-export it in turn."""
    direct = {}
    for package, path in modules.items():
        if path.name == "__init__.py":
            for _, module, names in _imported(package, path, path.read_text(), modules):
                direct.update({(package, n): module for n in names})

    def follow(key: tuple[str, str]) -> str:
        module = direct[key]
        return follow((module, key[1])) if (module, key[1]) in direct else module

    return {key: follow(key) for key in direct}


def _imports(name: str, path: Path, modules: dict[str, Path], reexports: dict[tuple[str, str], str]) -> set[str]:
    """The package's modules that ``name`` imports anywhere in its source (TYPE_CHECKING and function-level
    imports included: a circle through them is still a circle to a reader). A name taken from a package is an
    arrow to the module that defines it (the one its ``__init__`` re-exports), as a name taken from that module
    directly was: importing a package runs its ``__init__``, but so does importing any module inside it."""
    found = set()
    for _, module, names in _imported(name, path, path.read_text(), modules):
        targets = {reexports.get((module, n), module) for n in names} if names else {module}
        found |= targets - {name}
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    reexports = _reexports(modules)
    return {name: _imports(name, path, modules, reexports) for name, path in modules.items()}


def _room(module: str) -> str:
    rooms = sorted((r for r in ALLOWED if r and (module == r or module.startswith(r + "."))), key=len)
    return rooms[-1] if rooms else ""


def test_every_room_declares_what_it_owns_and_may_import() -> None:
    """Every room's docstring says what it owns and has one ``May import:`` line that names only rooms."""
    wrong = []
    for path in sorted(_room_files().values()):
        where = path.relative_to(PACKAGE.parent)
        doc = (ast.get_docstring(ast.parse(path.read_text())) or "").strip()
        if not doc or doc.startswith(DECLARATION):
            wrong.append(f"{where}: its docstring says nothing of what the room owns")
        names = _declaration(path)
        if names is None:
            wrong.append(f"{where}: no single '{DECLARATION} a, b.c, d.*' (or '{DECLARATION} nothing') line")
        for name in names or []:
            if not _expand([name], set(ALLOWED)):
                wrong.append(f"{where}: '{DECLARATION} {name}' names no room")
    wrong += [f"{p.relative_to(PACKAGE.parent)}: in a folder with no __init__.py (a room has one)"
              for p in sorted(PACKAGE.rglob("*.py")) if not (p.parent / "__init__.py").exists()]
    assert not wrong, "rooms without a clear declaration:\n" + "\n".join(wrong)
    assert _expand(["core.*", "determined_trials"], {"", "core", "core.store", "corel"}) == {"", "core", "core.store"}


def test_imports_follow_the_rooms_directions() -> None:
    wrong = []
    for module, targets in _graph().items():
        room = _room(module)
        for target in targets:
            other = _room(target)
            if other != room and other not in ALLOWED[room] and (module, target) not in EXCEPTIONS:
                wrong.append(f"{module} -> {target} ({room or 'determined_trials'} may not import {other})")
    assert not wrong, "imports against the rooms' 'May import:' lines (docs/architecture.md):\n" + "\n".join(sorted(wrong))


def _package(module: str, modules: dict[str, Path]) -> str:
    """The package (a folder with an ``__init__.py``) a module is in; a package's ``__init__`` is in itself."""
    return ".".join(modules[module].parent.relative_to(PACKAGE).parts)


def _private_imports(name: str, path: Path, source: str, modules: dict[str, Path]) -> list[str]:
    """The imports in ``source`` (module ``name``) of another package's underscore module, each with its fix. A
    sub-package is another package to its parent and the parent to it; a module directly in determined_trials/
    (``_info``, ``_compat``, ...) is a room of its own, its module the room's interface."""
    wrong = []
    for node, module, names in _imported(name, path, source, modules):
        leaf = module.rsplit(".", 1)[-1]
        package = _package(module, modules)
        if "." not in module or not leaf.startswith("_") or package == _package(name, modules):
            continue
        where = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
        wanted = ", ".join(names) or f"the names it uses from {leaf}"
        wrong.append(f"{where}: `{ast.unparse(node)}` reaches into determined_trials.{module}; import from the "
                     f"package instead: `from determined_trials.{package} import {wanted}` (export them in "
                     f"{package.replace('.', '/')}/__init__.py's __all__)")
    return wrong


def test_no_import_of_another_packages_private_module() -> None:
    """A package's interface is its ``__init__``: other packages import what it exports, never its underscore
    modules (tests may)."""
    modules = _modules()
    wrong = [line for name, path in sorted(modules.items())
             for line in _private_imports(name, path, path.read_text(), modules)]
    assert not wrong, "imports of another package's private module:\n" + "\n".join(wrong)
    ui_data = modules["ui._data"]
    found = _private_imports("ui._data", ui_data, "from determined_trials.core.store._local import LocalStore\n"
                             "from determined_trials.core import store, _resume\nfrom . import _auth\n"
                             "from determined_trials._info import TrialInfo\n", modules)
    assert [line.split(": ", 1)[1].split(";")[0] for line in found] == [
        "`from determined_trials.core.store._local import LocalStore` reaches into determined_trials.core.store._local",
        "`from determined_trials.core import store, _resume` reaches into determined_trials.core._resume"]
    assert "`from determined_trials.core.store import LocalStore`" in found[0]


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    circles.append(sorted(component))
    return circles


def test_no_import_circles() -> None:
    circles = _circles(_graph())
    assert not circles, "import circles (break each by moving the shared piece below both):\n" + "\n".join(
        " <-> ".join(c) for c in circles)


def test_the_circle_finder_finds_a_circle() -> None:
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _circles({"a": {"b"}, "b": set()}) == []


# -- the trial-family registry: the module paths launch/_families.py imports by name ----------------------------


def test_the_family_registry_names_modules_its_room_may_import() -> None:
    """Each family's modules exist, its trial module defines the base class and ``check_trial_class``, and the
    room that imports them by name (``launch/_families.py``'s ``importlib`` calls) may import their rooms."""
    from determined_trials.launch import _families

    modules, room = _modules(), _room("launch._families")
    wrong = []
    for family in _families.FAMILIES:
        for path in (family.trial_module, family.package, family.launcher):
            short = path.removeprefix("determined_trials.")
            if short not in modules:
                wrong.append(f"{family.name}: {path} is no module of the package")
            elif _room(short) != room and _room(short) not in ALLOWED[room]:
                wrong.append(f"{family.name}: {room} may not import {path} ({_room(short)})")
        trial_file = modules.get(family.trial_module.removeprefix("determined_trials."))
        body = ast.parse(trial_file.read_text()).body if trial_file is not None else []
        defined = {node.name for node in body if isinstance(node, (ast.ClassDef, ast.FunctionDef))}
        if not {family.name, "check_trial_class"} <= defined:
            wrong.append(f"{family.name}: {family.trial_module} lacks {family.name} or check_trial_class")
    assert not wrong, "\n".join(wrong)


def test_dispatching_a_pytorch_trial_imports_no_tensorflow(tmp_path: Path) -> None:
    (tmp_path / "registry_model.py").write_text(textwrap.dedent("""
        from determined_trials import pytorch

        class MyTrial(pytorch.PyTorchTrial):
            def __init__(self, context):
                pass
            def build_training_data_loader(self):
                pass
            def build_validation_data_loader(self):
                pass
            def train_batch(self, batch, epoch_idx, batch_idx):
                pass
            def evaluate_batch(self, batch):
                pass
    """))
    loaded = _modules_after(f"""
        from determined_trials.launch._families import PYTORCH, family_of
        from determined_trials.launch.harness import load_pytorch_trial
        assert family_of(load_pytorch_trial("registry_model.py:MyTrial", {str(tmp_path)!r})) is PYTORCH
    """)
    assert "determined_trials.pytorch._trial" in loaded
    assert not {m.split(".")[0] for m in loaded} & {"tensorflow", "keras"}


def _imported_test_modules(source: str) -> list[str]:
    """The ``test_*`` modules a test file's source imports (at any depth)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return [name for name in names if name.split(".")[-1].startswith("test_")]


def test_no_test_module_imports_another() -> None:
    """What tests share lives in tests/support: a test file importing another runs only when pytest happened to
    put that file's folder on sys.path (a folder run alone fails), and runs the other's module code."""
    tests = Path(__file__).parent
    assert _imported_test_modules("from test_x import y\nimport os\ndef f():\n    import test_y\n") == ["test_x", "test_y"]
    offenders = {str(path.relative_to(tests)): found for path in sorted(tests.rglob("test_*.py"))
                 if (found := _imported_test_modules(path.read_text()))}
    assert offenders == {}


def _support_imports(source: str) -> list[str]:
    """The modules a source imports, as written (``from support import x`` is ``support.x``)."""
    names = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names.append(node.module)
            if node.module == "support":
                names.extend(f"support.{alias.name}" for alias in node.names)
        elif isinstance(node, ast.Import):
            names.extend(alias.name for alias in node.names)
    return names


def test_the_helpers_are_a_package_and_the_files_tests_run_keep_their_names() -> None:
    """tests/support's helpers are imported as the ``support`` package's modules; its trial files, workers and rank
    bodies, which other processes import by file name, by that name only (a module imported under two names is two
    modules). A worker, run by path, may import a helper by file name: its folder is its import root."""
    tests = Path(__file__).parent
    support = tests / "support"
    helpers = {p.stem for p in support.glob("helpers_*.py")}
    run_files = {p.stem for p in support.glob("*.py") if p.stem.startswith(("trials_", "worker_", "ranks_"))}

    def wrong_in(source: str, where: str, worker: bool) -> list[str]:
        wrong = []
        for module in _support_imports(source):
            if module in helpers and not worker:
                wrong.append(f"{where}: `{module}` imported flat; `from support.{module} import ...`")
            if module.startswith("support.") and module.split(".")[1] in run_files:
                wrong.append(f"{where}: `{module}`; import it by its file name: `{module.split('.')[1]}`")
        return wrong

    assert wrong_in("import helpers_paths\nfrom support import trials_pytorch as t\nfrom support.helpers_ckpt import x\n"
                    "from trials_pytorch import y\n", "f.py", False) == [
        "f.py: `helpers_paths` imported flat; `from support.helpers_paths import ...`",
        "f.py: `support.trials_pytorch`; import it by its file name: `trials_pytorch`"]
    wrong = [line for path in sorted(tests.rglob("*.py")) if "det_tutorials" not in path.parts
             for line in wrong_in(path.read_text(), str(path.relative_to(tests)),
                                  path.parent == support and path.stem.startswith("worker_"))]
    assert not wrong, "\n".join(wrong)
