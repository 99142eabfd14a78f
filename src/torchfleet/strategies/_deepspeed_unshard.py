"""DeepSpeedStrategy at the end of a stage: the user's module made an ordinary one again, holding the trained weights.

What the engine leaves on the module: under ZeRO-3 every parameter is an empty partition outside
forward, every layer has hooks that all-gather in forward, ``ds_*`` attributes, and a parameter dict
that gathers on access; under ZeRO 1-2 the parameters are whole but may be 16-bit copies (the float32
masters live in the optimizer) with gradient hooks on them. ``unshard`` gathers each parameter's
float32 master (or, without an optimizer, the parameter itself), destroys the engine (its hooks),
takes DeepSpeed's attributes off the layers and registers the whole weights on the CPU, in the dtypes
the module had before ``setup``. A whole ZeRO 1-2 parameter already in its dtype is kept as it is.

The engine object stays with the strategy until the next stage, with what its module held
(``Detached``), so that ``trainer.save_checkpoint`` after ``fit`` still writes the engine checkpoint: the
engine's view is put back on the layers for the length of the save.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from torchfleet.watchdog import collective

#: what ZeRO-3 sets on every layer it manages, besides its ``ds_*`` attributes
_LAYER_ATTRIBUTES = ("_external_params", "_original_parameters", "all_parameters", "applied_pre_backward_ref_cnt",
                     "post_bwd_fn", "pre_bwd_fn")


@dataclass
class Before:
    """The user's module as ``setup`` received it: tensor dtypes and each parameter's own attributes, by name.

    ``originals``: the parameters' values themselves, for an engine that converts them to 16 bits without an
    optimizer to keep float32 masters (evaluation): the weights did not change, so they are given back as they were.
    """

    dtypes: dict[str, torch.dtype]
    attributes: dict[str, frozenset[str]]
    originals: dict[str, Tensor]

    @classmethod
    def of(cls, module: nn.Module, keep_originals: bool = False) -> Before:
        named = [*module.named_parameters(), *module.named_buffers()]
        return cls({n: t.dtype for n, t in named}, {n: frozenset(vars(p)) for n, p in module.named_parameters()},
                   {n: p.data for n, p in module.named_parameters()} if keep_originals else {})


class Detached:
    """What each layer held for the engine before unsharding: its parameter and buffer dicts, DeepSpeed's attributes."""

    def __init__(self) -> None:
        self.layers: list[tuple[nn.Module, dict[str, Any], dict[str, Any], dict[str, Any]]] = []

    @contextlib.contextmanager
    def engine_view(self) -> Iterator[None]:
        """The layers as the engine left them, inside the block (an engine checkpoint reads them), as they are after."""
        now = [(layer._parameters, layer._buffers) for layer, *_ in self.layers]
        for layer, params, buffers, attributes in self.layers:
            layer._parameters, layer._buffers = params, buffers
            vars(layer).update(attributes)
        try:
            yield
        finally:
            for (layer, _, _, attributes), (params, buffers) in zip(self.layers, now):
                layer._parameters, layer._buffers = params, buffers
                for key in attributes:
                    vars(layer).pop(key, None)


def unshard(engine: Any, module: nn.Module, before: Before) -> Detached:
    """Give ``module`` (inside ``engine``) its whole weights and none of DeepSpeed's hooks or attributes (see above).

    Every rank calls it: the weights are gathered from the partitions. Returns the engine's view of the layers.
    """
    named = list(module.named_parameters(remove_duplicate=False))
    whole: dict[int, nn.Parameter] = {}
    with collective("all_gather(deepspeed: whole parameters at the end of the stage)"), torch.no_grad():
        for name, param in named:
            if id(param) not in whole:  # a tied parameter is gathered once and stays tied
                original = before.originals.get(name)
                whole[id(param)] = (_whole(param, before.dtypes.get(name, param.dtype)) if original is None else
                                    nn.Parameter(original.to("cpu", copy=True), requires_grad=param.requires_grad))
    engine.destroy()
    detached = Detached()
    for layer in engine.module.modules():  # the hook dispatcher around the module too
        attributes = {k: v for k, v in vars(layer).items() if k.startswith("ds_") or k in _LAYER_ATTRIBUTES}
        detached.layers.append((layer, layer._parameters, dict(layer._buffers), attributes))
        for key in attributes:
            delattr(layer, key)
        # ZeRO-3's dict gathers on access in forward: a plain one again, which the whole weights replace below
        layer._parameters = dict(layer._parameters.items())
    for name, param in named:
        owner, _, leaf = name.rpartition(".")
        value = whole[id(param)]
        if value is param:
            for key in set(vars(param)) - before.attributes.get(name, frozenset()):
                delattr(param, key)
        module.get_submodule(owner)._parameters[leaf] = value
    with torch.no_grad():
        for name, buffer in list(module.named_buffers()):
            dtype = before.dtypes.get(name, buffer.dtype)
            if buffer.dtype != dtype:
                owner, _, leaf = name.rpartition(".")
                module.get_submodule(owner)._buffers[leaf] = buffer.to(dtype)
    module.cpu()
    return detached


def _whole(param: Tensor, dtype: torch.dtype) -> nn.Parameter:
    """The whole weight of ``param`` as a parameter on the CPU in ``dtype`` (``param`` itself where it already is)."""
    import deepspeed
    from deepspeed.utils import safe_get_full_fp32_param

    if hasattr(param, "ds_id"):  # ZeRO-3: this rank holds a partition
        if param.requires_grad and getattr(param, "_z3_optimizer", None) is not None:
            value = safe_get_full_fp32_param(param)
        else:  # an engine without an optimizer (validate/test/predict), or a frozen parameter: the module's own
            with deepspeed.zero.GatheredParameters([param]):
                value = param.data.clone()
    elif param.dtype == dtype:
        return param  # whole, and the weights are the optimizer's masters or were never trained
    else:  # 16-bit training of a module given in float32: the optimizer's float32 masters
        # every rank takes part (a rank without a fragment of this parameter adds zeros), so test for the attribute
        value = safe_get_full_fp32_param(param) if hasattr(param, "_hp_mapping") else None
        if value is None:
            value = param.detach()
    return nn.Parameter(value.detach().to("cpu", dtype, copy=True), requires_grad=param.requires_grad)
