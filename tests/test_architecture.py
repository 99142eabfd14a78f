"""The shape of the source, read with ast: which torchfleet package may import which (every import: top level, in
functions, under TYPE_CHECKING; checked against FORBIDDEN), no two files importing each other, no file over
MAX_LINES, no strategy type check outside strategies/."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import torchfleet

ROOT = Path(torchfleet.__file__).parent

#: package (a directory or module under src/torchfleet) -> packages none of its modules may import
#: the layers, lowest first: parts (accelerators, environments, checkpoint, loggers, launchers) know nothing of
#: strategies; strategies know nothing of the loops; the Trainer and Fleet are two clients that ignore each other
_CLIENTS = {"trainer", "fleet", "fleet_wrappers", "cli", "cli_lightning", "cli_lightning_parser", "callbacks",
            # Lightning's module paths over the clients (docs/porting.md): nothing below imports them
            "core", "fabric", "wrappers"}
_PARTS_MAY_NOT = {"strategies", "connector", "module"} | _CLIENTS
FORBIDDEN: dict[str, set[str]] = {
    "accelerators": _PARTS_MAY_NOT | {"launchers"},
    "environments": _PARTS_MAY_NOT | {"launchers", "accelerators"},
    "checkpoint": _PARTS_MAY_NOT | {"launchers"},
    "loggers": _PARTS_MAY_NOT,
    "profilers": _PARTS_MAY_NOT,
    "launchers": _PARTS_MAY_NOT,
    "precision": _PARTS_MAY_NOT,
    "preemption": _PARTS_MAY_NOT | {"launchers", "environments", "accelerators", "checkpoint", "loggers"},
    "signals": _PARTS_MAY_NOT | {"launchers", "environments", "accelerators", "checkpoint", "loggers"},
    # the collectives' record sits below every layer that issues collectives or reports them (launchers)
    "watchdog": _PARTS_MAY_NOT | {"launchers", "environments", "accelerators", "checkpoint", "loggers", "preemption",
                                  "signals", "profilers"},
    # the user-facing collectives sit below the Module and both clients, over the watchdog that numbers them
    "collectives": _PARTS_MAY_NOT | {"launchers", "accelerators", "environments", "checkpoint", "loggers"},
    "strategies": {"connector", "module"} | _CLIENTS,
    "connector": {"module"} | _CLIENTS,
    "trainer": {"fleet", "fleet_wrappers", "cli", "core", "fabric", "wrappers"},
    "fleet": {"trainer", "cli", "callbacks"},
    # leaves: seed uses rank_zero (the rank), rank_zero uses nothing of torchfleet; utilities (Lightning's module
    # paths) sits on them and imports nothing else, so any layer may import it
    "seed": _PARTS_MAY_NOT | {"launchers", "accelerators", "environments", "checkpoint", "loggers", "utilities"},
    "rank_zero": _PARTS_MAY_NOT | {"launchers", "accelerators", "environments", "checkpoint", "loggers", "seed",
                                   "utilities"},
    "utilities": _PARTS_MAY_NOT | {"launchers", "accelerators", "environments", "checkpoint", "loggers", "profilers",
                                   "precision", "preemption", "plugins", "demos", "data"},
    "compiled": _PARTS_MAY_NOT | {"launchers", "accelerators", "environments", "checkpoint", "loggers", "seed"},
    "plugins": {"connector", "module", "launchers"} | _CLIENTS,
    "demos": {"trainer", "fleet", "fleet_wrappers", "cli", "strategies", "connector"},
    # the planner asks strategies for their MemoryModel and runs a Module's step on fake tensors; the clients call it
    "planner": {"connector"} | _CLIENTS,
}

#: (module, imported module) pairs allowed while an import is being removed, each with who removes it; keep it empty
PENDING: set[tuple[str, str]] = set()


#: the longest a source file may be: a longer one holds two jobs (split it by job, so a reader finds the room by name)
MAX_LINES = 550
#: files (under src/torchfleet) still longer than MAX_LINES, being split (issue 21); each must still be too long, so
#: the set only shrinks
LONG_FILES_PENDING: set[str] = set()

#: groups of modules that still import each other; a cycle must lie inside one group, and every module listed must
#: still be in a cycle, so they only shrink. Empty (issue 21): the Module and the loops meet through running.py, the
#: door, the loops name trainer/loop_trainer.py's LoopTrainer, not the Trainer class that calls them, and the
#: strategies' checkpoint and optimizer helpers read their strategy through Protocols.
CYCLES_PENDING: list[set[str]] = []


def _module_name(path: Path, root: Path = ROOT) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_type_checking(node: ast.AST) -> bool:
    test = getattr(node, "test", None)
    return isinstance(node, ast.If) and (
        (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING")
        or (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"))


def _walk(tree: ast.AST, runtime_only: bool):
    """ast.walk, leaving out the bodies of ``if TYPE_CHECKING:`` blocks when ``runtime_only``."""
    todo = [tree]
    while todo:
        node = todo.pop()
        yield node
        if runtime_only and _is_type_checking(node):
            todo.extend(node.orelse)
            continue
        todo.extend(ast.iter_child_nodes(node))


def _imports(path: Path, runtime_only: bool = False, root: Path = ROOT,
             modules: set[str] | None = None) -> list[tuple[str, int]]:
    """Every torchfleet module ``path`` imports (absolute names), with the line, wherever the import stands.

    ``runtime_only`` leaves out imports for type annotations (under ``if TYPE_CHECKING:``). ``from X import y``
    imports ``X.y`` where that is a module (of ``modules``, default: this source tree's), else ``X``.
    """
    modules = MODULES if modules is None else modules
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found = []
    for node in _walk(ast.parse(path.read_text(), filename=str(path)), runtime_only):
        if isinstance(node, ast.Import):
            found += [(alias.name, node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            # `from torchfleet import strategies`, `from torchfleet.checkpoint import safe`: the module it names
            found += [(f"{target}.{alias.name}" if f"{target}.{alias.name}" in modules else target, node.lineno)
                      for alias in node.names]
    return [(name, line) for name, line in found if name == "torchfleet" or name.startswith("torchfleet.")]


def _package(name: str) -> str | None:
    """The first-level package of a torchfleet module name: torchfleet.checkpoint.io -> "checkpoint"."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


SOURCES = sorted(ROOT.rglob("*.py"))
MODULES = {_module_name(path) for path in SOURCES}


def test_the_table_names_real_packages():
    present = {p.name for p in ROOT.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    present |= {p.stem for p in ROOT.glob("*.py")}
    named = set(FORBIDDEN) | {f for forbidden in FORBIDDEN.values() for f in forbidden}
    assert named <= present, f"FORBIDDEN names packages that do not exist: {sorted(named - present)}"


@pytest.mark.parametrize("package", sorted(FORBIDDEN))
def test_dependency_direction(package):
    violations = []
    for path in SOURCES:
        module = _module_name(path)
        if _package(module) != package:
            continue
        for name, line in _imports(path):
            if _package(name) in FORBIDDEN[package] and (module, name) not in PENDING:
                violations.append(f"{path.relative_to(ROOT.parent)}:{line} imports {name}")
    assert not violations, (f"torchfleet.{package} must not import {', '.join(sorted(FORBIDDEN[package]))}:\n"
                            + "\n".join(violations))


def test_pending_exceptions_still_exist():
    """An exception whose import is gone must leave PENDING, so that the import cannot come back unnoticed."""
    current = {(_module_name(path), name) for path in SOURCES for name, _ in _imports(path)}
    assert not PENDING - current, f"remove from PENDING: {sorted(PENDING - current)}"


def test_no_package_import_cycle():
    """Between first-level packages, the imports that run form no cycle (annotations may point back)."""
    edges: dict[str, set[str]] = {}
    for path in SOURCES:
        here = _package(_module_name(path))
        for name, _ in _imports(path, runtime_only=True):
            there = _package(name)
            if here and there and there != here:
                edges.setdefault(here, set()).add(there)
    done: set[str] = set()

    def visit(node: str, trail: list[str]) -> None:
        if node in trail:
            cycle = trail[trail.index(node):] + [node]
            raise AssertionError("import cycle between packages: " + " -> ".join(cycle))
        if node in done:
            return
        for nxt in sorted(edges.get(node, ())):
            visit(nxt, trail + [node])
        done.add(node)

    for start in sorted(edges):
        visit(start, [])


# --------------------------------------------------------------------------- files that import each other
def _import_cycles(paths: list[Path], root: Path = ROOT) -> list[set[str]]:
    """The groups of modules that import each other (strongly connected components of more than one module).

    Every import counts: at module level, in functions and under TYPE_CHECKING. The top package's ``__init__`` is
    left out: it is a lazy facade whose imports only name its public objects for type checkers.
    """
    modules = {_module_name(path, root) for path in paths}
    graph = {_module_name(path, root): {name for name, _ in _imports(path, root=root, modules=modules) if name in modules}
             for path in paths if path.parent != root or path.name != "__init__.py"}
    # Tarjan's algorithm, iterative (the graph is small, but recursion depth should not depend on it)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    groups: list[set[str]] = []
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph.get(start, ()))))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
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
                group = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    group.add(member)
                    if member == node:
                        break
                if len(group) > 1:
                    groups.append(group)
    return groups


def _cycles_not_pending(cycles: list[set[str]], pending: list[set[str]]) -> list[set[str]]:
    return [group for group in cycles if not any(group <= allowed for allowed in pending)]


def test_no_files_import_each_other():
    """No module imports, at run time or for type checking, a module that imports it back (directly or not)."""
    new = _cycles_not_pending(_import_cycles(SOURCES), CYCLES_PENDING)
    assert not new, "modules that import each other (break the loop with a lower shared module or a protocol):\n" + \
        "\n".join(" <-> ".join(sorted(group)) for group in new)


def test_pending_cycles_still_exist():
    """A module that no longer imports its way back leaves CYCLES_PENDING, so that the loop cannot come back."""
    in_cycles = set().union(*_import_cycles(SOURCES))
    stale = sorted(set().union(*CYCLES_PENDING) - in_cycles)
    assert not stale, f"remove from CYCLES_PENDING (no longer in an import cycle): {stale}"


def test_the_cycle_rule_sees_imports_in_functions_and_for_type_checking(tmp_path):
    package = tmp_path / "torchfleet"
    package.mkdir()
    files = {
        "__init__.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from torchfleet.a import A\n",
        "a.py": "def f():\n    from torchfleet import b\n",
        "b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from torchfleet.a import f\n",
        "c.py": "from torchfleet.d import x\n",
        "d.py": "from . import c\n",
        "e.py": "import torchfleet.a\n",
    }
    for name, text in files.items():
        (package / name).write_text(text)
    paths = sorted(package.glob("*.py"))
    cycles = _import_cycles(paths, package)
    assert sorted(map(sorted, cycles)) == [["torchfleet.a", "torchfleet.b"], ["torchfleet.c", "torchfleet.d"]]
    assert _cycles_not_pending(cycles, [{"torchfleet.a", "torchfleet.b", "torchfleet.e"}]) == [
        {"torchfleet.c", "torchfleet.d"}]


# --------------------------------------------------------------------------- file length
def _too_long(paths: list[Path], root: Path = ROOT) -> dict[str, int]:
    """Source files longer than MAX_LINES (path under ``root`` -> lines)."""
    lengths = {path.relative_to(root).as_posix(): len(path.read_text().splitlines()) for path in paths}
    return {name: lines for name, lines in lengths.items() if lines > MAX_LINES}


def test_no_source_file_is_too_long():
    """One job per file: a file over MAX_LINES is split by job (watchdog/ is the pattern)."""
    new = {name: lines for name, lines in _too_long(SOURCES).items() if name not in LONG_FILES_PENDING}
    assert not new, f"files over {MAX_LINES} lines (split them by job): {new}"


def test_pending_long_files_are_still_long():
    """A file split below MAX_LINES leaves LONG_FILES_PENDING, so that it cannot grow back unnoticed."""
    stale = sorted(LONG_FILES_PENDING - set(_too_long(SOURCES)))
    assert not stale, f"remove from LONG_FILES_PENDING (now {MAX_LINES} lines or fewer): {stale}"


def test_the_length_rule_counts_lines(tmp_path):
    (tmp_path / "long.py").write_text("x = 1\n" * (MAX_LINES + 1))
    (tmp_path / "short.py").write_text("x = 1\n" * MAX_LINES)
    assert _too_long(sorted(tmp_path.glob("*.py")), tmp_path) == {"long.py": MAX_LINES + 1}


# --------------------------------------------------------------------------- strategy type checks
def _strategy_type_checks(tree: ast.AST) -> list[int]:
    """Lines of ``isinstance``/``issubclass`` calls against a strategy class (a name ending in ``Strategy``).

    The base class itself is allowed: "is this a strategy at all" checks an argument, it does not ask which one.
    """
    def strategy_class(node: ast.AST) -> bool:
        if isinstance(node, ast.Tuple):
            return any(strategy_class(element) for element in node.elts)
        name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
        return name.endswith("Strategy") and name != "Strategy"

    return [node.lineno for node in ast.walk(tree)
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            and node.func.id in ("isinstance", "issubclass") and len(node.args) == 2 and strategy_class(node.args[1])]


def test_no_strategy_type_checks_outside_strategies():
    """A behaviour that differs per strategy is a Strategy method or attribute, asked, never an isinstance."""
    found = [f"{path.relative_to(ROOT.parent)}:{line}" for path in SOURCES
             if _package(_module_name(path)) != "strategies"
             for line in _strategy_type_checks(ast.parse(path.read_text(), filename=str(path)))]
    assert not found, "strategy type checks outside strategies/ (ask the strategy instead):\n" + "\n".join(found)


def test_the_type_check_rule_finds_strategy_classes():
    snippet = ("isinstance(s, DDPStrategy)\n"
               "issubclass(cls, (int, strategies.DeepSpeedStrategy))\n"
               "isinstance(s, Strategy)\n"
               "isinstance(s, dict)\n")
    assert _strategy_type_checks(ast.parse(snippet)) == [1, 2]


# --------------------------------------------------------------------------- the Module <-> loop door
#: names that hold a user's Module or DataModule in the loops' code (``self.model``, ``trainer.lightning_module``,
#: ``replica``...), compared without their leading underscores
_MODULE_HOLDERS = {"model", "module", "pl_module", "lightning_module", "datamodule", "dm", "replica", "original",
                   "user_module", "wrapped_module"}
#: names that hold the Trainer or Fleet running a Module, in the Module's code (``self._trainer``, ``owner``...)
_RUNNER_HOLDERS = {"trainer", "fleet", "fabric", "owner", "runner"}
#: private names that are not an object's own state: ``_orig_mod`` is torch.compile's public way to the model inside
_NOT_PRIVATE = {"_orig_mod"}
#: the loops' side of the door, and the Module's (under src/torchfleet)
_LOOP_SIDE = ("trainer/", "fleet.py", "fleet_wrappers.py")
_MODULE_SIDE = ("module.py", "module_export.py", "data.py", "hparams.py")


def _holder(node: ast.AST) -> str | None:
    """The name an expression is held under (``x``, ``self._x``, ``a.b.x`` -> "x"), without leading underscores."""
    name = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else None
    return None if name is None else name.lstrip("_")


def _private(name: object) -> bool:
    return (isinstance(name, str) and name.startswith("_") and not (name.startswith("__") and name.endswith("__"))
            and name not in _NOT_PRIVATE)


def _private_crossings(tree: ast.AST, holders: set[str]) -> list[int]:
    """Lines where code reaches into another object's private state: ``<holder>._name`` (read or written),
    ``getattr/setattr/hasattr/delattr(<holder>, "_name")``, ``<holder>.__dict__["_name"]`` or ``.get("_name")``,
    and ``object.__setattr__(x, ...)`` on anything but ``self``. Dunder names are not private state."""
    lines = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _private(node.attr) and _holder(node.value) in holders:
            lines.append(node.lineno)
        elif isinstance(node, ast.Call) and node.args:
            func, first = node.func, node.args[0]
            if (isinstance(func, ast.Attribute) and func.attr == "__setattr__" and isinstance(func.value, ast.Name)
                    and func.value.id == "object" and not (isinstance(first, ast.Name) and first.id == "self")):
                lines.append(node.lineno)
            elif (isinstance(func, ast.Name) and func.id in ("getattr", "setattr", "hasattr", "delattr")
                  and len(node.args) > 1 and isinstance(node.args[1], ast.Constant) and _private(node.args[1].value)
                  and _holder(first) in holders):
                lines.append(node.lineno)
            elif (isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault")
                  and isinstance(func.value, ast.Attribute) and func.value.attr == "__dict__"
                  and _holder(func.value.value) in holders and isinstance(first, ast.Constant)
                  and _private(first.value)):
                lines.append(node.lineno)
        elif (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Attribute)
              and node.value.attr == "__dict__" and _holder(node.value.value) in holders
              and isinstance(node.slice, ast.Constant) and _private(node.slice.value)):
            lines.append(node.lineno)
    return sorted(set(lines))


def _door_crossings() -> list[str]:
    found = []
    for path in SOURCES:
        name = path.relative_to(ROOT).as_posix()
        holders = (_MODULE_HOLDERS if name.startswith(_LOOP_SIDE) else _RUNNER_HOLDERS if name in _MODULE_SIDE
                   else None)
        if holders is not None:
            tree = ast.parse(path.read_text(), filename=str(path))
            found += [f"{name}:{line}" for line in _private_crossings(tree, holders)]
    return found


def test_no_private_access_across_the_module_loop_door():
    """The loops reach a Module (DataModule) only through its public names and the door (torchfleet/running.py),
    and a Module reaches the Trainer or Fleet running it only through theirs."""
    found = _door_crossings()
    assert not found, "private access across the Module <-> loop door (use running.py's door):\n" + "\n".join(found)


def test_the_door_rule_finds_private_access():
    snippet = ("model._results = None\n"                      # 1: a write
               "x = self.trainer.lightning_module._current_fx\n"  # 2: a read through a chain
               "object.__setattr__(module, '_fleet', self)\n"  # 3
               "getattr(dm, '_log_hyperparams', False)\n"      # 4
               "model.__dict__.get('_configured')\n"           # 5
               "self._model._x\n"                              # 6: a holder under a private name
               "object.__setattr__(self, '_mine', 1)\n"        # its own state
               "model.__class__, model._orig_mod, model.hparams\n"  # dunder, torch.compile's, public
               "optimizer._step\n"                             # not a Module holder
               "getattr(model, 'hparams')\n")
    assert _private_crossings(ast.parse(snippet), _MODULE_HOLDERS) == [1, 2, 3, 4, 5, 6]
    module_side = "self._trainer._clip\ntrainer._manual_backward(x)\nself._fleet.log(1)\nself._trainer = t\n"
    assert _private_crossings(ast.parse(module_side), _RUNNER_HOLDERS) == [1, 2]
