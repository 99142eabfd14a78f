"""Lightning's ``utilities.parameter_tying``: finding parameters shared between layers, and tying them again."""

from __future__ import annotations

from torch import nn

__all__ = ["find_shared_parameters", "set_shared_parameters"]


def find_shared_parameters(module: nn.Module) -> list[list[str]]:
    """The names of each parameter ``module`` reaches under more than one name, one list per shared parameter."""
    names: dict[int, list[str]] = {}
    for name, parameter in module.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), []).append(name)
    return [group for group in names.values() if len(group) > 1]


def set_shared_parameters(module: nn.Module, shared_params: list[list[str]]) -> nn.Module:
    """Tie the parameters of each group of names to the group's first one (after a copy or a move untied them)."""
    for group in shared_params:
        first = module.get_parameter(group[0])
        for name in group[1:]:
            owner, _, attribute = name.rpartition(".")
            setattr(module.get_submodule(owner), attribute, first)
    return module
