"""What FSDPStrategy adds to fully_shard on the user's module, and how it takes fully_shard off again.

Numbered gathers: every FSDP unit's forward all-gather (and the gather before a step method the
strategy registered, such as ``training_step``) is a torchfleet collective (``watchdog.collective``)
named after the unit, at the user's line and the function it is in. A forward that runs on some
ranks only (a ``@rank_zero_only`` callback sampling from the model) then waits in a numbered gather
while the other ranks wait elsewhere, and the watchdog reports the desync, naming the rank, the
hook and the line, instead of gloo aborting or the run hanging unexplained. The record covers the
gather only, never the unit's computation, so a slow layer is never taken for a desync.

Unsharding (``unshard``): at the end of a stage each parameter is gathered whole, fully_shard's
hooks, state and class are taken off every unit, and the whole parameters are registered in their
place, so the module is an ordinary one that any rank can call alone. The optimizers keep their
sharded state, now keyed by the whole parameters, so ``trainer.save_checkpoint`` after ``fit``
still writes the optimizer state. A later stage shards the module again from its (whole) weights.
This reaches into fully_shard's state (torch offers no way back); the fsdp tests exercise each part.
"""

from __future__ import annotations

import collections
import functools
import weakref
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn
from torch.optim import Optimizer

from torchfleet.watchdog import call_site, collective

#: per sharded module, the hook handles of its numbered gathers (removed when it is unsharded)
_HANDLES: weakref.WeakKeyDictionary[nn.Module, list[Any]] = weakref.WeakKeyDictionary()
#: what marks the step methods registered here, so that unsharding finds them in the instance's __dict__
_MARK = "_torchfleet_fsdp_method"
#: set on a module whose ``zero_grad`` reaches the sharded gradients (route_zero_grad)
_MARK_ZERO = "_torchfleet_fsdp_zero_grad"
#: attributes fully_shard sets on every module it manages (read by torch.compile)
_MANAGED_FLAGS = ("_is_fsdp_managed_module", "_fsdp_use_orig_params")


class _Gather:
    """One unit's numbered gather: opened before fully_shard's pre-forward, closed right after it."""

    __slots__ = ("name", "open")

    def __init__(self, name: str) -> None:
        self.name = name
        self.open: collective | None = None

    def begin(self, *_: Any) -> None:
        self.open = collective(self.name, site=call_site(function=True))

    def end(self, *_: Any) -> None:
        record, self.open = self.open, None
        if record is not None:
            record.__exit__(None, None, None)


def number_forward_gathers(root: nn.Module) -> None:
    """Record the forward all-gather of every FSDP unit in ``root`` as a numbered collective (see above)."""
    from torch.distributed.fsdp import FSDPModule

    handles = _HANDLES.setdefault(root, [])
    for path, unit in root.named_modules():
        if isinstance(unit, FSDPModule):
            gather = _Gather(f"all_gather(fsdp forward of {path or _user_class(unit).__name__})")
            # prepended after fully_shard's own (also prepended) pre-hook: runs before it; the second runs after it
            handles.append(unit.register_forward_pre_hook(gather.begin, prepend=True))
            handles.append(unit.register_forward_pre_hook(gather.end))


def follow_distributions(root: nn.Module) -> None:
    """Let backward through a ``torch.distributions`` object that an FSDP unit returns reach the unit (see below)."""
    from torch.distributed.fsdp import FSDPModule

    handles = _HANDLES.setdefault(root, [])
    for unit in root.modules():
        if isinstance(unit, FSDPModule):
            handles.append(unit.register_forward_hook(_distributions_hook))


def _distributions_hook(unit: nn.Module, args: Any, output: Any) -> None:
    if not isinstance(output, torch.Tensor):  # a tensor: fully_shard has hooked it already
        _backward_through_distributions(unit, output)


def _backward_through_distributions(unit: nn.Module, output: Any) -> None:
    """Hook the tensors inside the Distributions in ``output`` as fully_shard hooks the output's tensors.

    fully_shard gathers a unit's parameters for backward when the gradient reaches a tensor of its output, and
    queues the gradients' reduction from there; it finds those tensors in dicts, lists, tuples and dataclasses
    only. A Distribution (``Normal(mu, std)``) hides them: backward then fails inside the unit (its parameters were
    freed after forward) or, for the root, the gradients are never averaged across the ranks. Other objects that
    hold tensors needing gradients are refused here, naming the unit, instead of either.
    """
    if not torch.is_grad_enabled() or isinstance(output, torch.Tensor):
        return
    from torch.distributions import Distribution
    from torch.utils._pytree import tree_flatten

    found: list[torch.Tensor] = []
    for leaf in tree_flatten(output)[0]:
        if isinstance(leaf, Distribution):
            _tensors_inside(leaf, found, set())
        elif not isinstance(leaf, (torch.Tensor, nn.Module)) and _holds_grad_tensors(leaf):
            from torchfleet.errors import ConfigurationError

            raise ConfigurationError(
                f"{_user_class(unit).__name__}.forward returned an object of class {type(leaf).__name__} holding "
                "tensors that need gradients. Under fsdp each sharded module's backward starts where the gradient "
                "reaches a tensor of its output, and fully_shard finds those only in tensors, dicts, lists, tuples, "
                "dataclasses and torch.distributions objects: return one of those (e.g. a dict of the tensors), or "
                "leave this module out of auto_wrap_policy so that its parent's output carries the gradients."
            )
    if found:
        pre_backward = unit._get_fsdp_state()._pre_backward
        for tensor in found:
            tensor.register_hook(pre_backward)


def _tensors_inside(obj: Any, found: list[torch.Tensor], seen: set[int]) -> None:
    """The grad-requiring tensors a Distribution keeps (its parameters, its base distributions', its transforms')."""
    if id(obj) in seen or len(seen) > 64:
        return
    seen.add(id(obj))
    for value in vars(obj).values():
        if isinstance(value, torch.Tensor):
            if value.requires_grad and all(t is not value for t in found):
                found.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                if hasattr(item, "__dict__") and not isinstance(item, nn.Module):
                    _tensors_inside(item, found, seen)
        elif hasattr(value, "__dict__") and not isinstance(value, (nn.Module, type)):
            _tensors_inside(value, found, seen)


def _holds_grad_tensors(obj: Any) -> bool:
    attributes = getattr(obj, "__dict__", None)
    return isinstance(attributes, dict) and any(
        isinstance(v, torch.Tensor) and v.requires_grad for v in attributes.values())


def route_zero_grad(root: nn.Module) -> None:
    """Make ``zero_grad`` on ``root`` or any of its submodules clear the sharded gradients too.

    Between a unit's forward and its backward (the root's, with reshard_after_forward off, until its backward ends)
    the module holds the gathered parameters, so ``nn.Module.zero_grad`` clears their gradients only, and the
    reduce-scatter after the next backward adds to the sharded gradients of the step before, which nothing cleared
    (ddp's gradients are cleared by the same call). Each module gets a ``zero_grad`` of its own that runs its class's,
    then clears the sharded gradient (and any gradient held back for accumulation) of each of its parameters.
    """
    for sub in root.modules():
        if next(sub.parameters(), None) is None or _MARK_ZERO in vars(sub):
            continue

        def zero_grad(set_to_none: bool = True, _sub: nn.Module = sub) -> None:
            type(_sub).zero_grad(_sub, set_to_none)
            _clear_sharded_grads(root, _sub, set_to_none)

        setattr(zero_grad, _MARK, True)
        vars(sub)["zero_grad"] = zero_grad
        vars(sub)[_MARK_ZERO] = True


def route_reset_parameters(root: nn.Module) -> None:
    """Make ``reset_parameters()`` of ``root``'s modules draw whole tensors, as on one process, and keep the shard.

    Called on sharded parameters, torch's initialisers draw each rank's shard alone from the global generator (DTensor
    random ops have no CPU generator that spans the ranks): the ranks' shards repeat the same numbers, the weights
    are not those a ddp or one-process run gets, and the generator is left elsewhere, so later dropout masks and
    shuffles differ too (a k-fold loop that resets its model per fold). Each module with a ``reset_parameters`` gets
    one of its own that lends its class's method whole tensors, then keeps this rank's part of each.
    """
    for sub in root.modules():
        if not callable(getattr(type(sub), "reset_parameters", None)) or "reset_parameters" in vars(sub):
            continue

        def reset_parameters(*args: Any, _sub: nn.Module = sub, **kwargs: Any) -> Any:
            return _reset_whole(root, _sub, *args, **kwargs)

        setattr(reset_parameters, _MARK, True)
        vars(sub)["reset_parameters"] = reset_parameters


def _reset_whole(root: nn.Module, sub: nn.Module, *args: Any, **kwargs: Any) -> Any:
    from torch.distributed.fsdp import FSDPModule
    from torch.distributed.tensor import DTensor, distribute_tensor

    for unit in root.modules():
        if isinstance(unit, FSDPModule):  # a root left gathered by a forward without backward (evaluation) holds
            unit.reshard()  # copies of the gathered values: the shards, which training reads, must be reset
    lent: list[tuple[nn.Module, str, Any]] = []
    whole: dict[int, nn.Parameter] = {}  # a tied parameter is lent once
    for owner in sub.modules():
        for name, param in owner._parameters.items():
            if isinstance(param, DTensor):
                if id(param) not in whole:
                    local = param.to_local()
                    whole[id(param)] = nn.Parameter(torch.empty(param.shape, dtype=local.dtype, device=local.device),
                                                    requires_grad=param.requires_grad)
                lent.append((owner, name, param))
                owner._parameters[name] = whole[id(param)]
    try:
        return type(sub).reset_parameters(sub, *args, **kwargs)
    finally:
        with torch.no_grad():
            for owner, name, param in lent:
                drawn = owner._parameters[name]
                owner._parameters[name] = param
                if whole.pop(id(param), None) is not None:  # each rank keeps its part of its own whole draw
                    part = distribute_tensor(drawn.detach(), param.device_mesh, param.placements, src_data_rank=None)
                    param.to_local().copy_(part.to_local())


def _clear_sharded_grads(root: nn.Module, sub: nn.Module, set_to_none: bool) -> None:
    from torch.distributed.fsdp import FSDPModule

    inside = {id(m) for m in sub.modules()}
    for unit in root.modules():
        if not isinstance(unit, FSDPModule):
            continue
        for group in unit._get_fsdp_state()._fsdp_param_groups or ():
            for fsdp_param in group.fsdp_params:
                if id(fsdp_param._module_info.module) not in inside:
                    continue
                sharded = fsdp_param.sharded_param
                if set_to_none:
                    sharded.grad = None
                    fsdp_param.unsharded_accumulated_grad = None
                else:
                    for grad in (sharded.grad, fsdp_param.unsharded_accumulated_grad):
                        if grad is not None:
                            grad.zero_()


def register_forward_method(module: nn.Module, name: str) -> None:
    """torch's ``register_fsdp_forward_method`` with the gather numbered: ``name`` runs between fully_shard's
    pre-forward (gather) and post-forward (reshard), as ``forward`` does. Once per method."""
    from torch.distributed.fsdp import FSDPModule

    if not isinstance(module, FSDPModule) or name in vars(module):
        return
    method = getattr(module, name)
    gather = _Gather(f"all_gather(fsdp forward of {_user_class(module).__name__}.{name})")

    @functools.wraps(method)
    def forward_method(*args: Any, **kwargs: Any) -> Any:
        state = module._get_fsdp_state()
        gather.begin()
        args, kwargs = state._pre_forward(module, args, kwargs)
        gather.end()
        output = state._post_forward(module, args, method(*args, **kwargs))
        _backward_through_distributions(module, output)
        return output

    setattr(forward_method, _MARK, True)
    vars(module)[name] = forward_method


def unshard(module: nn.Module, optimizers: Iterable[Optimizer]) -> bool:
    """Make the fully_shard'ed ``module`` an ordinary module with whole parameters on the CPU (see above).

    Every rank calls it (each parameter is all-gathered). The ``optimizers`` over its sharded
    parameters are pointed at the whole ones. Returns False when ``module`` was not sharded.
    """
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in module.modules() if isinstance(m, FSDPModule)]
    if not units:
        return False
    for unit in units:
        unit.reshard()  # a unit left gathered after forward (the root) registers its sharded parameters again
    named = list(module.named_parameters(remove_duplicate=False))
    whole: dict[int, nn.Parameter] = {}
    with collective("all_gather(fsdp: whole parameters at the end of the stage)"), torch.no_grad():
        for _, param in named:
            if id(param) not in whole:  # a tied parameter is gathered once and stays tied
                whole[id(param)] = nn.Parameter(_gathered(param), requires_grad=param.requires_grad)
    for handle in _HANDLES.pop(module, []):
        handle.remove()
    for unit in units:
        _take_off(unit)
    for sub in module.modules():
        for flag in (*_MANAGED_FLAGS, _MARK_ZERO):
            vars(sub).pop(flag, None)
        for name in [k for k, v in vars(sub).items() if getattr(v, _MARK, False)]:
            del vars(sub)[name]
    for name, param in named:
        owner, _, leaf = name.rpartition(".")
        module.get_submodule(owner)._parameters[leaf] = whole[id(param)]
    module.cpu()  # the buffers, which fully_shard moved to the device but never sharded
    for optimizer in optimizers:
        _rebind(optimizer, whole)
    return True


def _gathered(param: Any) -> torch.Tensor:
    """The whole value of a (DTensor) parameter, as a new tensor on the CPU."""
    from torch.distributed.tensor import DTensor

    if not isinstance(param, DTensor):
        return param.detach().to("cpu", copy=True)
    mesh = param.device_mesh
    local = param.to_local()
    if local.device.type != mesh.device_type:  # cpu_offload on an accelerator: the collective runs on the device
        param = DTensor.from_local(local.to(mesh.device_type), mesh, param.placements, shape=param.shape,
                                   stride=param.stride())
    return param.full_tensor().detach().to("cpu", copy=True)


def sum_gradients_on_gloo(module: nn.Module) -> None:
    """Make every FSDP unit of ``module`` reduce its gradients with SUM and divide itself, where gloo's AVG is wrong.

    Before torch 2.9, gloo's ``reduce_scatter_tensor(op=AVG)`` sums without dividing (on 2 ranks: gradients twice
    the average, silently), and FSDP2 reduce-scatters fp32/bf16 gradients with AVG. Forcing SUM makes FSDP divide
    by the world size itself after the reduction (before and after it for fp16).
    """
    import torch.distributed as dist

    if torch.__version__ >= "2.9" or not dist.is_initialized() or dist.get_backend() != "gloo":
        return
    from torch.distributed.fsdp import FSDPModule

    for unit in module.modules():
        if isinstance(unit, FSDPModule):
            unit.set_force_sum_reduction_for_comms(True)


def _take_off(unit: nn.Module) -> None:
    """Remove fully_shard's hooks, state and class from one unit."""
    from torch.distributed import _composable_state
    from torch.distributed._composable.contract import REGISTRY_KEY, STATE_KEY

    state = unit._get_fsdp_state()
    state._pre_forward_hook_handle.remove()
    state._post_forward_hook_handle.remove()
    # torch 2.8 keeps one parameter group per unit (or None), newer versions a list
    groups = state._fsdp_param_groups if hasattr(state, "_fsdp_param_groups") else [state._fsdp_param_group]
    for group in filter(None, groups or ()):
        for handles in (group._module_to_pre_save_state_dict_hook_handle,
                        group._module_to_pre_load_state_dict_hook_handle):
            for handle in handles.values():
                handle.remove()
        for fsdp_param in group.fsdp_params:
            fsdp_param._post_load_hook_handle.remove()
    states = vars(unit).get(STATE_KEY, {})
    for key in [k for k, v in states.items() if v is state]:
        del states[key]
    vars(unit).get(REGISTRY_KEY, {}).pop("fully_shard", None)
    _composable_state._module_state_mapping.pop(unit, None)
    for name in [k for k, v in vars(unit).items() if getattr(v, _MARK, False)]:
        del vars(unit)[name]
    unit.__class__ = _user_class(unit)


def _user_class(unit: nn.Module) -> type:
    """The class of a unit before fully_shard swapped in its ``FSDP<class>`` subclass."""
    from torch.distributed.fsdp import FSDPModule

    return next(base for base in type(unit).__bases__ if base is not FSDPModule)


def _rebind(optimizer: Optimizer, whole: dict[int, nn.Parameter]) -> None:
    """Point ``optimizer`` at the whole parameters; its (sharded) state stays, keyed by them."""
    moved: Callable[[Any], Any] = lambda p: whole.get(id(p), p)  # noqa: E731
    if not any(id(p) in whole for group in optimizer.param_groups for p in group["params"]):
        return
    for group in optimizer.param_groups:
        group["params"] = [moved(p) for p in group["params"]]
    optimizer.state = collections.defaultdict(dict, {moved(p): s for p, s in optimizer.state.items()})
