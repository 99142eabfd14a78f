"""``grad_norm``: each parameter's gradient norm and their total, for logging (Lightning's ``utilities.grad_norm``)."""

from __future__ import annotations

import torch
from torch import nn

from torchfleet.errors import ConfigurationError


def grad_norm(module: nn.Module, norm_type: float | int | str, group_separator: str = "/") -> dict[str, torch.Tensor]:
    """The p-norm of every parameter's gradient, and of all of them as one vector, keyed for ``self.log_dict``.

    Keys are ``grad_{p}_norm{group_separator}{parameter name}`` and ``grad_{p}_norm_total`` (``p`` as a float:
    ``grad_2.0_norm/layer.weight``); parameters without a gradient are left out, and with none at all the
    dict is empty. ``norm_type`` is a positive number or "inf".
    """
    try:
        p = float(norm_type)
    except (TypeError, ValueError):
        p = float("nan")
    if not p > 0:
        raise ConfigurationError(
            f"grad_norm(norm_type={norm_type!r}) is not valid: give a positive number (2 for the Euclidean norm) "
            "or 'inf' for the largest absolute value."
        )
    norms = {f"grad_{p}_norm{group_separator}{name}": param.grad.detach().norm(p)
             for name, param in module.named_parameters() if param.grad is not None}
    if norms:
        # the norm of the per-parameter norms is the norm of all gradients as one vector, for every p
        norms[f"grad_{p}_norm_total"] = torch.stack([n.float() for n in norms.values()]).norm(p)
    return norms
