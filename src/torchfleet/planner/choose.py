"""Choosing a strategy by memory: the candidates side by side (``torchfleet estimate``) and strategy="auto"'s choice.

Each candidate is estimated with ``estimate_memory`` (planner/estimate.py) on the same module and batch; whether it
fits is its peak per rank against one device's memory (``device_memory``: CUDA's total, else unknown, or a size the
user gives). The candidates are listed cheapest first (least communication and recomputation for the same step):
plain data parallel, the ZeRO stages that keep the parameters whole, full sharding, sharding with activation
checkpointing, then CPU offload.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from torch import nn

from torchfleet.errors import ConfigurationError
from torchfleet.planner.estimate import MemoryEstimate, _size, estimate_memory

#: what ``strategy="auto"`` tries, in order, when plain data parallel does not fit
AUTO_ORDER = ("ddp", "fsdp", "fsdp + activation checkpointing", "fsdp_cpu_offload")
#: the rows of ``torchfleet estimate``, cheapest first
TABLE_ORDER = ("ddp", "deepspeed_stage_1", "deepspeed_stage_2", "fsdp", "deepspeed_stage_3",
               "fsdp + activation checkpointing", "fsdp_cpu_offload", "deepspeed_stage_2_offload",
               "deepspeed_stage_3_offload")
_PART_NAMES = {"parameters": "parameters", "gradients": "gradients", "optimizer_states": "optimizer states",
               "activations": "activations", "gathered": "gathered parameters", "buffers": "buffers"}
_UNITS = {"": 1, "b": 1, "k": 2**10, "kib": 2**10, "kb": 10**3, "m": 2**20, "mib": 2**20, "mb": 10**6,
          "g": 2**30, "gib": 2**30, "gb": 10**9, "t": 2**40, "tib": 2**40, "tb": 10**12}


#: the range --device-memory accepts: far below and far above any accelerator's memory
SMALLEST_DEVICE, LARGEST_DEVICE = 2**20, 16 * 2**40


def device_memory(accelerator: str, index: int = 0) -> int | None:
    """The total memory of one device of ``accelerator`` ("cuda": the GPU's; None where it is not known: the CPU,
    MPS, a machine without the device). The one place a device's capacity is read."""
    import torch

    if accelerator in ("cuda", "gpu") and torch.cuda.is_available():
        return int(torch.cuda.get_device_properties(index).total_memory)
    return None


def parse_size(text: str) -> int:
    """``"80GiB"``, ``"80G"`` (binary), ``"80GB"`` (decimal), ``"81920MiB"``, ``"1e9"`` -> bytes; one device's memory,
    so between ``SMALLEST_DEVICE`` and ``LARGEST_DEVICE`` (a size outside is a typo: a missing unit, a wrong one)."""
    found = re.fullmatch(r"\s*([+-]?[0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*", str(text).lower())
    forms = "e.g. 80GiB, 80G (binary), 80GB (10^9 bytes) or 24576MiB"
    if found is None or found.group(2) not in _UNITS:
        raise ConfigurationError(f"--device-memory {text!r} is not a size: give a number and a unit, {forms}.")
    size = float(found.group(1)) * _UNITS[found.group(2)]
    if not SMALLEST_DEVICE <= size <= LARGEST_DEVICE:
        said = "is not more than 0 bytes" if size <= 0 else f"is {_bytes(size)}"
        hint = f" Did you mean {found.group(1)}GiB?" if 0 < size < SMALLEST_DEVICE and found.group(1).isdigit() else ""
        raise ConfigurationError(
            f"--device-memory {text!r} {said}: one device's memory is taken to be between "
            f"{_bytes(SMALLEST_DEVICE)} and {_bytes(LARGEST_DEVICE)}; give a size in that range, {forms}.{hint}")
    return int(size)


def _bytes(size: float) -> str:
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if size >= scale:
            return f"{size / scale:.3g} {unit}"
    return f"{size:.3g} bytes"


def block_classes(module: nn.Module) -> set[type[nn.Module]]:
    """The classes of ``module``'s repeated blocks: children of an ``nn.ModuleList`` or ``nn.Sequential`` that hold
    parameters and whose class occurs there at least twice (what an FSDP unit and a checkpointed region should be)."""
    found: set[type[nn.Module]] = set()
    for container in module.modules():
        if isinstance(container, (nn.ModuleList, nn.Sequential)):
            kinds = [type(c) for c in container.children() if any(True for _ in c.parameters())]
            found |= {k for k in kinds if kinds.count(k) >= 2}
    return found


@dataclass(frozen=True)
class Candidate:
    """One strategy to compare: its label and how to build a fresh instance of it."""

    label: str
    build: Callable[[], Any]


def candidates(module: nn.Module, labels: tuple[str, ...], world_size: int,
               start_method: str | None = None) -> list[Candidate]:
    """The candidates of ``labels`` that can be built here (DeepSpeed's only where the package is installed; it is
    not imported). FSDP's units and checkpointed regions are the module's repeated blocks (``block_classes``)."""
    from torchfleet.strategies.fsdp import FSDPStrategy
    from torchfleet.strategies.registry import StrategyRegistry
    from torchfleet.utilities.imports import package_available

    blocks = block_classes(module) or None
    launch = {} if start_method is None else {"start_method": start_method}
    fsdp = {"fsdp": {}, "fsdp + activation checkpointing": {"activation_checkpointing_policy": blocks},
            "fsdp_cpu_offload": {"cpu_offload": True}}
    out = []
    for label in labels:
        if label == "ddp" and world_size == 1:
            out.append(Candidate("single_device", lambda: StrategyRegistry.get("single_device")))
        elif label in fsdp:
            if label == "fsdp + activation checkpointing" and blocks is None:
                continue  # no repeated block to recompute: the same as fsdp
            kwargs = {"auto_wrap_policy": blocks, **fsdp[label], **launch}
            out.append(Candidate(label, lambda kwargs=kwargs: FSDPStrategy(**kwargs)))
        elif label in StrategyRegistry:
            needs = StrategyRegistry.entry(label).cls.requires_package
            if needs is None or package_available(needs):
                extra = launch if label == "ddp" else {}
                out.append(Candidate(label, lambda label=label, extra=extra: StrategyRegistry.get(label, **extra)))
    return out


@dataclass(frozen=True)
class Row:
    """One candidate's estimate: its peak per rank, the part that dominates it, whether it fits (None: unknown)."""

    candidate: Candidate
    estimate: MemoryEstimate
    fits: bool | None

    @property
    def dominant(self) -> tuple[str, float]:
        """The largest part at the peak and its share of the peak."""
        row = self.estimate.phases[self.estimate.phase]
        part = max(_PART_NAMES, key=lambda p: row.get(p, 0))
        return _PART_NAMES[part], row.get(part, 0) / max(self.estimate.peak, 1)


@contextlib.contextmanager
def attached(module: nn.Module, trainer: Any) -> Iterator[None]:
    """``module.trainer`` is ``trainer`` inside the block (a ``configure_optimizers`` that reads
    ``self.trainer.estimated_stepping_batches`` runs before fit), as it was after; nothing without a trainer."""
    before = module.__dict__.get("_trainer")
    if trainer is None or before is not None or not hasattr(type(module), "trainer"):
        yield
        return
    module.trainer = trainer
    try:
        yield
    finally:
        module.trainer = before


def estimate_row(candidate: Candidate, module: nn.Module, batch: Any, devices: int, num_nodes: int, precision: str,
                 capacity: int | None, trainer: Any = None) -> Row:
    with attached(module, trainer):
        estimate = estimate_memory(module, batch, strategy=candidate.build(), devices=devices, num_nodes=num_nodes,
                                   precision=precision)
    return Row(candidate, estimate, None if capacity is None else estimate.peak <= capacity)


@dataclass(frozen=True)
class Comparison:
    """The rows of ``torchfleet estimate``; ``str()`` is its table."""

    rows: list[Row]
    capacity: int | None
    devices: int
    num_nodes: int
    precision: str

    @property
    def cheapest(self) -> Row | None:
        """The first row (cheapest) that fits, or None (none fits, or the device memory is unknown)."""
        return next((r for r in self.rows if r.fits), None)

    def __str__(self) -> str:
        world = self.devices * self.num_nodes
        head = (f"peak memory per rank: {self.devices} device(s) x {self.num_nodes} node(s) = {world} rank(s), "
                f"precision={self.precision}, device memory "
                + (_size(self.capacity) if self.capacity is not None else "unknown"))
        table = [("strategy", "peak/rank", "dominated by", "fits")]
        for row in self.rows:
            part, share = row.dominant
            fits = "-" if row.fits is None else "yes" if row.fits else "no"
            table.append((row.candidate.label, _size(row.estimate.peak), f"{part} ({share:.0%})", fits))
        widths = [max(len(line[i]) for line in table) for i in range(4)]
        lines = [head, ""] + ["  ".join(c.ljust(w) for c, w in zip(line, widths)).rstrip() for line in table]
        best = self.cheapest
        if best is not None:
            lines[3 + self.rows.index(best)] += "  <- cheapest that fits"  # after the heading, a blank, the header
        if self.capacity is None:
            lines.append("The device memory is unknown (no GPU visible): the table is shown without a fit verdict; "
                         "give --device-memory 80GiB.")
        elif best is None:
            lines.append(f"No candidate fits in {_size(self.capacity)} per device: more devices, a smaller batch or "
                         "a lower precision.")
        return "\n".join(lines)


def compare(module: nn.Module, batch: Any, *, devices: int, num_nodes: int, precision: str, capacity: int | None,
            labels: tuple[str, ...] = TABLE_ORDER, trainer: Any = None) -> Comparison:
    """Estimate each candidate of ``labels`` (those buildable here) on ``module`` and ``batch`` (``trainer``: the
    Trainer the module is attached to meanwhile, for a ``configure_optimizers`` that reads it)."""
    rows = [estimate_row(c, module, batch, devices, num_nodes, precision, capacity, trainer)
            for c in candidates(module, labels, devices * num_nodes)]
    return Comparison(rows, capacity, devices, num_nodes, precision)


@dataclass(frozen=True)
class AutoChoice:
    """What ``strategy="auto"`` does with a model: ``build`` the strategy to use instead of today's (None: keep it),
    and the line that says why, with the numbers."""

    build: Callable[[], Any] | None
    label: str
    line: str
    #: whether the chosen strategy fits (None: the memory is unknown)
    fits: bool | None = True


def choose_auto(module: nn.Module, batch: Any, *, devices: int, num_nodes: int, precision: str,
                capacity: int | None, today: str = "ddp", start_method: str | None = None,
                trainer: Any = None) -> AutoChoice:
    """The first of ddp -> fsdp -> fsdp + activation checkpointing -> fsdp_cpu_offload whose peak per rank fits in
    ``capacity`` (one device's bytes). ``today``: what auto chooses without a model; kept when the memory is
    unknown, when ddp fits, and when nothing fits (the line then says so)."""
    prefix = f"strategy='auto' on {devices} device(s) x {num_nodes} node(s)"
    if capacity is None:
        return AutoChoice(None, today, f"{prefix}: {today!r} (the device memory is unknown, nothing is estimated).",
                          fits=None)
    tried: list[str] = []
    for candidate in candidates(module, AUTO_ORDER, devices * num_nodes, start_method):
        row = estimate_row(candidate, module, batch, devices, num_nodes, precision, capacity, trainer)
        if row.fits:
            if not tried:
                return AutoChoice(None, today, f"{prefix}: {today!r}: its estimated peak "
                                  f"{_size(row.estimate.peak)} per rank fits in {_size(capacity)}.")
            return AutoChoice(candidate.build, candidate.label,
                              f"{prefix} chose {candidate.label!r}: it needs {_size(row.estimate.peak)} per rank, "
                              f"where {', '.join(tried)} would not fit in {_size(capacity)} per device (estimated; "
                              "`torchfleet estimate` compares them). Pass strategy=... to choose another.")
        tried.append(f"{candidate.label} ({_size(row.estimate.peak)})")
    return AutoChoice(None, today, f"{prefix}: {today!r}, although no candidate fits in {_size(capacity)} per device "
                      f"({', '.join(tried)}): expect an out-of-memory error (see `torchfleet estimate`).", fits=False)
