"""ModelSummary and ``summarize``: a model's layers, their parameter counts and (with ``example_input_array``) the
sizes that flow through them, as Lightning's ``utilities.model_summary`` gives them."""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from torchfleet.errors import ConfigurationError

#: Lightning's abbreviations of parameter counts: thousands, millions, billions, trillions
#: the suffixes of parameter counts (thousands, millions, billions, trillions)
PARAMETER_NUM_UNITS = [" ", "K", "M", "B", "T"]
_UNITS = PARAMETER_NUM_UNITS
UNKNOWN_SIZE = "?"
#: the row of the parameters no listed layer owns, and the value of the other columns there
LEFTOVER_PARAMS_NAME = "other params"
NOT_APPLICABLE = "n/a"
#: bits per parameter of the Trainer's precision, for the size estimate (anything else counts as 32)
_BITS = {"64": 64, "64-true": 64, "32": 32, "32-true": 32, "16": 16, "bf16": 16, "16-true": 16, "bf16-true": 16}


def get_human_readable_count(number: int | float) -> str:
    """``number`` abbreviated with K, M, B or T: 123 -> "123  ", 1234 -> "1.2 K", 4e14 -> "400 T"."""
    if number < 0:
        raise ConfigurationError(f"get_human_readable_count({number!r}): give a count >= 0.")
    digits = int(math.floor(math.log10(number)) + 1) if number > 0 else 1
    group = min(int(math.ceil(digits / 3)), len(_UNITS)) - 1
    scaled = number / 10 ** (3 * group)
    if group < 1 or scaled >= 100:
        return f"{int(scaled):,d} {_UNITS[group]}"
    return f"{scaled:,.1f} {_UNITS[group]}"


def parse_batch_shape(batch: Any) -> Any:
    """The shape of every tensor in ``batch`` (nested lists for nested lists and tuples); ``UNKNOWN_SIZE`` elsewhere."""
    if hasattr(batch, "shape"):
        return list(batch.shape)
    if isinstance(batch, (list, tuple)):
        return [parse_batch_shape(item) for item in batch]
    return UNKNOWN_SIZE


def _count(params: Any) -> int:
    # a lazy module's parameters have no size until its first forward
    return sum(p.numel() for p in params if not isinstance(p, nn.parameter.UninitializedParameter))


class ModelSummary:
    """The submodules of ``model`` down to ``max_depth`` levels (-1: every level, 0: none) and its totals.

    ``str(summary)`` is the table. When the model has an ``example_input_array``, it runs once (in eval mode,
    without gradients) to record each layer's input and output sizes and the FLOPs, when those are first asked for
    (so reading the layers and counts never runs the model).
    """

    def __init__(self, model: nn.Module, max_depth: int = 1) -> None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < -1:
            raise ConfigurationError(
                f"ModelSummary(max_depth={max_depth!r}) is not valid: give -1 (every level), 0 (no layers) or a "
                "depth >= 1."
            )
        self._model, self._max_depth = model, max_depth
        self._in: dict[str, Any] = {}
        self._out: dict[str, Any] = {}
        self._flops: dict[str, int] = {}
        self._total_flops = 0
        self._example_pending = getattr(model, "example_input_array", None) is not None

    @property
    def named_modules(self) -> list[tuple[str, nn.Module]]:
        if self._max_depth == 0:
            return []
        return [(name, m) for name, m in self._model.named_modules()
                if name and (self._max_depth < 0 or name.count(".") < self._max_depth)]

    @property
    def layer_names(self) -> list[str]:
        return [name for name, _ in self.named_modules]

    @property
    def layer_types(self) -> list[str]:
        return [type(m).__name__ for _, m in self.named_modules]

    @property
    def param_nums(self) -> list[int]:
        return [_count(m.parameters()) for _, m in self.named_modules]

    @property
    def training_modes(self) -> list[bool]:
        return [m.training for _, m in self.named_modules]

    @property
    def total_training_modes(self) -> dict[str, int]:
        modes = [m.training for m in list(self._model.modules())[1:]]
        return {"train": modes.count(True), "eval": modes.count(False)}

    @property
    def in_sizes(self) -> list[Any]:
        self._run_example()
        return [self._in.get(name, UNKNOWN_SIZE) for name in self.layer_names]

    @property
    def out_sizes(self) -> list[Any]:
        self._run_example()
        return [self._out.get(name, UNKNOWN_SIZE) for name in self.layer_names]

    @property
    def total_parameters(self) -> int:
        return _count(self._model.parameters())

    @property
    def trainable_parameters(self) -> int:
        return _count(p for p in self._model.parameters() if p.requires_grad)

    @property
    def total_layer_params(self) -> int:
        return sum(self.param_nums)

    @property
    def model_size(self) -> float:
        """Megabytes of parameters at the Trainer's precision (32 bits each without a Trainer)."""
        trainer = getattr(self._model, "_trainer", None)
        bits = _BITS.get(str(trainer.precision), 32) if trainer is not None else 32
        return self.total_parameters * bits / 8 * 1e-6

    @property
    def total_flops(self) -> int:
        self._run_example()
        return self._total_flops

    @property
    def flop_counts(self) -> dict[str, int]:
        self._run_example()
        return {name: self._flops.get(name, 0) for name in self.layer_names}

    def _run_example(self) -> None:
        if not self._example_pending:
            return
        self._example_pending = False
        from torch.utils.flop_counter import FlopCounterMode

        model, modules = self._model, self.named_modules

        def recorder(name: str) -> Any:
            def hook(_: nn.Module, args: Any, out: Any) -> None:
                self._in[name] = parse_batch_shape(args[0] if len(args) == 1 else list(args))
                self._out[name] = parse_batch_shape(out)
            return hook

        handles = [m.register_forward_hook(recorder(name)) for name, m in modules]
        modes = {m: m.training for m in model.modules()}
        example = model.example_input_array
        counter = FlopCounterMode(display=False, depth=None)
        try:
            model.eval()
            with torch.no_grad(), counter:
                if isinstance(example, (list, tuple)):
                    model(*example)
                elif isinstance(example, dict):
                    model(**example)
                else:
                    model(example)
        finally:
            for handle in handles:
                handle.remove()
            for m, training in modes.items():
                m.training = training
        root = type(model).__name__
        per_module = counter.get_flop_counts()
        self._flops = {name: sum(per_module.get(f"{root}.{name}", {}).values()) for name, _ in modules}
        self._total_flops = counter.get_total_flops()

    def _columns(self) -> list[tuple[str, list[str]]]:
        names, modes = self.layer_names, self.training_modes
        columns = [(" ", [str(i) for i in range(len(names))]), ("Name", names), ("Type", self.layer_types),
                   ("Params", [get_human_readable_count(n) for n in self.param_nums]),
                   ("Mode", ["train" if m else "eval" for m in modes]),
                   ("FLOPs", [get_human_readable_count(n) for n in self.flop_counts.values()])]
        if getattr(self._model, "example_input_array", None) is not None:
            columns += [("In sizes", [str(s) for s in self.in_sizes]), ("Out sizes", [str(s) for s in self.out_sizes])]
        leftover = self.total_parameters - self.total_layer_params
        if leftover > 0:  # parameters that belong to no listed layer (the root's own)
            for header, values in columns:
                values.append({" ": " ", "Name": LEFTOVER_PARAMS_NAME, "Params": get_human_readable_count(leftover)}
                              .get(header, NOT_APPLICABLE))
        return columns

    def __str__(self) -> str:
        columns = self._columns()
        widths = [max([len(header)] + [len(v) for v in values]) for header, values in columns]
        rule = "-" * (sum(widths) + 3 * (len(columns) + 1))
        lines = [" | ".join(f"{h:<{w}}" for (h, _), w in zip(columns, widths)), rule]
        lines += [" | ".join(f"{values[i]:<{w}}" for (_, values), w in zip(columns, widths))
                  for i in range(len(columns[0][1]))]
        modes, total, trainable = self.total_training_modes, self.total_parameters, self.trainable_parameters
        lines += [rule] + [f"{value:<10}{label}" for value, label in (
            (get_human_readable_count(trainable), "Trainable params"),
            (get_human_readable_count(total - trainable), "Non-trainable params"),
            (get_human_readable_count(total), "Total params"),
            (get_formatted_model_size(self.model_size), "Total estimated model params size (MB)"),
            (modes["train"], "Modules in train mode"), (modes["eval"], "Modules in eval mode"),
            (get_human_readable_count(self.total_flops), "Total Flops"))]
        return "\n".join(lines)

    def __repr__(self) -> str:
        return str(self)


def summarize(model: nn.Module, max_depth: int = 1) -> ModelSummary:
    """The ModelSummary of ``model`` down to ``max_depth`` levels (Lightning's ``summarize``)."""
    return ModelSummary(model, max_depth=max_depth)


def get_formatted_model_size(total_model_size: float) -> str:
    """A model size in MB as the summary prints it: three decimals, thousands separated."""
    return f"{total_model_size:,.3f}"


__all__ = ["LEFTOVER_PARAMS_NAME", "NOT_APPLICABLE", "PARAMETER_NUM_UNITS", "UNKNOWN_SIZE", "ModelSummary",
           "get_formatted_model_size", "get_human_readable_count", "parse_batch_shape", "summarize"]
