"""WandbLogger: a Weights & Biases run (needs the optional wandb package: ``pip install torchfleet[wandb]``).

``offline=True`` (or ``WANDB_MODE=offline``) keeps everything in ``<save_dir>/wandb/offline-run-*``; nothing
is sent (``wandb sync`` uploads it later).
"""

from __future__ import annotations

import os
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

from torchfleet.errors import ConfigurationError
from torchfleet.loggers.base import DummyExperiment, UploadsCheckpoints, on_rank_zero, plain_params
from torchfleet.utilities import rank_zero_only

STEP_KEY = "trainer/global_step"


def _import_wandb() -> Any:
    try:
        import wandb
    except ImportError as exc:
        raise ConfigurationError(
            "WandbLogger needs the wandb package, which is not installed. Install it with "
            "`pip install torchfleet[wandb]` (or `pip install wandb`), or use CSVLogger."
        ) from exc
    return wandb


class WandbLogger(UploadsCheckpoints):
    """Log to a wandb run: ``log_hyperparams`` -> the run's config, ``log_metrics`` -> its history.

    Metrics are logged with ``trainer/global_step`` beside them (the x axis of every chart), so logging
    twice at one step, or an evaluation after fit, never trips wandb's own increasing step. ``name`` is
    the project, ``version`` the run id, ``experiment`` the ``wandb.Run`` (created on first use, on
    global rank 0 only; other ranks get an object that does nothing). ``log_model`` as MLflowLogger's:
    checkpoints become "model" artifacts with the aliases "latest" and "best". Further keyword arguments
    go to ``wandb.init``.
    """

    def __init__(
        self,
        name: str | None = None,
        save_dir: str | os.PathLike = ".",
        version: str | None = None,
        offline: bool = False,
        dir: str | os.PathLike | None = None,
        id: str | None = None,
        project: str | None = None,
        log_model: bool | str = False,
        experiment: Any = None,
        prefix: str = "",
        checkpoint_name: str | None = None,
        *,
        root_dir: str | os.PathLike | None = None,
        **kwargs: Any,
    ) -> None:
        self._wandb = _import_wandb()
        self._init_uploads(log_model)
        directory = root_dir if root_dir is not None else (dir if dir is not None else save_dir)
        self._save_dir = os.fspath(directory)
        self._project = project or os.environ.get("WANDB_PROJECT") or "lightning_logs"
        self._id = version or id
        self._offline = offline
        self._prefix = prefix
        self._checkpoint_name = checkpoint_name
        self._experiment = experiment
        self._init_kwargs = {"name": name, **kwargs}

    def __getstate__(self) -> dict[str, Any]:
        # ddp_spawn pickles the loggers into the ranks: neither the module nor a live run can travel; the run's id
        # does, so rank 0 there continues this run
        state = dict(self.__dict__)
        if self._experiment is not None:
            state["_id"] = self._experiment.id
        state["_experiment"] = None
        del state["_wandb"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._wandb = _import_wandb()

    @property
    def experiment(self) -> Any:
        if not on_rank_zero():
            return DummyExperiment()
        if self._experiment is None:
            os.makedirs(self._save_dir, exist_ok=True)
            kwargs: dict[str, Any] = {"project": self._project, "dir": self._save_dir, "id": self._id,
                                      "resume": "allow" if self._id else None, **self._init_kwargs}
            if self._offline:
                kwargs["mode"] = "offline"
            run = self._wandb.init(**kwargs)
            run.define_metric(STEP_KEY)
            run.define_metric("*", step_metric=STEP_KEY, step_sync=False)
            self._experiment = run
            self._id = run.id
        return self._experiment

    @property
    def name(self) -> str:
        return self._project

    @property
    def version(self) -> str:
        return self._experiment.id if self._experiment is not None and on_rank_zero() else (self._id or "")

    def agree_version(self, strategy: Any) -> None:
        """Every rank names rank 0's run id (``version``); rank 0 chooses it now, the run starts on first use."""
        if strategy.is_global_zero and self._experiment is None and not self._id:
            import secrets

            self._id = secrets.token_hex(4)  # 8 characters of [0-9a-f], as wandb's own ids
        run_id = strategy.broadcast(self.version if strategy.is_global_zero else None)
        if not strategy.is_global_zero:
            self._id = run_id

    @property
    def save_dir(self) -> str:
        return self._save_dir

    @property
    def log_dir(self) -> str:
        return self._save_dir

    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, Any] | Namespace | None = None) -> None:
        self.experiment.config.update(plain_params(params), allow_val_change=True)

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        values: dict[str, Any] = {f"{self._prefix}{k}": v for k, v in metrics.items()}
        if step is not None:
            values[STEP_KEY] = step
        self.experiment.log(values)

    def _upload_checkpoint(self, path: str, aliases: list[str], score: float | None, callback: Any) -> None:
        run = self.experiment
        metadata = {"score": score, "monitor": getattr(callback, "monitor", None), "file": os.path.basename(path)}
        artifact = self._wandb.Artifact(name=self._checkpoint_name or f"model-{run.id}", type="model", metadata=metadata)
        if os.path.isdir(path):
            artifact.add_dir(path, name=os.path.basename(path))
        else:
            artifact.add_file(path, name=os.path.basename(path))
        run.log_artifact(artifact, aliases=aliases)

    def finalize(self, status: str) -> None:
        """Upload the checkpoints (``log_model=True``). The run stays open for later stages, as in Lightning:
        ``wandb.finish()`` (or the end of the process) closes it."""
        if self._experiment is not None:
            self._upload_remembered()
