"""How FSDPStrategy selects and builds the model's layers: wrap policies, activation checkpointing, meta-device init."""

from __future__ import annotations

import logging
from collections.abc import Callable, Collection, Iterable

import torch
from torch import Tensor, nn

from torchfleet.errors import ConfigurationError

log = logging.getLogger("torchfleet.strategies.fsdp")

Policy = Callable[[nn.Module], bool]
#: which submodules a policy selects: layer classes, or a predicate over modules
LayerPolicy = type[nn.Module] | Collection[type[nn.Module]] | Policy | None


def _as_policy(name: str, value: LayerPolicy) -> Policy | None:
    """``value`` (None, a layer class, a set/list of them, or a callable(module) -> bool) as a predicate."""
    if value is None:
        return None
    if isinstance(value, type):
        value = {value}
    if isinstance(value, (set, frozenset, list, tuple)):
        classes = tuple(value)
        bad = [c for c in classes if not (isinstance(c, type) and issubclass(c, nn.Module))]
        if bad or not classes:
            raise ConfigurationError(
                f"{name}={value!r} is not valid: a set of layer classes must hold nn.Module subclasses "
                f"(got {', '.join(repr(b) for b in bad) or 'an empty set'}). Give e.g. {{nn.TransformerEncoderLayer}}, "
                "or a function that takes a module and returns True for those to wrap."
            )
        return _Instances(classes)
    if callable(value):
        return value
    raise ConfigurationError(
        f"{name}={value!r} is not understood. Accepted: a set of layer classes ({{nn.TransformerEncoderLayer}}), or a "
        "function that takes a module and returns True for each one to wrap."
    )


class _Instances:
    """The policy "instances of these layer classes" (a class, not a lambda: ddp_spawn pickles the strategy)."""

    def __init__(self, classes: tuple[type[nn.Module], ...]) -> None:
        self.classes = classes

    def __call__(self, module: nn.Module) -> bool:
        return isinstance(module, self.classes)


def _on_meta(module: nn.Module) -> bool:
    return any(t.is_meta for t in _tensors(module))


def _tensors(module: nn.Module) -> Iterable[Tensor]:
    yield from module.parameters()
    yield from module.buffers()


def _apply_activation_checkpointing(module: nn.Module, policy: Policy) -> None:
    # the composable form keeps parameter names as they are (no wrapper module), so checkpoints stay portable
    from torch.distributed._composable import checkpoint
    from torch.distributed._composable.contract import _get_registry

    matched = [m for m in module.modules() if m is not module and policy(m)]
    if not matched:
        log.warning("activation_checkpointing_policy matched no submodule of %s: nothing is recomputed.",
                    type(module).__name__)
    for sub in matched:
        if "checkpoint" not in (_get_registry(sub) or {}):  # sharded again after an earlier stage: applied then
            checkpoint(sub)


def _init_method(module: nn.Module) -> Callable[[], None] | None:
    # torch's layers name it reset_parameters; a few (MultiheadAttention) only have the private form
    for name in ("reset_parameters", "_reset_parameters"):
        method = getattr(module, name, None)
        if callable(method):
            return method
    return None


def _materialize(module: nn.Module, device: torch.device) -> None:
    """Allocate the (sharded) parameters of a meta-device module on ``device`` and initialise them.

    Every module that owns parameters or buffers must be initialised by its own or an ancestor's
    ``reset_parameters``; buffers not set there come out uninitialised, so they must be too.
    """
    uncovered = []

    def visit(mod: nn.Module, name: str, covered: bool) -> None:
        covered = covered or _init_method(mod) is not None
        owns = any(True for _ in mod.parameters(recurse=False)) or any(True for _ in mod.buffers(recurse=False))
        if owns and not covered:
            uncovered.append(name or type(mod).__name__)
        for child_name, child in mod.named_children():
            visit(child, f"{name}.{child_name}" if name else child_name, covered)

    visit(module, "", False)
    if uncovered:
        raise ConfigurationError(
            f"The model was created with init_module(empty_init=True), on the meta device, but "
            f"{', '.join(map(repr, uncovered[:5]))}{' and others' if len(uncovered) > 5 else ''} own parameters or "
            "buffers that no reset_parameters() initialises, so they would start as uninitialised memory. Give those "
            "modules (or a parent) a reset_parameters() method that fills every parameter and buffer, or create the "
            "model without empty_init."
        )
    module.to_empty(device=device)
    with torch.no_grad():
        # children first: a parent's own initialisation (of its children too) has the last word
        for sub in reversed(list(module.modules())):
            method = _init_method(sub)
            if method is not None:
                method()
