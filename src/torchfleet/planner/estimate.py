"""estimate_memory: the bytes one rank holds during a steady-state training step, before anything is launched.

One step is traced on fake tensors as on a single device (planner/trace.py); the strategy's MemoryModel then says
how the parameters, gradients and optimizer states are divided over the ranks and what it adds (gradient buckets,
gathered FSDP units, DeepSpeed's buffers). Each phase of the step (forward, backward, optimizer) is summed per rank;
the peak is the largest sum.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from torchfleet.errors import ConfigurationError
from torchfleet.planner.trace import PHASES, StepTrace, trace_step

PARTS = ("parameters", "gradients", "optimizer_states", "activations", "gathered", "buffers")


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per rank (the most loaded rank) of one steady-state training step.

    ``peak``: the most bytes of live tensors at any moment of the step (what ``torch.cuda.max_memory_allocated``
    reports on a GPU). ``parameters``, ``gradients``, ``optimizer_states`` (with a master copy of the parameters where
    the strategy keeps one): this rank's share of the model states on the device. ``activations``: what the forward
    and backward hold beyond the model states (activations, their gradients and temporaries) at their peak.
    ``gathered``: whole parameters (and their gradients) of FSDP units gathered at the peak. ``buffers``: the
    strategy's communication buffers. ``offloaded``: model-state bytes kept in host memory instead. ``phase``: where
    the peak lies ("forward", "backward" or "optimizer").
    """

    peak: int
    parameters: int
    gradients: int
    optimizer_states: int
    activations: int
    gathered: int = 0
    buffers: int = 0
    offloaded: int = 0
    phase: str = "backward"
    strategy: str = "single_device"
    world_size: int = 1
    precision: str = "32-true"
    #: per phase, the bytes of each part (the rows of the table)
    phases: dict[str, dict[str, int]] = field(default_factory=dict, repr=False)
    note: str = ""

    def __str__(self) -> str:
        lines = [f"memory per rank: strategy={self.strategy}, {self.world_size} rank(s), precision={self.precision}",
                 f"{'':<18}" + "".join(f"{phase:>12}" for phase in PHASES)]
        for part in (*PARTS, "total"):
            cells = [self.phases.get(phase, {}).get(part, 0) for phase in PHASES]
            lines.append(f"{part:<18}" + "".join(f"{_size(c):>12}" for c in cells))
        lines.append(f"peak: {_size(self.peak)} (in {self.phase})"
                     + (f"; offloaded to host: {_size(self.offloaded)}" if self.offloaded else ""))
        if self.note:
            lines.append(f"note: {self.note}")
        return "\n".join(lines)


def _size(value: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(value) < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return str(value)


def _share(total: int, shards: float) -> int:
    return math.ceil(total / max(shards, 1))


def _unit_bytes(units: tuple[nn.Module, ...], dtype: torch.dtype | None) -> list[int]:
    """Bytes of each unit's own parameters (those of nested units excluded), as gathered (in ``dtype`` if given)."""
    owned: set[int] = set()
    sizes = []
    for unit in units:  # children before parents, the root last
        mine = [p for p in unit.parameters() if id(p) not in owned]
        owned.update(id(p) for p in mine)
        sizes.append(sum(p.numel() * (dtype.itemsize if dtype is not None else p.element_size()) for p in mine))
    return sizes


def held_ratio(trace: StepTrace, model: Any) -> float:
    """The strategy's bytes per parameter element over the traced ones (DeepSpeed's half parameters: 2 / 4)."""
    return model.param_itemsize * trace.elements / trace.params if model.param_itemsize and trace.params else 1.0


def per_phase(trace: StepTrace, model: Any, units: list[int], resident: int,
              uncast: bool = False) -> dict[str, dict[str, int]]:
    """Each phase's bytes per rank, by part. ``units``: gathered bytes per FSDP unit (the root last); ``resident``:
    bytes alive through the whole step that are not model states (buffers, the batch); ``uncast``: the units are
    gathered in the compute dtype, so autocast's copies of the parameters in that dtype do not exist."""
    held = held_ratio(trace, model)
    params = 0 if ("params" in model.offload) else _share(int(trace.params * held), model.param_shards)
    master = _share(trace.params_fp32, model.state_shards) if model.master_copy else 0
    states = 0 if ("states" in model.offload) else _share(trace.held_states, model.state_shards) + master
    grad_size = trace.grads * held / max(trace.trainable, 1)
    buffers = int(model.buffer_elements * grad_size) + (trace.grads if model.gradient_bucket_copy else 0)
    root, largest = (units[-1], max(units[:-1], default=0)) if units else (0, 0)
    if units and not model.reshard_after_forward:
        root, largest = sum(units), 0
    grads_per_param = trace.grads / max(trace.params, 1)
    whole_params = int(model.gathered_elements * trace.params * held / max(trace.elements, 1))
    out = {}
    for phase in PHASES:
        all_grads = phase == "optimizer" or (phase == "backward" and model.gradients_held_in_backward)
        grads = int((trace.grads if all_grads else trace.phases[phase].grads) * held)
        other = trace.other(phase, uncast)
        if phase == "optimizer":  # the optimizer's temporaries are the size of a (sharded) parameter
            on_host = "states" in model.offload
            other = 0 if on_host else resident + _share(max(other - resident, 0), model.state_shards)
            gathered = 0
        elif phase == "forward":  # the unit running and the next one gathered, the root whole
            gathered = root + 2 * largest
        else:  # and the running unit's whole gradients, reduce-scattered from a copy
            gathered = root + 2 * largest + int(2 * largest * grads_per_param)
        gathered += whole_params if phase != "optimizer" else 0
        shard = 0 if ("grads" in model.offload) else _share(grads, model.grad_shards)
        if phase == "backward" and model.gradients_held_in_backward:  # and the whole ones not yet reduced
            shard += int(trace.phases[phase].grads * held)
        row = {"parameters": params, "gradients": shard,
               "optimizer_states": states, "activations": other, "gathered": gathered, "buffers": buffers}
        row["total"] = sum(row.values())
        out[phase] = row
    return out


def first_batch(module: nn.Module, loaders: Any = None, datamodule: Any = None) -> Any:
    """The first batch of the training loader: ``loaders``, else the datamodule's, else the module's own."""
    if loaders is None and datamodule is not None:
        datamodule.setup("fit")
        loaders = datamodule.train_dataloader()
    if loaders is None:
        loaders = module.train_dataloader()
    if loaders is None:
        raise ConfigurationError(
            f"{type(module).__name__}.train_dataloader() returned None: the estimate runs one training step on the "
            "first batch of the training data. Return a DataLoader (or give a DataModule whose train_dataloader does).")
    try:
        return next(iter(loaders))
    except StopIteration:
        raise ConfigurationError(
            f"The training data is empty: {_named(loaders)} yields no batch, and the estimate runs one training step "
            "on the first batch. Give training data with at least one batch (a DataLoader's dataset holds at least "
            "batch_size samples where drop_last=True).") from None


def _named(loaders: Any) -> str:
    """How a training loader is named in a message: its class, and its dataset's length where it has one."""
    dataset = getattr(loaders, "dataset", None)
    try:
        size = f" over a dataset of {len(dataset)} samples" if dataset is not None else ""
    except TypeError:  # an iterable dataset has no length
        size = ""
    return f"the {type(loaders).__name__}{size}"


def _resolve(strategy: Any, devices: int, num_nodes: int, precision: Any) -> tuple[Any, Any]:
    from torchfleet.precision import precision_for
    from torchfleet.strategies.registry import StrategyRegistry
    from torchfleet.strategies.strategy import Strategy

    if strategy == "auto":
        strategy = "single_device" if devices * num_nodes == 1 else "ddp"
    if isinstance(strategy, str):
        name = strategy if strategy in StrategyRegistry else strategy.lower()
        if name not in StrategyRegistry:
            raise ConfigurationError(f"strategy={strategy!r} is not a registered strategy: see `torchfleet strategies`.")
        strategy = StrategyRegistry.get(name)
    elif not isinstance(strategy, Strategy):
        raise ConfigurationError(f"strategy={strategy!r} is not understood: pass a registered name or a Strategy.")
    if strategy.has_part("precision"):
        plugin = strategy.precision
    else:
        plugin = precision_for(precision, "cpu")
        strategy.precision = plugin
    return strategy, plugin


def estimate_memory(module: nn.Module, batch: Any, *, strategy: Any = "single_device", devices: int = 1,
                    num_nodes: int = 1, precision: Any = "32-true") -> MemoryEstimate:
    """Predict the memory per rank of training ``module`` (a torchfleet Module) on ``batch`` (one rank's batch).

    Nothing real is allocated and no process starts: ``training_step``, backward and the optimizers of
    ``configure_optimizers`` run on fake tensors (``configure_model`` is honoured; a module built on the meta device
    works), and ``strategy`` (a name or a Strategy object, as the Trainer takes) says how the result is divided over
    ``devices`` x ``num_nodes`` ranks. See docs/memory.md for what is counted and the measured accuracy.
    """
    if not (isinstance(devices, int) and devices > 0 and isinstance(num_nodes, int) and num_nodes > 0):
        raise ConfigurationError(f"devices={devices!r} and num_nodes={num_nodes!r} must be positive ints.")
    world = devices * num_nodes
    built, plugin = _resolve(strategy, devices, num_nodes, precision)
    trace, model = trace_step(module, batch, plugin, lambda fake: built.memory_model(fake, world, num_nodes),
                              configure=not built.configure_model_parallelizes)
    compute = getattr(plugin, "compute_dtype", None) if model.gathered_dtype_from_compute else None
    units = _unit_bytes(model.units, compute)
    resident = sum(b.untyped_storage().nbytes() for b in module.buffers())
    resident += sum(t.untyped_storage().nbytes() for t in torch.utils._pytree.tree_flatten(batch)[0]
                    if isinstance(t, torch.Tensor))
    phases = per_phase(trace, model, units, resident, uncast=compute is not None)
    top = max(PHASES, key=lambda phase: phases[phase]["total"])
    master = _share(trace.params_fp32, model.state_shards) if model.master_copy else 0
    held = held_ratio(trace, model)
    offloaded = (_share(int(trace.params * held), model.param_shards) * ("params" in model.offload)  # this rank's
                 + _share(int(trace.grads * held), model.grad_shards) * ("grads" in model.offload)
                 + (_share(trace.held_states, model.state_shards) + master) * ("states" in model.offload))
    row = phases[top]
    return MemoryEstimate(
        peak=row["total"], parameters=row["parameters"], gradients=phases["optimizer"]["gradients"],
        optimizer_states=row["optimizer_states"],
        activations=max(phases["forward"]["activations"], phases["backward"]["activations"]),
        gathered=row["gathered"], buffers=row["buffers"], offloaded=offloaded, phase=top,
        strategy=type(built).__name__ if not isinstance(strategy, str) else strategy, world_size=world,
        precision=getattr(plugin, "name", str(precision)), phases=phases, note=model.note)
