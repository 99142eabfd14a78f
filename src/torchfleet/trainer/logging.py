"""What ``self.log`` stores, and how logged values become step/epoch metrics (synced across ranks)."""

from __future__ import annotations

import numbers
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor

from torchfleet.errors import ConfigurationError, MisconfiguredModuleError
from torchfleet.watchdog import call_site, labelled

if TYPE_CHECKING:
    from torchfleet.strategies.strategy import Strategy

_REDUCE_NAMES = {"mean": "mean", "avg": "mean", "sum": "sum", "max": "max", "min": "min"}
_REDUCE_FNS = {torch.mean: "mean", torch.sum: "sum", torch.max: "max", torch.min: "min", max: "max", min: "min", sum: "sum"}


def normalize_reduce_fx(reduce_fx: str | Callable) -> str:
    """Map ``reduce_fx`` ("mean", "sum", "max", "min" or torch.mean/sum/max/min) to its name."""
    if isinstance(reduce_fx, str) and reduce_fx.lower() in _REDUCE_NAMES:
        return _REDUCE_NAMES[reduce_fx.lower()]
    name = _REDUCE_FNS.get(reduce_fx) if callable(reduce_fx) else None  # type: ignore[call-overload]
    if name is None:
        # "`self.log(..., reduce_fx={min,max,mean,sum})` are supported" is Lightning's key phrase, for ported matches
        raise ConfigurationError(
            f"self.log(reduce_fx={reduce_fx!r}) is not supported: only `self.log(..., reduce_fx={{min,max,mean,sum}})` "
            "are supported. Accepted values are 'mean' (or 'avg'), 'sum', 'max', 'min' or the functions torch.mean, "
            "torch.sum, torch.max, torch.min (and Python's max, min, sum)."
        )
    return name


# Where each *_step hook logs by default, as in Lightning: per step in training, per epoch elsewhere.
FX_DEFAULTS: dict[str, tuple[bool, bool]] = {
    "training_step": (True, False),
    "on_train_batch_start": (True, False),
    "on_train_batch_end": (True, False),
    "on_before_backward": (True, False),
    "on_after_backward": (True, False),
    "on_before_optimizer_step": (True, False),
    "on_before_zero_grad": (True, False),
    "optimizer_step": (True, False),
}
EPOCH_DEFAULT = (False, True)


@dataclass
class LoggedValue:
    """One logged name: options, latest value, and the running epoch aggregate."""

    name: str
    on_step: bool
    on_epoch: bool
    reduce_fx: str
    sync_dist: bool
    prog_bar: bool
    logger: bool
    latest: Tensor
    total: Tensor | None = None
    weight: float = 0.0
    fresh: bool = True  # logged since the last step collection
    site: str = ""  # where self.log was called (file:line), for sync_dist: named in hang and desync reports
    metric: Any = None  # a torchmetrics Metric logged as the value: its own compute() gives the epoch value

    def update(self, value: Tensor, batch_size: int) -> None:
        self.latest = value
        self.fresh = True
        if not self.on_epoch:
            return
        fx = self.reduce_fx
        if self.total is None:
            self.total = value * batch_size if fx == "mean" else value.clone()
            self.weight = batch_size
        elif fx == "mean":
            self.total = self.total + value * batch_size
            self.weight += batch_size
        elif fx == "sum":
            self.total = self.total + value
        elif fx == "max":
            self.total = torch.maximum(self.total, value)
        else:
            self.total = torch.minimum(self.total, value)

    def epoch_value(self) -> Tensor:
        assert self.total is not None
        return self.total / self.weight if self.reduce_fx == "mean" else self.total


def _to_tensor(name: str, value: Any, device: torch.device) -> Tensor:
    if isinstance(value, Tensor):
        if value.numel() != 1:
            # "tensor must have a single element" is Lightning's phrase (a ValueError there too)
            raise MisconfiguredModuleError(
                f"self.log({name!r}, ...) got a tensor of shape {tuple(value.shape)}, but a logged tensor must have a "
                "single element. Reduce it first (for example value.mean()), or log its parts under separate names."
            )
        value = value.detach()
        if value.dim():
            value = value.reshape(())
        return value if value.is_floating_point() else value.float()
    if isinstance(value, numbers.Number) and not isinstance(value, bool):
        return torch.tensor(float(value), device=device)
    # "`self.log(name, value)` was called" is Lightning's key phrase, kept for ported pytest.raises(match=...)
    raise MisconfiguredModuleError(
        f"`self.log({name}, {value})` was called, but a value of type {type(value).__name__} cannot be logged. "
        "Accepted values are numbers and single-element tensors (or a torchmetrics Metric); log the parts of a dict "
        "with self.log_dict."
    )


def _where(fx: str, name: str, on_step: bool | None, on_epoch: bool | None) -> tuple[bool, bool]:
    """(on_step, on_epoch) of a new logged name: the given ones, else the defaults of the hook ``fx``."""
    default_step, default_epoch = FX_DEFAULTS.get(fx, EPOCH_DEFAULT)
    on_step = default_step if on_step is None else on_step
    on_epoch = default_epoch if on_epoch is None else on_epoch
    if not on_step and not on_epoch:
        raise ConfigurationError(
            f"self.log({name!r}, on_step=False, on_epoch=False) logs nowhere, which is not useful. Set on_step=True, "
            "on_epoch=True or both."
        )
    return on_step, on_epoch


def is_metric(value: Any) -> bool:
    """Whether ``value`` is a torchmetrics ``Metric`` (found by its class, so torchmetrics is never imported here)."""
    return any(c.__name__ == "Metric" and c.__module__.startswith("torchmetrics") for c in type(value).__mro__)


def infer_batch_size(batch: Any) -> int:
    """Length of the first tensor found in ``batch`` (1 when there is none)."""
    if isinstance(batch, Tensor):
        return batch.shape[0] if batch.dim() else 1
    if isinstance(batch, dict):
        batch = list(batch.values())
    if isinstance(batch, (list, tuple)):
        for item in batch:
            size = infer_batch_size(item)
            if size:
                return size
        return 1
    return 0


class Results:
    """Everything logged in one stage ("train", "validate", "test") of one epoch."""

    def __init__(self, stage: str) -> None:
        self.stage = stage
        #: opened before the first training epoch (for on_train_start), which takes it over
        self.waiting = False
        self.values: dict[str, LoggedValue] = {}
        self.batch: Any = None
        self._sized: Any = object()
        self._batch_size: int | None = None
        self.device = torch.device("cpu")

    def new_batch(self, batch: Any) -> None:
        self.batch = batch

    def batch_size(self) -> int:
        # cached per batch object: the loop only assigns ``self.batch`` (cheap), the size is found on demand
        batch = self.batch
        if self._sized is not batch:
            self._sized = batch
            self._batch_size = infer_batch_size(batch) or 1
        return self._batch_size  # type: ignore[return-value]

    def log(
        self,
        fx: str,
        name: str,
        value: Any,
        prog_bar: bool,
        logger: bool,
        on_step: bool | None,
        on_epoch: bool | None,
        reduce_fx: str | Callable,
        sync_dist: bool,
        batch_size: int | None,
    ) -> None:
        entry = self.values.get(name)
        if entry is not None and not entry.on_epoch and type(value) is Tensor and value.dim() == 0:
            entry.latest = value.detach()  # the per-step hot path: a scalar logged before
            entry.fresh = True
            return
        if not isinstance(value, (Tensor, numbers.Number)) and is_metric(value):
            self._log_metric(fx, name, value, prog_bar, logger, on_step, on_epoch, entry)
            return
        tensor = _to_tensor(name, value, self.device)
        if entry is None:
            on_step, on_epoch = _where(fx, name, on_step, on_epoch)
            entry = LoggedValue(
                name, on_step, on_epoch, normalize_reduce_fx(reduce_fx), sync_dist, prog_bar, logger, tensor
            )
            if sync_dist:
                entry.site = call_site()
            self.values[name] = entry
        if entry.on_epoch:
            size = batch_size if batch_size is not None else (self.batch_size() if entry.reduce_fx == "mean" else 1)
        else:
            size = 1
        entry.update(tensor, size)

    def _log_metric(self, fx: str, name: str, metric: Any, prog_bar: bool, logger: bool, on_step: bool | None,
                    on_epoch: bool | None, entry: LoggedValue | None) -> None:
        """As Lightning: per step the value of the metric's last ``forward`` (this batch's), per epoch its
        ``compute()`` over everything it saw (synced by the metric itself), after which it is reset."""
        if entry is None:
            on_step, on_epoch = _where(fx, name, on_step, on_epoch)
            entry = LoggedValue(name, on_step, on_epoch, "mean", False, prog_bar, logger,
                                torch.tensor(float("nan")), metric=metric)
            self.values[name] = entry
        elif entry.metric is None:
            raise MisconfiguredModuleError(
                f"self.log({name!r}, ...) got a torchmetrics {type(metric).__name__} after a plain value was logged "
                "under that name in this epoch. Log the metric object, or its values, under one name each."
            )
        entry.metric = metric
        if entry.on_step:
            value = getattr(metric, "_forward_cache", None)
            if value is None:
                raise MisconfiguredModuleError(
                    f"self.log({name!r}, {type(metric).__name__}) in {fx} logs the metric per step, which is the value "
                    "of its last forward call, but it has none: update it by calling it (metric(preds, target)) "
                    "rather than metric.update(...), or log it with on_step=False to log only its epoch value."
                )
            entry.latest = _to_tensor(name, value, self.device)
            entry.fresh = True

    # ---------------------------------------------------------------- collection
    def collect_step(self, strategy: Strategy | None) -> tuple[dict[str, Tensor], dict[str, Tensor], dict[str, Tensor]]:
        """Values logged on_step since the last collection: (for callbacks, for loggers, for the progress bar)."""
        fresh = [v for v in self.values.values() if v.on_step and v.fresh]
        for v in self.values.values():
            v.fresh = False
        if not fresh:
            return {}, {}, {}
        values = sync_values(strategy, [(v.latest, v.reduce_fx, v.sync_dist) for v in fresh], fresh)
        # a value logged on both step and epoch is "name_step" here and "name_epoch" there
        return _route(fresh, values, [f"{v.name}_step" if v.on_epoch else v.name for v in fresh])

    def collect_epoch(self, strategy: Strategy | None, module: Any = None) -> tuple[dict[str, Tensor], dict[str, Tensor],
                                                                                 dict[str, Tensor]]:
        """Epoch aggregates of values logged on_epoch: (for callbacks, for loggers, for the progress bar).

        ``module``: where a rank that never logged a torchmetrics Metric another rank logged finds it (by attribute).
        """
        entries = [v for v in self.values.values() if v.on_epoch and v.total is not None]
        metrics = [v for v in self.values.values() if v.metric is not None]
        if _distributed(strategy):
            entries, metrics = _agree_on_synced(strategy, entries, metrics, module)  # type: ignore[arg-type]
        values = sync_epoch(strategy, entries) if entries else []
        for v in metrics:
            if v.on_epoch:
                entries.append(v)
                values.append(_to_tensor(v.name, v.metric.compute(), self.device))
            v.metric.reset()  # as Lightning: a logged Metric starts each epoch empty
        if not entries:
            return {}, {}, {}
        return _route(entries, values, [f"{v.name}_epoch" if v.on_step else v.name for v in entries])


def logger_step(trainer: Any) -> int:
    """The step loggers record values at, Lightning's: inside fit, the index of the optimizer step just taken (0 for
    the first; validation and epoch ends share their last step's); in validate/test, the steps taken."""
    step = trainer.state.global_step
    return max(step - 1, 0) if trainer.state.fn == "fit" else step


def open_train_results(state: Any, model: Any, device: torch.device) -> None:
    """Open the first training epoch's Results before ``on_train_start``, so that hook (and callbacks in it) can log.

    As in Lightning, what it logs counts towards the first epoch's values, then is gone.
    """
    results = Results("train")
    results.device, results.waiting = device, True
    state.train_results = model.loop_door.results = results


def train_epoch_results(state: Any, device: torch.device) -> Results:
    """The Results of the training epoch that starts: the one opened for ``on_train_start``, else a new one."""
    results = state.train_results
    if results is None or not results.waiting:
        results = Results("train")
        results.device = device
    results.waiting = False
    return results


def _route(entries: list[Any], values: list[Any], names: list[str]) -> tuple[dict, dict, dict]:
    """(for callbacks, for loggers, for the progress bar): callbacks see the plain names, the others ``names``."""
    callback, logged, bar = {}, {}, {}
    for v, val, name in zip(entries, values, names):
        callback[v.name] = val
        if v.logger:
            logged[name] = val
        if v.prog_bar:
            bar[name] = val
    return callback, logged, bar


def _distributed(strategy: Strategy | None) -> bool:
    return strategy is not None and strategy.world_size > 1


def _sync_label(entries: list[LoggedValue] | None, idx: list[int], when: str = "") -> labelled:
    """Names the collective in hang/desync reports ("self.log 'loss' sync_dist") at the first self.log's line."""
    if entries is None:
        return labelled(f"self.log sync_dist{when}")
    names = ", ".join(repr(entries[i].name) for i in idx)
    return labelled(f"self.log {names} sync_dist{when}", entries[idx[0]].site or None)


def sync_values(strategy: Strategy | None, items: list[tuple[Tensor, str, bool]],
                entries: list[LoggedValue] | None = None, when: str = "") -> list[Tensor]:
    """Reduce the ``sync_dist`` values across ranks: one collective per reduce op, not one per name."""
    out = [t for t, _, _ in items]
    if not _distributed(strategy):
        return out
    by_op: dict[str, list[int]] = {}
    for i, (_, fx, sync) in enumerate(items):
        if sync:
            by_op.setdefault(fx, []).append(i)
    for fx, idx in by_op.items():
        stacked = torch.stack([out[i].to(strategy.root_device, torch.float32) for i in idx])  # type: ignore[union-attr]
        with _sync_label(entries, idx, when):
            reduced = strategy.reduce(stacked, reduce_op=fx)  # type: ignore[union-attr]
        for j, i in enumerate(idx):
            out[i] = reduced[j]
    return out


_IDENTITY = {"mean": 0.0, "sum": 0.0, "max": float("-inf"), "min": float("inf")}


def _agree_on_synced(strategy: Strategy, entries: list[LoggedValue], metrics: list[LoggedValue],
                     module: Any) -> tuple[list[LoggedValue], list[LoggedValue]]:
    """The local entries plus, for every ``sync_dist`` name some other rank logged, an empty stand-in here; the
    logged torchmetrics Metrics of every rank, in one order.

    With exact evaluation shards a rank may have run fewer batches (or none) and so lack a name the
    others reduce; the stand-in (weight 0, the identity of its reduction) keeps the collectives
    matched instead of leaving the other ranks waiting. Synced entries go in one order on every rank.
    A Metric's ``compute()`` is a collective of its own: a rank that never logged it computes the
    same attribute of its module (empty, it adds nothing), so every rank computes every Metric.
    """
    local = [v for v in entries if not v.sync_dist]
    mine = {v.name: v for v in entries if v.sync_dist}
    options = [(v.name, v.reduce_fx, v.on_step, v.prog_bar, v.logger) for v in mine.values()]
    paths = _metric_paths(module, metrics)
    metric_options = [(v.name, paths.get(id(v.metric)), v.on_step, v.on_epoch, v.prog_bar, v.logger) for v in metrics]
    union: dict[str, tuple] = {}
    with labelled("self.log sync_dist names, epoch end"):
        gathered = strategy.all_gather_object((options, metric_options))
    for rank_options, _ in gathered:
        for opt in rank_options:
            union.setdefault(opt[0], opt)
    synced = []
    for name in sorted(union):
        if name in mine:
            synced.append(mine[name])
            continue
        _, fx, on_step, prog_bar, logger = union[name]
        empty = torch.tensor(_IDENTITY[fx], device=strategy.root_device)
        synced.append(LoggedValue(name, on_step, True, fx, True, prog_bar, logger, latest=empty, total=empty, weight=0.0))
    return local + synced, _every_ranks_metrics(metrics, [m for _, m in gathered], module)


def _metric_paths(module: Any, metrics: list[LoggedValue]) -> dict[int, str]:
    """id(metric) -> its attribute path in ``module`` (``named_modules``), for the logged Metrics found there."""
    if not metrics or module is None:
        return {}
    return {id(m): name for name, m in module.named_modules() if name}


def _every_ranks_metrics(metrics: list[LoggedValue], gathered: list[list[tuple]], module: Any) -> list[LoggedValue]:
    """The Metrics any rank logged, by name: this rank's entries, else a stand-in around its module's attribute.

    Decided from what every rank gathered, so a Metric some rank cannot find stops every rank with the same error.
    """
    mine = {v.name: v for v in metrics}
    union: dict[str, tuple] = {}
    ranks: dict[str, int] = {}
    for rank_metrics in gathered:
        for name, path, *options in rank_metrics:
            ranks[name] = ranks.get(name, 0) + 1
            if union.get(name, (None,))[0] is None:
                union[name] = (path, *options)
    out = []
    for name in sorted(union):
        path, on_step, on_epoch, prog_bar, logger = union[name]
        if ranks[name] < len(gathered) and on_epoch and (path is None or module is None):
            raise MisconfiguredModuleError(
                f"self.log({name!r}, metric) logged a torchmetrics Metric on {ranks[name]} of {len(gathered)} ranks, "
                "and it is not an attribute of the Module, so the ranks that ran no batch cannot take part in its "
                "compute() across ranks. Make the Metric an attribute of the Module (self.metric = "
                "torchmetrics.Accuracy(...) in __init__), as Lightning also requires."
            )
        if name in mine:
            out.append(mine[name])
        elif on_epoch:  # an entry only logged per step is reset, with no collective to join
            out.append(LoggedValue(name, on_step, True, "mean", False, prog_bar, logger, torch.tensor(float("nan")),
                                   metric=module.get_submodule(path)))
    return out


def sync_epoch(strategy: Strategy | None, entries: list[LoggedValue]) -> list[Tensor]:
    """Epoch values, synced across ranks. Means are weighted by every rank's sample count (exact, not a mean of means)."""
    out = [v.epoch_value() for v in entries]
    if not _distributed(strategy):
        return out
    assert strategy is not None
    dev = strategy.root_device
    means = [i for i, v in enumerate(entries) if v.sync_dist and v.reduce_fx == "mean"]
    if means:
        packed = torch.stack(
            [entries[i].total.to(dev, torch.float32) for i in means]  # type: ignore[union-attr]
            + [torch.tensor(float(entries[i].weight), device=dev) for i in means]
        )
        with _sync_label(entries, means, ", epoch end"):
            summed = strategy.reduce(packed, reduce_op="sum")
        n = len(means)
        for j, i in enumerate(means):
            out[i] = summed[j] / summed[n + j]
    others = [(out[i], v.reduce_fx, True) for i, v in enumerate(entries) if v.sync_dist and v.reduce_fx != "mean"]
    if others:
        reduced = sync_values(strategy, others, [v for v in entries if v.sync_dist and v.reduce_fx != "mean"],
                              ", epoch end")
        k = 0
        for i, v in enumerate(entries):
            if v.sync_dist and v.reduce_fx != "mean":
                out[i] = reduced[k]
                k += 1
    return out
