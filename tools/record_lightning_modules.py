"""Write every public module path of Lightning's ``lightning.pytorch`` and ``lightning.fabric`` and each module's
public names as JSON: the list tests/test_lightning_modules.py checks torchfleet's module paths against.

Run it with the reference Lightning, not this package's environment:
``/work/venv-lightning/bin/python tools/record_lightning_modules.py > tests/lightning_modules.json``.

The rule (docs/porting.md, "Lightning's module paths"):

- a module is public when no part of its dotted path starts with an underscore; the two roots count;
- its public names are its ``__all__`` where it defines one; otherwise the names its own source binds at the top
  level (classes, functions, assigned names, also under a top-level ``if``/``try``, not under ``if TYPE_CHECKING``
  or ``if __name__ == "__main__"``), and, for a package's ``__init__``, the names it imports from Lightning's
  modules (how ``lightning.pytorch.plugins.environments.SLURMEnvironment`` is documented; a plain module's
  imports are its working parts and do not count); never a name
  starting with an underscore, nor a module's logger, warning cache or TypeVar (``log = logging.getLogger(...)``,
  ``warning_cache = WarningCache()``, ``T = TypeVar("T")``), which are the module's working parts, not its API.

The source is read with ``ast`` rather than imported, so a module whose optional package is missing here (its
import fails) is listed too.
"""

from __future__ import annotations

import ast
import json
import os
import pkgutil

_WORKING_PARTS = ("getLogger", "WarningCache", "TypeVar")


def _call_name(node: ast.expr | None) -> str:
    if isinstance(node, ast.Call):
        func = node.func
        return func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return ""


def _targets(target: ast.expr) -> list[str]:
    if isinstance(target, ast.Name):
        return [target.id]
    if isinstance(target, (ast.Tuple, ast.List)):
        return [name for element in target.elts for name in _targets(element)]
    return []


def _bound(body: list[ast.stmt], package: str | None) -> list[str]:
    """The names ``body`` binds at the top level (see the module docstring for the rule)."""
    names: list[str] = []
    for stmt in body:
        if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.append(stmt.name)
        elif isinstance(stmt, (ast.Assign, ast.AnnAssign)) and stmt.value is not None:
            if _call_name(stmt.value) not in _WORKING_PARTS:
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                names.extend(name for target in targets for name in _targets(target))
        elif isinstance(stmt, ast.If):
            test = ast.unparse(stmt.test)
            if "TYPE_CHECKING" not in test and "__main__" not in test:
                names.extend(_bound(stmt.body, package))
            names.extend(_bound(stmt.orelse, package))
        elif isinstance(stmt, ast.Try):
            for block in (stmt.body, stmt.orelse, stmt.finalbody, *(h.body for h in stmt.handlers)):
                names.extend(_bound(block, package))
        elif isinstance(stmt, ast.ImportFrom) and package is not None:
            source = "." * stmt.level + (stmt.module or "") if stmt.level else stmt.module or ""
            if stmt.level or source.startswith("lightning."):
                names.extend(alias.asname or alias.name for alias in stmt.names)
    return names


def _declared_all(tree: ast.Module) -> list[str] | None:
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and any(getattr(t, "id", None) == "__all__" for t in stmt.targets):
            return list(ast.literal_eval(stmt.value))
    return None


def public_names(path: str, module: str, is_package: bool) -> list[str]:
    """The public names of ``module`` whose source is at ``path``."""
    with open(path) as f:
        tree = ast.parse(f.read())
    names = _declared_all(tree)
    if names is None:
        names = _bound(tree.body, module if is_package else None)
    return sorted({name for name in names if not name.startswith("_")})


def public_modules() -> dict[str, object]:
    import lightning

    root = os.path.dirname(lightning.__file__)
    modules: dict[str, list[str]] = {}
    for top in ("lightning.fabric", "lightning.pytorch"):
        folder = os.path.join(root, top.split(".")[1])
        modules[top] = public_names(os.path.join(folder, "__init__.py"), top, True)
        for info in pkgutil.walk_packages([folder], top + "."):
            if any(part.startswith("_") for part in info.name.split(".")):
                continue
            relative = info.name.split(".")[2:]
            path = os.path.join(folder, *relative)
            path = os.path.join(path, "__init__.py") if info.ispkg else path + ".py"
            modules[info.name] = public_names(path, info.name, info.ispkg)
    return {"lightning": lightning.__version__, "modules": dict(sorted(modules.items()))}


if __name__ == "__main__":
    print(json.dumps(public_modules(), indent=1))
