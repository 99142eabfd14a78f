"""Logger: where logged metrics and hyperparameters go. The Trainer calls loggers on global rank 0 only.

The loggers themselves also write on global rank 0 only (user code may call them on every rank), into
the version every rank agreed on (``agree_version``, a broadcast of rank 0's choice).
"""

from __future__ import annotations

import functools
import logging
import os
import re
import warnings
from abc import ABC, abstractmethod
from argparse import Namespace
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from torchfleet.errors import ConfigurationError, not_valid


def is_url(path: str) -> bool:
    """Whether ``path`` names a remote or in-memory file system (``s3://...``, ``memory://...``) for fsspec."""
    return "://" in path


def next_version(root: str) -> int:
    """The first unused N for ``<root>/version_N`` (``root`` may be an fsspec URL): one more than the highest there.

    Only a guess while another run may be starting: ``allocate_version`` claims a number."""
    if is_url(root):
        import fsspec

        fs, path = fsspec.core.url_to_fs(root)
        names = [os.path.basename(p.rstrip("/")) for p in fs.ls(path, detail=False)] if fs.isdir(path) else []
    else:
        names = os.listdir(root) if os.path.isdir(root) else []
    used = [int(m.group(1)) for d in names if (m := re.fullmatch(r"version_(\d+)", d))]
    return max(used) + 1 if used else 0


def allocate_version(root: str) -> int:
    """Claim the first free ``<root>/version_N`` by creating it: two runs starting together never get the same N.

    A local folder is created with ``os.mkdir``, which fails for all but one of the processes racing for a name;
    the losers try N+1, N+2... An fsspec URL is created with the file system's ``mkdir``; object stores (s3, gcs,
    azure) have no folders, so there the number is only ``next_version``'s guess (docs/checkpoints.md).
    """
    version = next_version(root)
    if is_url(root):
        import fsspec

        fs, path = fsspec.core.url_to_fs(root)
        while True:
            try:
                fs.makedirs(f"{path.rstrip('/')}/version_{version}", exist_ok=False)
                return version
            except FileExistsError:
                version += 1
    os.makedirs(root, exist_ok=True)
    while True:
        try:
            os.mkdir(os.path.join(root, f"version_{version}"))
            return version
        except FileExistsError:
            version += 1


def with_prefix(metrics: Mapping[str, Any], prefix: str) -> Mapping[str, Any]:
    """``metrics`` with each name as ``<prefix>-<name>`` (Lightning's joiner), or unchanged without a prefix."""
    return {f"{prefix}-{k}": v for k, v in metrics.items()} if prefix else metrics


def save_hparams_to_yaml(config_yaml: str | os.PathLike, hparams: Mapping[str, Any] | Namespace | None) -> None:
    """Write ``hparams`` to a YAML file as plain values (anything else as its repr)."""
    import yaml

    with open(config_yaml, "w") as f:
        yaml.safe_dump(plain_params(hparams), f, sort_keys=False)


def load_hparams_from_yaml(config_yaml: str | os.PathLike, use_omegaconf: bool = True) -> Any:
    """The hyperparameters a logger wrote to ``hparams.yaml`` (a DictConfig with omegaconf when asked and installed).

    A missing file gives ``{}`` and a warning, as in Lightning.
    """
    import yaml

    if not os.path.isfile(config_yaml):
        warnings.warn(f"Missing Tags: no hyperparameters file at {os.fspath(config_yaml)}; returning none.",
                      stacklevel=2)
        return {}
    with open(config_yaml) as f:
        hparams = yaml.safe_load(f) or {}
    if use_omegaconf:
        try:
            from omegaconf import OmegaConf
        except ImportError:
            return hparams
        return OmegaConf.create(hparams)
    return hparams


def plain_params(params: Mapping[str, Any] | Namespace | None) -> dict[str, Any]:
    """Hyperparameters as plain YAML-safe values (anything else becomes its repr)."""
    if params is None:
        return {}
    if isinstance(params, Namespace):
        params = vars(params)

    def clean(v: Any) -> Any:
        if v is None or isinstance(v, (bool, int, float, str)):
            return v
        if isinstance(v, Mapping):
            return {str(k): clean(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [clean(x) for x in v]
        return repr(v)

    return {str(k): clean(v) for k, v in params.items()}


class Logger(ABC):
    """Receives metrics (``log_metrics``) and hyperparameters; writes them somewhere.

    The Trainer calls loggers on global rank 0 only, so implementations need not check ranks.
    """

    @property
    @abstractmethod
    def name(self) -> str: ...

    @property
    @abstractmethod
    def version(self) -> int | str: ...

    @property
    def save_dir(self) -> str | None:
        return None

    @property
    def log_dir(self) -> str | None:
        return None

    @abstractmethod
    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Record ``metrics`` at ``step``."""

    def log_hyperparams(self, params: Mapping[str, Any] | Namespace | None = None, *args: Any, **kwargs: Any) -> None:
        """Record the run's hyperparameters."""

    def log_graph(self, model: Any, input_array: Any = None) -> None:
        """Record the model's computation graph (the Trainer calls it once, at the start of fit); most loggers cannot."""

    def save(self) -> None:
        """Flush what is buffered."""

    def finalize(self, status: str) -> None:
        """The run ended with ``status`` ("success" or "failed"): flush and close."""
        self.save()

    @property
    def experiment(self) -> Any:
        """The underlying writer object."""
        return None

    def agree_version(self, strategy: Any) -> None:
        """Make every rank use rank 0's version (and so its folder). Loggers without folders: nothing to agree."""

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        """ModelCheckpoint saved a file (called on global rank 0); loggers that upload checkpoints act here."""


class FolderLogger(Logger):
    """A logger writing into ``<save_dir>/<name>/version_<n>/[<sub_dir>/]`` (n: the first unused, unless given).

    An empty (or None) ``name`` leaves out that level; ``~`` and ``$VARIABLES`` in the path are expanded.
    """

    def __init__(self, save_dir: str | os.PathLike | None = None, name: str | None = "logs",
                 version: int | str | None = None, *, root_dir: str | os.PathLike | None = None,
                 sub_dir: str | os.PathLike | None = None, prefix: str = "") -> None:
        self._save_dir = os.fspath(_one_dir(type(self).__name__, save_dir, root_dir))
        self._name = name or ""
        self._version = version
        self._version_given = version is not None
        self._claimed = False  # whether claim_version created the folder (or a resumed run's folder was given)
        self._sub_dir = None if sub_dir is None else os.fspath(sub_dir)
        self._prefix = prefix

    @property
    def name(self) -> str:
        return self._name

    @property
    def version(self) -> int | str:
        if self._version is None:  # a guess until claim_version, which a run calls before anything is written
            self._version = next_version(self._root())
        return self._version

    def _root(self) -> str:
        return os.path.expanduser(os.path.expandvars(self.root_dir))

    def claim_version(self) -> None:
        """Create this logger's version folder (global rank 0, before the first write), taking the next free
        number where another run has just taken the one guessed: two runs never share a version folder."""
        if self._version_given or self._claimed:
            return
        self._version = allocate_version(self._root())
        self._claimed = True

    @property
    def root_dir(self) -> str:
        """``<save_dir>/<name>``, the folder of the version folders (Lightning's Trainer loggers' meaning)."""
        return os.path.join(self.save_dir, self.name)

    @property
    def sub_dir(self) -> str | None:
        """The folder inside the version folder that the files go to, if one was given."""
        return self._sub_dir

    def agree_version(self, strategy: Any) -> None:
        # "the first unused version" differs between ranks once rank 0 has created its folder
        self._version = strategy.broadcast(self.version if strategy.is_global_zero else None)
        self._claimed = True

    def use_version_of(self, path: str | os.PathLike) -> bool:
        """Continue in the version folder that holds ``path`` (a checkpoint under ``<save_dir>/<name>/<version>/``).

        Returns whether it did: not when ``path`` lies elsewhere or the constructor was given a version.
        """
        if self._version_given:
            return False
        rel = os.path.relpath(os.path.abspath(path), os.path.abspath(os.path.join(self._save_dir, self._name)))
        folder = rel.split(os.sep)[0]
        if folder in (os.curdir, os.pardir) or folder == rel:
            return False
        match = re.fullmatch(r"version_(\d+)", folder)
        self._version = int(match.group(1)) if match else folder
        self._claimed = True
        return True

    @property
    def save_dir(self) -> str:
        return self._save_dir

    @property
    def log_dir(self) -> str:
        version = self.version
        path = os.path.join(self.root_dir, version if isinstance(version, str) else f"version_{version}")
        if self.sub_dir:
            path = os.path.join(path, self.sub_dir)
        return os.path.expanduser(os.path.expandvars(path))


def _one_dir(logger: str, save_dir: Any, root_dir: Any) -> Any:
    """``save_dir`` (the Trainer loggers' name) or ``root_dir`` (Fabric's name for the same folder): exactly one."""
    if (save_dir is None) == (root_dir is None):
        raise ConfigurationError(
            f"{logger} needs the folder to write into, given once: pass save_dir=... (or root_dir=..., Fabric's name "
            f"for it){'' if save_dir is None else ', not both'}."
        )
    return save_dir if root_dir is None else root_dir


class LoggedCheckpoints:
    """Which of a ModelCheckpoint's files a logger has uploaded (for ``log_model``), by path and modification time."""

    def __init__(self) -> None:
        self._seen: dict[str, float] = {}

    def new(self, callback: Any) -> list[tuple[str, list[str], float | None]]:
        """``(path, aliases, score)`` for each checkpoint of ``callback`` not uploaded yet in its current version.

        Aliases: "latest" for the newest file, "best" for the best model's. Paths that no longer exist
        (replaced top-k files) are left out.
        """
        found: dict[str, float | None] = {}
        for path, score in getattr(callback, "best_k_models", {}).items():
            found[path] = float(score)
        for attr in ("best_model_path", "last_model_path"):
            path = getattr(callback, attr, "")
            if path:
                found.setdefault(path, None)
        present = {p: os.path.getmtime(p) for p in found if os.path.exists(p)}
        latest = max(present, key=lambda p: present[p]) if present else None
        out = []
        for path, mtime in sorted(present.items(), key=lambda kv: kv[1]):
            if self._seen.get(path) == mtime:
                continue
            self._seen[path] = mtime
            aliases = [a for a, p in (("latest", latest), ("best", getattr(callback, "best_model_path", ""))) if p == path]
            out.append((path, aliases, found[path]))
        return out


class DummyExperiment:
    """What a rank-zero logger's ``experiment`` is on other ranks: every method call does nothing.

    Attributes, items and calls give the object itself, so chains such as ``experiment.config.update(...)``
    (wandb) or ``experiment.add_scalar(...)`` (TensorBoard) do nothing too.
    """

    def nop(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __getattr__(self, _: str) -> DummyExperiment:
        return self

    def __call__(self, *args: Any, **kwargs: Any) -> DummyExperiment:
        return self

    def __getitem__(self, _: Any) -> DummyExperiment:
        return self

    def __setitem__(self, key: Any, value: Any) -> None:
        pass


class DummyLogger(Logger):
    """What ``fast_dev_run`` puts in the loggers' place: it records nothing, and code that uses the logger
    (``self.logger.experiment.add_image(...)``, a method of one logger's API) runs unchanged, as in Lightning."""

    def __init__(self) -> None:
        self._experiment = DummyExperiment()

    @property
    def experiment(self) -> DummyExperiment:
        return self._experiment

    @property
    def name(self) -> str:
        return ""

    @property
    def version(self) -> str:
        return ""

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        """Records nothing."""

    def __getitem__(self, index: int) -> DummyLogger:
        return self  # self.logger[0].experiment..., as Lightning's

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):  # copy and pickle look for protocol methods: those are absent
            raise AttributeError(name)
        return lambda *args, **kwargs: None  # another logger's method (log_image, watch, ...): does nothing


def on_rank_zero() -> bool:
    from torchfleet.utilities import rank_zero_only

    return rank_zero_only.rank == 0


def rank_zero_experiment(fn: Callable[..., Any]) -> Callable[..., Any]:
    """For a logger's ``experiment`` property: the real object on global rank 0, a ``DummyExperiment`` elsewhere
    (``fn`` is not called there, so other ranks create no run)."""
    @functools.wraps(fn)
    def experiment(self: Any) -> Any:
        return fn(self) if on_rank_zero() else DummyExperiment()

    return experiment


class UploadsCheckpoints(Logger):
    """A logger that can upload ModelCheckpoint's files (``log_model``): False (none), True (once training has
    ended; at once with ``save_top_k=-1``, as Lightning), or "all" (each file as it is saved)."""

    def _init_uploads(self, log_model: bool | str) -> None:
        if log_model not in (True, False, "all"):
            raise ConfigurationError(
                f"{type(self).__name__}(log_model={log_model!r}) is not valid: give False, True (checkpoints after "
                "training) or 'all' (each checkpoint as it is saved)."
            )
        self._log_model = log_model
        self._checkpoint_callback: Any = None
        self._logged = LoggedCheckpoints()

    def _upload_checkpoint(self, path: str, aliases: list[str], score: float | None, callback: Any) -> None:
        raise NotImplementedError

    def _upload_new(self, callback: Any) -> None:
        for path, aliases, score in self._logged.new(callback):
            self._upload_checkpoint(path, aliases, score, callback)

    def after_save_checkpoint(self, checkpoint_callback: Any) -> None:
        if self._log_model == "all" or (self._log_model is True and getattr(checkpoint_callback, "save_top_k", 1) == -1):
            self._upload_new(checkpoint_callback)
        elif self._log_model is True:
            self._checkpoint_callback = checkpoint_callback

    def _upload_remembered(self) -> None:
        """At the end of training (``finalize``): upload what ``log_model=True`` held back."""
        if self._checkpoint_callback is not None and on_rank_zero():
            self._upload_new(self._checkpoint_callback)


def claim_versions(loggers: list[Any], strategy: Any) -> None:
    """Global rank 0 creates each folder logger's version folder (``FolderLogger.claim_version``) before a run writes."""
    if strategy.is_global_zero:
        for lg in loggers:
            if isinstance(lg, FolderLogger):
                lg.claim_version()


def agree_versions(loggers: list[Any], strategy: Any) -> None:
    """Make every rank's loggers name rank 0's version (a broadcast per logger: call it on every rank)."""
    for lg in loggers:
        lg.agree_version(strategy)


def use_versions(loggers: list[Any], versions: list[Any]) -> None:
    """Give ``loggers`` the ``versions`` rank 0's copies of them had (in the launching process, after ddp_spawn)."""
    for lg, version in zip(loggers, versions):
        lg.agree_version(_RankZeroSaid(version))


class _RankZeroSaid:
    """A stand-in strategy whose broadcast returns what rank 0 said in a run that has ended."""

    is_global_zero = False

    def __init__(self, value: Any) -> None:
        self.value = value

    def broadcast(self, obj: Any, src: int = 0, name: str | None = None) -> Any:
        return self.value


def save_loggers(loggers: list[Any]) -> None:
    """Flush each logger's buffered values (CSVLogger writes its rows every 100 steps otherwise)."""
    for lg in loggers:
        save = getattr(lg, "save", None)  # a logger of your own may have none
        if not callable(save):
            continue
        try:
            save()
        except Exception as exc:  # noqa: BLE001  (at exit: say which logger lost what, then go on with the others)
            logging.getLogger("torchfleet").warning("%s could not write its buffered values at exit: %s",
                                                    type(lg).__name__, exc)


#: the loggers torchfleet ships, for the error that names what is accepted
LOGGER_FORMS = ("a Logger object (e.g. CSVLogger(save_dir), TensorBoardLogger(save_dir), MLflowLogger(...), "
                "WandbLogger(...) from torchfleet.loggers, or a subclass of torchfleet.loggers.Logger)")


def check_loggers(value: Any, name: str, others: str, owner: str = "") -> list[Logger]:
    """``value`` (one Logger or several) as a list of Logger objects, or one paragraph naming ``name``; ``others``
    says what else the caller accepts (None, True, False)."""
    accepted = f"{name} takes {LOGGER_FORMS}, a list of them, {others}"
    if isinstance(value, (str, bytes)):
        raise not_valid(name, value, f"a logger is not named by a string. {accepted}", owner)
    given = list(value) if isinstance(value, Iterable) and not isinstance(value, Mapping) else [value]
    for lg in given:
        if not isinstance(lg, Logger):
            which = "it" if given == [value] else f"it holds {lg!r} of type {type(lg).__name__}, which"
            raise not_valid(name, value, f"{which} is not a Logger. {accepted}", owner)
    return given
