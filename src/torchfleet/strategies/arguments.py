"""The constructor keywords that several strategies share, each declared once: its default and its type.

A strategy's ``__init__`` names its public signature with ``@takes(...)``: the keywords in their positional order,
those of ``SHARED`` by name only. The function itself declares only its own keywords (and, after ``self``, a
``given`` parameter): the call is bound to the public signature (positions and keywords as written), and the
function receives its own keywords by name and the shared ones, with their defaults filled in, in ``given``. It
passes them on with ``pick(given, ...)``. ``inspect.signature`` of the class shows the whole public signature.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from datetime import timedelta
from typing import Any

#: torch's own default for process groups (30 minutes)
DEFAULT_TIMEOUT = timedelta(minutes=30)

#: what a type checker sees of a ``@takes`` constructor: any arguments (the checked signature is the runtime one,
#: ``inspect.signature``; the written function's ``given`` parameter must not look like a required argument)
_Init = Callable[..., None]


def _keyword(name: str, default: Any, annotation: str) -> inspect.Parameter:
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=default, annotation=annotation)


#: the shared keywords: Strategy's parts, ParallelStrategy's devices and cluster, and the process options
#: (processes.ProcessOptions)
SHARED: dict[str, inspect.Parameter] = {p.name: p for p in (
    _keyword("accelerator", None, "Accelerator | None"),
    _keyword("parallel_devices", None, "list[torch.device] | None"),
    _keyword("cluster_environment", None, "ClusterEnvironment | None"),
    _keyword("checkpoint_io", None, "CheckpointIO | None"),
    _keyword("precision", None, "Precision | None"),
    _keyword("process_group_backend", None, "str | None"),
    _keyword("timeout", DEFAULT_TIMEOUT, "timedelta | float | None"),
    _keyword("start_method", "popen", "str"),
    _keyword("precision_plugin", None, "Precision | None"),
    _keyword("max_restarts", 0, "int"),
)}

#: what Strategy's constructor takes
PARTS = ("accelerator", "precision", "checkpoint_io", "precision_plugin")
#: what ParallelStrategy's constructor takes, in its order
PARALLEL = ("accelerator", "parallel_devices", "cluster_environment", "checkpoint_io", "precision",
            "process_group_backend", "precision_plugin")


def pick(given: Mapping[str, Any], names: tuple[str, ...]) -> dict[str, Any]:
    """The entries of ``given`` named in ``names`` (those a base class's constructor takes)."""
    return {name: given[name] for name in names if name in given}


def takes(*order: str) -> Callable[[_Init], _Init]:
    """Give the decorated ``__init__(self, given, <own keywords>, [**extra])`` the public signature ``order``.

    ``order``: every public keyword in its position, shared (``SHARED``) and own alike; a ``**`` parameter of the
    function comes last.
    """

    def decorate(init: _Init) -> _Init:
        written = inspect.signature(init).parameters
        own = {name for name in written if name not in ("self", "given")}
        unknown = [name for name in order if name not in own and name not in SHARED]
        assert not unknown, f"@takes names keywords neither shared nor declared by the function: {unknown}"
        extra = [p for p in written.values() if p.kind is inspect.Parameter.VAR_KEYWORD]
        signature = inspect.Signature([written["self"], *(written[n] if n in own else SHARED[n] for n in order),
                                       *extra])
        own -= {p.name for p in extra}
        shared = [name for name in order if name not in own]

        @functools.wraps(init)
        def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
            bound = signature.bind(self, *args, **kwargs)
            bound.apply_defaults()
            arguments = bound.arguments
            rest = arguments.pop(extra[0].name, {}) if extra else {}
            given = {name: arguments.pop(name) for name in shared}
            del arguments["self"]
            init(self, given, **arguments, **rest)

        __init__.__signature__ = signature  # type: ignore[attr-defined]
        return __init__  # type: ignore[return-value]

    return decorate
