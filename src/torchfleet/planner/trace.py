"""One training step of a Module on fake tensors, counting the bytes of the tensor storages alive at each moment.

The module is copied with every parameter and buffer replaced by a fake tensor (FakeTensorMode: shapes, dtypes and
devices, no memory), so a model far larger than this machine traces in seconds. Three identical steps run
(zero_grad, ``training_step``, backward, ``optimizer.step``); the third is measured, when the optimizer's states
exist and the step is steady. A dispatch mode sees every operator's outputs and keeps a weak reference to each
storage, so a storage counts from its creation until its last tensor is gone, as torch's MemTracker counts a real
run on the CPU.
"""

from __future__ import annotations

import copy
import weakref
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

from torchfleet.errors import ConfigurationError

PHASES = ("forward", "backward", "optimizer")


@dataclass
class PhasePeak:
    """The most bytes alive during one phase of the step, and how many of them were gradients at that moment."""

    total: int = 0
    grads: int = 0


@dataclass
class StepTrace:
    """What one steady-state step holds: bytes of parameters, gradients and optimizer states, and each phase's peak."""

    params: int
    grads: int
    states: int
    #: bytes of the optimizer states as the strategy holds them (fp32 where the step was traced in 16 bits for a
    #: strategy that keeps fp32 states: MemoryModel.half_dtype); ``states`` is what the trace held
    held_states: int
    #: bytes of the parameters as fp32 (a master copy's size)
    params_fp32: int
    #: elements of the trainable parameters
    trainable: int
    #: elements of all parameters
    elements: int = 0
    phases: dict[str, PhasePeak] = field(default_factory=dict)
    #: each phase's peak not counting autocast's copies of the parameters in the compute dtype (a strategy that
    #: already holds the parameters in that dtype, FSDP's mixed-precision policy, has no such copies)
    uncast_phases: dict[str, PhasePeak] = field(default_factory=dict)

    def other(self, phase: str, uncast: bool = False) -> int:
        """Bytes alive at ``phase``'s peak that are neither parameters, gradients nor optimizer states."""
        peak = (self.uncast_phases if uncast else self.phases)[phase]
        return max(peak.total - self.params - self.states - peak.grads, 0)


class LiveStorages(TorchDispatchMode):
    """Counts the bytes of the storages that operators create, from their creation until they are freed."""

    def __init__(self) -> None:
        super().__init__()
        self.live = 0
        self.grads = 0
        self.phase: str | None = None
        self.peaks: dict[str, PhasePeak] = {}
        #: bytes of live copies of parameters made by a dtype cast (autocast's), and the peaks without them
        self.casts = 0
        self.uncast_peaks: dict[str, PhasePeak] = {}
        self.param_ids: set[int] = set()
        self._seen: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def add(self, tensor: Tensor, cast: bool = False) -> None:
        storage = tensor.untyped_storage()
        if storage in self._seen:
            return
        size = storage.nbytes()
        self._seen[storage] = size
        self.live += size
        self.casts += size if cast else 0
        weakref.finalize(storage, self._free, size, cast)
        self.note_peak()

    def _free(self, size: int, cast: bool = False) -> None:
        self.live -= size
        self.casts -= size if cast else 0

    def note_peak(self) -> None:
        if self.phase is None:
            return
        peak = self.peaks.setdefault(self.phase, PhasePeak())
        if self.live > peak.total:
            peak.total, peak.grads = self.live, self.grads
        uncast = self.uncast_peaks.setdefault(self.phase, PhasePeak())
        if self.live - self.casts > uncast.total:
            uncast.total, uncast.grads = self.live - self.casts, self.grads

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        cast = (func is torch.ops.aten._to_copy.default and bool(args) and id(args[0]) in self.param_ids
                and args[0].dtype != getattr(out, "dtype", args[0].dtype))
        for item in tree_flatten(out)[0]:
            if isinstance(item, Tensor):
                self.add(item, cast)
        return out


def optimizers_of(value: Any) -> list[Optimizer]:
    """The optimizers in what ``configure_optimizers`` returned (schedulers play no part in memory)."""
    if value is None:
        return []
    if isinstance(value, Optimizer):
        return [value]
    if isinstance(value, Mapping):
        return optimizers_of(value.get("optimizer"))
    if isinstance(value, Sequence) and not isinstance(value, str):
        return [opt for item in value for opt in optimizers_of(item if not isinstance(item, Sequence) else list(item))
                if isinstance(opt, Optimizer)]
    return []


def fake_copy(module: nn.Module, mode: Any) -> nn.Module:
    """A copy of ``module`` whose parameters and buffers are fake CPU tensors of the same shapes and dtypes."""
    memo: dict[int, Any] = {}
    for sub in module.modules():  # the Trainer or Fleet a Module is attached to is shared, not copied
        for owner in (sub.__dict__.get("_trainer"), sub.__dict__.get("_fleet")):
            if owner is not None:
                memo[id(owner)] = owner
    with mode:
        for tensor in [*module.parameters(), *module.buffers()]:
            if id(tensor) not in memo:
                fake = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu")
                memo[id(tensor)] = (nn.Parameter(fake, requires_grad=tensor.requires_grad)
                                    if isinstance(tensor, nn.Parameter) else fake)
    return copy.deepcopy(module, memo)


def _cast_floating(model: nn.Module, dtype: torch.dtype) -> None:
    """Replace ``model``'s floating-point parameters and buffers (fake) by fake ones in ``dtype``."""
    for sub in model.modules():
        for store in (sub._parameters, sub._buffers):
            for key, tensor in store.items():
                if tensor is not None and tensor.is_floating_point() and tensor.dtype != dtype:
                    fresh = torch.empty(tensor.shape, dtype=dtype, device=tensor.device)
                    store[key] = nn.Parameter(fresh, tensor.requires_grad) if isinstance(tensor, nn.Parameter) else fresh


def _loss(output: Any) -> Tensor:
    loss = output.get("loss") if isinstance(output, Mapping) else output
    if not isinstance(loss, Tensor):
        raise ConfigurationError(
            "estimate_memory runs training_step and needs it to return the loss (a tensor, or a dict with 'loss'); "
            f"it returned {type(output).__name__}.")
    return loss


def trace_step(module: nn.Module, batch: Any, precision: Any, plan: Callable[[nn.Module], Any],
               configure: bool = True) -> tuple[StepTrace, Any]:
    """Trace three training steps of ``module`` (a torchfleet Module) on ``batch`` under ``precision`` (a Precision).

    ``plan`` is called with the fake model once it is built (``configure_model`` run, precision applied) and returns
    the strategy's MemoryModel, whose ``prepare`` (activation checkpointing, a tensor-parallel rank's shards) is
    applied before the steps; ``configure=False``: ``configure_model`` is the strategy's to plan (it parallelises).
    Returns the trace and that MemoryModel.
    """
    from torch._subclasses.fake_tensor import FakeTensorMode

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    model = fake_copy(module, mode)
    tracker = LiveStorages()
    with mode:
        hook = getattr(model, "configure_model", None)
        if configure and callable(hook):
            hook()
        name = getattr(precision, "name", "32-true")
        if name.endswith("-true") and name != "32-true":  # module.to(dtype) would swap fake tensors: made anew
            _cast_floating(model, precision.param_dtype)
        memory_model = plan(model)
        half = getattr(memory_model, "half_dtype", None)
        if half is not None:  # the strategy trains the module wholly in 16 bits, its inputs too
            _cast_floating(model, half)
        if memory_model.prepare is not None:
            memory_model.prepare(model)
        model.train()
        fake_batch = tree_map(lambda t: torch.empty(t.shape, dtype=half if half is not None and t.is_floating_point()
                                                    else t.dtype, device="cpu")
                              if isinstance(t, Tensor) else t, batch)
        fake_batch = precision.convert_input(fake_batch)
        optimizers = optimizers_of(model.configure_optimizers())
        if model.__dict__.get("_trainer") is not None:  # read by configure_optimizers; self.log records nothing here
            model.trainer = None
        params = [p for p in model.parameters()]
        tracker.param_ids = {id(p) for p in params}
        for tensor in [*params, *model.buffers(), *tree_flatten(fake_batch)[0]]:
            if isinstance(tensor, Tensor):
                tracker.add(tensor)

        def grad_ready(param: Tensor) -> None:
            tracker.grads += param.grad.untyped_storage().nbytes()
            tracker.note_peak()

        handles = [p.register_post_accumulate_grad_hook(grad_ready) for p in params if p.requires_grad]
        with tracker:
            for step in range(3):
                tracker.phase = "forward" if step == 2 else None
                for opt in optimizers:
                    opt.zero_grad(set_to_none=True)
                tracker.grads = 0
                with precision.forward_context():
                    loss = _loss(model.training_step(fake_batch, step))
                if step == 2:
                    tracker.phase = "backward"
                precision.backward(loss, model)
                del loss
                if step == 2:
                    tracker.phase = "optimizer"
                for opt in optimizers:
                    opt.step()
        for handle in handles:
            handle.remove()
    state_tensors = {id(t.untyped_storage()): t for opt in optimizers for state in opt.state.values()
                     for t in state.values() if isinstance(t, Tensor)}
    states = sum(t.untyped_storage().nbytes() for t in state_tensors.values())
    # the states as the strategy holds them: fp32 beside 16-bit parameters trained wholly in 16 bits
    held_states = sum(t.numel() * 4 if half is not None and t.is_floating_point() else t.untyped_storage().nbytes()
                      for t in state_tensors.values())
    grads = sum(p.grad.untyped_storage().nbytes() for p in params if p.grad is not None)
    trainable = [p for p in params if p.requires_grad]
    return StepTrace(params=sum(p.untyped_storage().nbytes() for p in params), grads=grads, states=states, held_states=held_states,
                     params_fp32=sum(p.numel() * 4 for p in trainable), trainable=sum(p.numel() for p in trainable),
                     elements=sum(p.numel() for p in params),
                     phases={phase: tracker.peaks.get(phase, PhasePeak()) for phase in PHASES},
                     uncast_phases={phase: tracker.uncast_peaks.get(phase, PhasePeak()) for phase in PHASES}), memory_model
