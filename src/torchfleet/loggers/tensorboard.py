"""TensorBoardLogger: event files for TensorBoard (needs the optional tensorboard package).

Only global rank 0 writes: elsewhere ``experiment`` is an object that does nothing and the ``log_*`` methods
return at once, so a program that logs from every rank still gets one version folder with one event file.
"""

from __future__ import annotations

import os
import warnings
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

import torch

from torchfleet.compiled import jit_scan
from torchfleet.errors import ConfigurationError
from torchfleet.loggers.base import (
    DummyExperiment,
    FolderLogger,
    on_rank_zero,
    plain_params,
    save_hparams_to_yaml,
    with_prefix,
)
from torchfleet.utilities import rank_zero_only


def flat_params(params: Mapping[str, Any], parent: str = "") -> dict[str, Any]:
    """Hyperparameters as TensorBoard's HPARAMS plugin takes them: nested dicts and Namespaces flattened with "/",
    numbers, strings and booleans kept, one-element tensors as numbers, everything else as its str()."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{parent}/{key}" if parent else str(key)
        if isinstance(value, Namespace):
            value = vars(value)
        if isinstance(value, Mapping) and value:
            out.update(flat_params(value, name))
        elif isinstance(value, (bool, int, float, str)):
            out[name] = value
        elif isinstance(value, torch.Tensor) and value.numel() == 1:
            out[name] = value.item()
        else:
            out[name] = str(value)
    return out


class TensorBoardLogger(FolderLogger):
    """Writes TensorBoard event files to ``<save_dir>/<name>/version_<n>/[<sub_dir>/]``.

    ``log_graph=True``: the Trainer adds the Module's graph at the start of fit, traced on
    ``model.example_input_array``. ``default_hp_metric``: ``log_hyperparams`` without metrics logs
    ``hp_metric=-1``, so the HPARAMS tab lists the run (Lightning's default). ``prefix`` starts every metric
    name (``<prefix>-<name>``); other keyword arguments go to ``SummaryWriter``.
    """

    NAME_HPARAMS_FILE = "hparams.yaml"

    def __init__(self, save_dir: str | os.PathLike | None = None, name: str | None = "logs",
                 version: int | str | None = None, log_graph: bool = False, default_hp_metric: bool = True,
                 prefix: str = "", sub_dir: str | os.PathLike | None = None, *,
                 root_dir: str | os.PathLike | None = None, **writer_kwargs: Any) -> None:
        try:
            from torch.utils.tensorboard import SummaryWriter  # noqa: F401
        except ImportError as exc:
            raise ConfigurationError(
                "TensorBoardLogger needs the tensorboard package, which is not installed. Install it with "
                "`pip install torchfleet[tensorboard]` (or `pip install tensorboard`), or use CSVLogger."
            ) from exc
        super().__init__(save_dir, name, version, root_dir=root_dir, sub_dir=sub_dir, prefix=prefix)
        self._log_graph = bool(log_graph)
        self._default_hp_metric = default_hp_metric
        self.hparams: dict[str, Any] = {}
        self._writer_kwargs = writer_kwargs
        self._experiment: Any = None

    @property
    def experiment(self) -> Any:
        """The ``SummaryWriter`` of the version folder (created on first use, on global rank 0 only)."""
        if not on_rank_zero():
            return DummyExperiment()
        if self._experiment is None:
            from torch.utils.tensorboard import SummaryWriter

            self.claim_version()  # a folder of its own, even beside another run starting now
            os.makedirs(self.log_dir, exist_ok=True)
            self._experiment = SummaryWriter(log_dir=self.log_dir, **self._writer_kwargs)
        return self._experiment

    @rank_zero_only
    def log_metrics(self, metrics: Mapping[str, Any], step: int | None = None) -> None:
        writer = self.experiment
        for key, value in with_prefix(metrics, self._prefix).items():
            if isinstance(value, torch.Tensor):
                value = value.item()
            if isinstance(value, Mapping):
                writer.add_scalars(key, value, global_step=step)
            else:
                writer.add_scalar(key, value, global_step=step)

    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, Any] | Namespace | None = None, metrics: Any = None,
                        step: int | None = None) -> None:
        """Write ``params`` to hparams.yaml and, with ``metrics`` (or ``default_hp_metric``), to the HPARAMS tab.

        ``metrics``: a dict of values, or one value (logged as ``hp_metric``), shown beside the
        hyperparameters in TensorBoard.
        """
        if isinstance(params, Namespace):
            params = vars(params)
        params = dict(params or {})
        self.hparams.update(plain_params(params))
        self.claim_version()
        os.makedirs(self.log_dir, exist_ok=True)
        save_hparams_to_yaml(os.path.join(self.log_dir, self.NAME_HPARAMS_FILE), self.hparams)
        if metrics is None:
            metrics = {"hp_metric": -1} if self._default_hp_metric else None
        elif not isinstance(metrics, Mapping):
            metrics = {"hp_metric": metrics}
        if not metrics:
            return
        self.log_metrics(metrics, step)
        from torch.utils.tensorboard.summary import hparams

        values = {k: v.item() if isinstance(v, torch.Tensor) else v for k, v in metrics.items()}
        writer = self.experiment._get_file_writer()
        for summary in hparams(flat_params(params), values):
            writer.add_summary(summary, step)

    @rank_zero_only
    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """Add ``model``'s graph, traced on ``input_array`` (default: ``model.example_input_array``); with
        ``log_graph=False`` nothing. An input that is missing or not a tensor or tuple gives a warning instead."""
        if not self._log_graph:
            return
        if input_array is None:
            input_array = getattr(model, "example_input_array", None)
        # "Could not log computational graph to TensorBoard" and the two reasons are Lightning's phrases
        if input_array is None:
            warnings.warn(
                "Could not log computational graph to TensorBoard: The `model.example_input_array` attribute is not "
                "set or `input_array` was not given. Set model.example_input_array to a batch for forward(), or pass "
                "TensorBoardLogger(log_graph=False).", stacklevel=2,
            )
            return
        if not isinstance(input_array, (torch.Tensor, tuple)):
            warnings.warn(
                f"Could not log computational graph to TensorBoard: the input of type {type(input_array).__name__} "
                "can't be traced by TensorBoard. Give a tensor, or a tuple of forward()'s positional arguments.",
                stacklevel=2,
            )
            return
        device = next((p.device for p in model.parameters()), None)
        if device is not None:
            input_array = _to(input_array, device)
        with jit_scan():  # torch.jit.trace reads every attribute: a Module outside a Trainer must not raise then
            self.experiment.add_graph(model, input_array)

    def save(self) -> None:
        """Flush the event file; write hparams.yaml (the hyperparameters so far, maybe none) if the folder lacks it."""
        if self._experiment is not None:
            self._experiment.flush()
        path = os.path.join(self.log_dir, self.NAME_HPARAMS_FILE)
        if on_rank_zero() and os.path.isdir(self.log_dir) and not os.path.isfile(path):
            save_hparams_to_yaml(path, self.hparams)

    def finalize(self, status: str) -> None:
        if self._experiment is not None:
            self._experiment.flush()
            self._experiment.close()
            self._experiment = None
        if status == "success":
            self.save()


def _to(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    return tuple(_to(v, device) for v in value) if isinstance(value, tuple) else value
