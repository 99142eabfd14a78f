"""MLflowLogger: params, metrics (with their step) and checkpoints in an MLflow tracking store.

Needs the optional mlflow package (``pip install torchfleet[mlflow]``: mlflow-skinny, and SQLAlchemy for
the local SQLite store). Without a tracking URI the store is ``sqlite:///<save_dir>/mlflow.db`` with the
artifacts beside it in ``<save_dir>/artifacts``: local, nothing leaves the machine.
"""

from __future__ import annotations

import os
import time
from argparse import Namespace
from collections.abc import Mapping
from typing import Any

from torchfleet.errors import ConfigurationError
from torchfleet.loggers.base import DummyExperiment, UploadsCheckpoints, on_rank_zero, plain_params
from torchfleet.utilities import rank_zero_only

#: the scheme of a local artifact folder
LOCAL_FILE_URI_PREFIX = "file:"
_STATUS = {"success": "FINISHED", "failed": "FAILED", "finished": "FINISHED"}
_PARAM_LENGTH = 6000  # MLflow refuses longer parameter values


def _import_mlflow() -> Any:
    try:
        import mlflow  # noqa: F401
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        raise ConfigurationError(
            "MLflowLogger needs the mlflow package, which is not installed. Install it with "
            "`pip install torchfleet[mlflow]` (or `pip install mlflow-skinny sqlalchemy alembic`), or use CSVLogger."
        ) from exc
    return MlflowClient


def _flatten(params: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            out.update(_flatten(value, f"{name}/"))
        else:
            out[name] = value
    return out


class MLflowLogger(UploadsCheckpoints):
    """Log to an MLflow run: ``log_hyperparams`` -> params, ``log_metrics`` -> metrics at their step.

    ``log_model``: False (no checkpoints), True (the ModelCheckpoint's files once training ends), or
    "all" (each file as it is saved); they land under the run's ``checkpoints/<file stem>/`` artifacts
    with an ``aliases.txt`` ("latest", "best"). ``name`` is the experiment id, ``version`` the run id;
    ``experiment`` is the ``MlflowClient``. Only global rank 0 creates the run and writes.
    """

    def __init__(
        self,
        experiment_name: str = "lightning_logs",
        run_name: str | None = None,
        tracking_uri: str | None = None,
        tags: dict[str, Any] | None = None,
        save_dir: str | os.PathLike | None = "./mlruns",
        log_model: bool | str = False,
        prefix: str = "",
        artifact_location: str | None = None,
        run_id: str | None = None,
        checkpoint_path_prefix: str = "",
        *,
        root_dir: str | os.PathLike | None = None,
    ) -> None:
        self._client_class = _import_mlflow()
        self._init_uploads(log_model)
        directory = root_dir if root_dir is not None else save_dir
        self._save_dir = os.path.abspath(os.fspath(directory)) if directory is not None else None
        tracking_uri = tracking_uri or os.environ.get("MLFLOW_TRACKING_URI")
        if tracking_uri is None:
            if self._save_dir is None:
                raise ConfigurationError("MLflowLogger needs a tracking_uri=... or a save_dir=... for a local store.")
            tracking_uri = f"sqlite:///{os.path.join(self._save_dir, 'mlflow.db')}"
            artifact_location = artifact_location or f"{LOCAL_FILE_URI_PREFIX}{os.path.join(self._save_dir, 'artifacts')}"
        self._tracking_uri = tracking_uri
        self._experiment_name = experiment_name
        self._run_name = run_name
        self._tags = dict(tags or {})
        self._artifact_location = artifact_location
        self._prefix = prefix
        self._checkpoint_path_prefix = checkpoint_path_prefix
        self._run_id = run_id
        self._experiment_id: str | None = None
        self._client: Any = None

    # ---------------------------------------------------------------- the run
    @property
    def experiment(self) -> Any:
        """The ``MlflowClient``; the run exists once this was read on global rank 0 (elsewhere: a no-op object)."""
        return self._start_run() if on_rank_zero() else DummyExperiment()

    def _start_run(self) -> Any:
        if self._client is None and on_rank_zero():
            if self._tracking_uri.startswith("sqlite:///"):  # SQLite creates the file, not its folder
                os.makedirs(os.path.dirname(self._tracking_uri[len("sqlite:///"):]) or ".", exist_ok=True)
            client = self._client_class(tracking_uri=self._tracking_uri)
            if self._run_id is not None:
                self._experiment_id = client.get_run(self._run_id).info.experiment_id
            else:
                found = client.get_experiment_by_name(self._experiment_name)
                self._experiment_id = found.experiment_id if found is not None else client.create_experiment(
                    self._experiment_name, artifact_location=self._artifact_location)
                tags = {k: str(v) for k, v in self._tags.items()}
                if self._run_name is not None:
                    tags.setdefault("mlflow.runName", self._run_name)
                self._run_id = client.create_run(self._experiment_id, tags=tags, run_name=self._run_name).info.run_id
            self._client = client
        return self._client

    @property
    def run_id(self) -> str | None:
        """The run's id (None on ranks other than 0, unless given)."""
        self._start_run()
        return self._run_id

    @property
    def experiment_id(self) -> str | None:
        self._start_run()
        return self._experiment_id

    @property
    def name(self) -> str:
        return self.experiment_id or ""

    @property
    def version(self) -> str:
        return self.run_id or ""

    def agree_version(self, strategy: Any) -> None:
        """Rank 0 creates the run; every rank then names its id (``version``), though only rank 0 writes to it."""
        run_id = strategy.broadcast(self.run_id if strategy.is_global_zero else None)
        if not strategy.is_global_zero:
            self._run_id = run_id

    @property
    def save_dir(self) -> str | None:
        return self._save_dir

    @property
    def log_dir(self) -> str | None:
        return self._save_dir

    # ------------------------------------------------------------ recording
    @rank_zero_only
    def log_hyperparams(self, params: Mapping[str, Any] | Namespace | None = None) -> None:
        from mlflow.entities import Param

        flat = _flatten(plain_params(params))
        entries = [Param(k, str(v)[:_PARAM_LENGTH]) for k, v in flat.items()]
        for start in range(0, len(entries), 100):  # MLflow takes at most 100 params per batch
            self.experiment.log_batch(self.run_id, params=entries[start:start + 100])

    @rank_zero_only
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        entries = [Metric(f"{self._prefix}{k}".replace("@", "_at_"), float(v), now, step or 0)
                   for k, v in metrics.items()]
        self.experiment.log_batch(self.run_id, metrics=entries)

    # ---------------------------------------------------------- checkpoints
    def _upload_checkpoint(self, path: str, aliases: list[str], score: float | None, callback: Any) -> None:
        import tempfile

        stem = os.path.splitext(os.path.basename(path))[0]
        artifact_path = f"{self._checkpoint_path_prefix}checkpoints/{stem}"
        if os.path.isdir(path):  # a sharded checkpoint
            self.experiment.log_artifacts(self.run_id, path, f"{artifact_path}/{os.path.basename(path)}")
        else:
            self.experiment.log_artifact(self.run_id, path, artifact_path)
        with tempfile.TemporaryDirectory() as tmp:
            note = os.path.join(tmp, "aliases.txt")
            with open(note, "w") as f:
                f.write("\n".join(aliases + ([f"score={score}"] if score is not None else [])) + "\n")
            self.experiment.log_artifact(self.run_id, note, artifact_path)

    def finalize(self, status: str) -> None:
        if self._client is None or not on_rank_zero():
            return  # nothing was logged here: no run to close
        self._upload_remembered()
        self._client.set_terminated(self._run_id, _STATUS.get(status, status.upper()))
