"""ModelSummary and RichModelSummary: the model's layers and parameter counts when fit starts (rank 0)."""

from __future__ import annotations

import logging
from typing import Any

from torch import nn

from torchfleet.errors import ConfigurationError
from torchfleet.trainer.callbacks.base import Callback
from torchfleet.utilities.model_summary import ModelSummary as LayerSummary

log = logging.getLogger("torchfleet")


def summarize(model: nn.Module, max_depth: int = 1) -> tuple[list[tuple[str, str, int]], dict[str, int]]:
    """Rows ``(name, type, parameters)`` for the submodules up to ``max_depth`` levels deep (-1: all), and the
    totals: ``trainable``, ``frozen``, ``total`` parameters and ``bytes`` of parameter storage."""
    summary = LayerSummary(model, max_depth)  # counts only: the model does not run
    total, trainable = summary.total_parameters, summary.trainable_parameters
    size = sum(p.numel() * p.element_size() for p in model.parameters())
    rows = list(zip(summary.layer_names, summary.layer_types, summary.param_nums))
    return rows, {"trainable": trainable, "frozen": total - trainable, "total": total, "bytes": size}


class ModelSummary(Callback):
    """Log a table of the model's submodules down to ``max_depth`` levels (-1: every level, 0: no table).

    The Trainer logs a one-level summary itself (``enable_model_summary=True``); a ModelSummary in
    ``callbacks`` replaces it.
    """

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        if isinstance(max_depth, bool) or not isinstance(max_depth, int) or max_depth < -1:
            raise ConfigurationError(
                f"ModelSummary(max_depth={max_depth!r}) is not valid: give -1 (every level), 0 (no summary) or "
                "a depth >= 1."
            )
        self.max_depth = max_depth
        self._summarize_kwargs = summarize_kwargs

    def on_fit_start(self, trainer: Any, module: Any) -> None:
        if self.max_depth != 0 and trainer.is_global_zero:
            rows, totals = summarize(module, self.max_depth)
            self.summarize(rows, totals, trainer, module)

    @staticmethod
    def heading(trainer: Any, module: Any) -> str:
        return (f"{type(module).__name__} on {trainer.strategy.root_device}, {type(trainer.strategy).__name__}, "
                f"precision {trainer.precision}")

    def summarize(self, rows: list[tuple[str, str, int]], totals: dict[str, int], trainer: Any, module: Any) -> None:
        """Show the summary (here: one log record); RichModelSummary draws a table."""
        width = max([len(r[0]) for r in rows] + [4])
        lines = [f"  {'Name':<{width}}  {'Type':<24} {'Params':>12}"]
        lines += [f"  {n:<{width}}  {t:<24} {p:>12,}" for n, t, p in rows]
        lines.append(f"  {totals['trainable']:,} trainable, {totals['frozen']:,} frozen, {totals['total']:,} total "
                     f"parameters ({totals['bytes'] / 1e6:.3f} MB)")
        log.info("%s:\n%s", self.heading(trainer, module), "\n".join(lines))


class RichModelSummary(ModelSummary):
    """ModelSummary drawn as a ``rich`` table (needs the optional rich package: ``pip install torchfleet[rich]``)."""

    def __init__(self, max_depth: int = 1, **summarize_kwargs: Any) -> None:
        _require_rich("RichModelSummary")
        super().__init__(max_depth, **summarize_kwargs)

    def summarize(self, rows: list[tuple[str, str, int]], totals: dict[str, int], trainer: Any, module: Any) -> None:
        from rich.console import Console
        from rich.table import Table

        table = Table(title=self.heading(trainer, module), header_style="bold")
        table.add_column("Name")
        table.add_column("Type")
        table.add_column("Params", justify="right")
        for name, kind, count in rows:
            table.add_row(name, kind, f"{count:,}")
        console = Console(**self._summarize_kwargs.get("console_kwargs", {}))
        console.print(table)
        console.print(f"Trainable params: {totals['trainable']:,}\nNon-trainable params: {totals['frozen']:,}\n"
                      f"Total params: {totals['total']:,}\n"
                      f"Total estimated model params size (MB): {totals['bytes'] / 1e6:.3f}")


def _require_rich(name: str) -> None:
    try:
        import rich  # noqa: F401
    except ImportError as exc:
        raise ConfigurationError(
            f"{name} needs the rich package, which is not installed. Install it with `pip install torchfleet[rich]` "
            "(or `pip install rich`), or use the tqdm-based TQDMProgressBar and ModelSummary."
        ) from exc
