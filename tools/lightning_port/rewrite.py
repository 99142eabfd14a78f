"""Rewrite one Lightning test file so that it imports torchfleet: its import lines and its dotted-path strings.

Only what a user porting a program would change is changed: import statements (``from lightning.pytorch import
LightningModule`` becomes ``from torchfleet.module import Module as LightningModule``, so the test body reads as
before), dotted paths given to ``mock.patch`` and the seed's environment variables. Every rewritten statement
keeps the line it had, so a traceback's line numbers point into Lightning's original file.
"""

from __future__ import annotations

import ast
from collections import Counter
from dataclasses import dataclass, field

from lightning_port import names

_RUNTIME = '__import__("lightning_port_names")'


@dataclass
class Rewritten:
    """The new source and what the port could not map (Lightning path -> number of imports of it)."""

    source: str
    missing: Counter = field(default_factory=Counter)
    strings_left: list[str] = field(default_factory=list)


def _from_import(node: ast.ImportFrom, missing: Counter) -> list[str]:
    out = []
    for alias in node.names:
        local = alias.asname or alias.name
        if alias.name == "*":
            out.append(f"globals().update(vars({_RUNTIME}.namespace({node.module!r})))")
            continue
        kind, value = names.resolve(node.module, alias.name)
        if kind == "object":
            module, name = value
            out.append(f"from {module} import {name} as {local}" if name != local else f"from {module} import {name}")
        elif kind == "module":
            out.append(f"import {value} as {local}")
        elif kind == "fact":
            out.append(f"{local} = {value!r}")
        else:
            missing[value] += 1
            out.append(f"{local} = {_RUNTIME}.missing({value!r})")
    return out


def _import(node: ast.Import) -> list[str]:
    out = []
    for alias in node.names:
        if not names.is_lightning(alias.name):
            out.append(f"import {alias.name} as {alias.asname}" if alias.asname else f"import {alias.name}")
        elif alias.asname:
            out.append(f"{alias.asname} = {_RUNTIME}.namespace({alias.name!r})")
        else:  # `import lightning.pytorch` binds the root name
            root = alias.name.partition(".")[0]
            out.append(f"{root} = {_RUNTIME}.namespace({root!r})")
    return out


def _replace_lines(lines: list[str], node: ast.stmt, statements: list[str]) -> None:
    first, last = node.lineno - 1, node.end_lineno - 1
    indent = lines[first][: node.col_offset]
    lines[first] = indent + "; ".join(statements) + "\n"
    for i in range(first + 1, last + 1):
        lines[i] = "\n"  # keep the line count, so line numbers stay Lightning's


def rewrite_source(source: str) -> Rewritten:
    """Port ``source`` (a Lightning test module or helper); the result still imports ``tests_pytorch.*``."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    result = Rewritten(source)
    string_edits: dict[int, list[tuple[int, int, str]]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and names.is_lightning(node.module):
            _replace_lines(lines, node, _from_import(node, result.missing))
        elif isinstance(node, ast.Import) and any(names.is_lightning(a.name) for a in node.names):
            _replace_lines(lines, node, _import(node))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.lineno == node.end_lineno:
            new = _port_string(node.value)
            if new is None:
                if names.is_lightning(node.value) and "." in node.value and " " not in node.value:
                    result.strings_left.append(node.value)
                continue
            string_edits.setdefault(node.lineno - 1, []).append((node.col_offset, node.end_col_offset, repr(new)))
    for index, edits in string_edits.items():
        line = lines[index].encode()  # ast's column offsets count UTF-8 bytes
        for start, end, text in sorted(edits, reverse=True):
            line = line[:start] + text.encode() + line[end:]
        lines[index] = line.decode()
    result.source = "".join(lines)
    return result


def _port_string(value: str) -> str | None:
    if value in names.ENV_RENAMES:
        return names.ENV_RENAMES[value]
    if " " in value or "." not in value or not names.is_lightning(value):
        return None
    return names.map_dotted(value)
