"""Which torchfleet package may import which: every import in the source (top level, in functions, under
TYPE_CHECKING) is read with ast and checked against FORBIDDEN."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import torchfleet

ROOT = Path(torchfleet.__file__).parent

#: package (a directory or module under src/torchfleet) -> packages none of its modules may import
#: the layers, lowest first: parts (accelerators, environments, checkpoint, loggers, launchers) know nothing of
#: strategies; strategies know nothing of the loops; the Trainer and Fleet are two clients that ignore each other
_CLIENTS = {"trainer", "fleet", "fleet_wrappers", "cli", "cli_lightning", "cli_lightning_parser", "callbacks"}
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
    "strategies": {"connector", "module"} | _CLIENTS,
    "connector": {"module"} | _CLIENTS,
    "trainer": {"fleet", "fleet_wrappers", "cli"},
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
}

#: (module, imported module) pairs allowed while an import is being removed, each with who removes it; keep it empty
PENDING: set[tuple[str, str]] = set()


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
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


def _imports(path: Path, runtime_only: bool = False) -> list[tuple[str, int]]:
    """Every torchfleet module ``path`` imports (absolute names), with the line, wherever the import stands.

    ``runtime_only`` leaves out imports for type annotations (under ``if TYPE_CHECKING:``).
    """
    module = _module_name(path)
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
            if target == "torchfleet":  # `from torchfleet import strategies` imports the package it names
                found += [(f"torchfleet.{alias.name}", node.lineno) for alias in node.names]
            else:
                found.append((target, node.lineno))
    return [(name, line) for name, line in found if name == "torchfleet" or name.startswith("torchfleet.")]


def _package(name: str) -> str | None:
    """The first-level package of a torchfleet module name: torchfleet.checkpoint.io -> "checkpoint"."""
    parts = name.split(".")
    return parts[1] if len(parts) > 1 else None


SOURCES = sorted(ROOT.rglob("*.py"))


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
