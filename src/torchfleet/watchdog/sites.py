"""Where a collective was asked for: the first frame of the user's code, found by walking past torchfleet and torch."""

from __future__ import annotations

import os
import sys

#: the torchfleet package's folder (this file is in torchfleet/watchdog/)
_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def _torch_dir() -> str:
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


#: file name -> _USER (the user's code), _FOREIGN (torch, the standard library, torchfleet's collective plumbing) or
#: _OWN (torchfleet code that asks for a collective: named when no user code is on the stack)
_INTERNAL: dict[str, int] = {}
_USER, _FOREIGN, _OWN = 0, 1, 2
#: torchfleet files that only pass a collective on: never the place to name
_PLUMBING = ("watchdog" + os.sep, "module.py", "strategies" + os.sep, os.path.join("trainer", "logging.py"))


def _internal(name: str) -> int:
    import sysconfig

    stdlib = sysconfig.get_paths()["stdlib"] + os.sep
    purelib = sysconfig.get_paths()["purelib"] + os.sep
    if name.startswith(_PKG_DIR):
        kind = _FOREIGN if name[len(_PKG_DIR):].startswith(_PLUMBING) else _OWN
    # "<string>": the ``python -c`` of a spawned process (ddp_spawn), with no source to point to
    elif (name.startswith((_torch_dir(), "<frozen")) or name == "<string>"
          or (name.startswith(stdlib) and not name.startswith(purelib))):
        kind = _FOREIGN
    else:
        kind = _USER
    _INTERNAL[name] = kind
    return kind


def call_site(depth: int = 2, function: bool = False) -> str:
    """``file:line`` (``function``: then `` in <function>``) of the first frame outside torchfleet, torch and the
    standard library (the user's code).

    With no user code on the stack (a collective the Trainer issues in a spawned rank), the torchfleet code that
    asked for it, e.g. ``torchfleet/trainer/eval_loop.py:40 in publish_epoch``.
    """
    frame = sys._getframe(depth)
    known = _INTERNAL
    own = None
    while frame is not None:
        name = frame.f_code.co_filename
        kind = known.get(name)
        if kind is None:
            kind = _internal(name)
        if kind == _USER:
            return f"{name}:{frame.f_lineno} in {frame.f_code.co_name}" if function else f"{name}:{frame.f_lineno}"
        if kind == _OWN and own is None:
            own = frame
        frame = frame.f_back
    if own is None:
        return "(no user code on the stack)"
    where = os.path.relpath(own.f_code.co_filename, os.path.dirname(_PKG_DIR[:-1]))
    return f"{where}:{own.f_lineno} in {own.f_code.co_name}"
