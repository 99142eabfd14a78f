"""Where a Lightning name lives in torchfleet: the tables and the resolver the port uses.

Used twice: by ``tools/port_lightning_tests.py`` while it rewrites the import lines of Lightning's tests, and
by the ported tests at run time (copied next to them as ``lightning_port_names.py``) for what cannot be
decided by reading an import line: ``import lightning.pytorch as pl`` followed by ``pl.Trainer``, a name
torchfleet lacks (a placeholder that fails when used, so the rest of the file still runs), and facts about
this machine that Lightning's tests read from Lightning's import flags (``_TORCH_GREATER_EQUAL_2_3``).
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
import types
from typing import Any

#: Lightning's top-level package names, as the two distributions spell them
ROOTS = {"pytorch_lightning": "lightning.pytorch", "lightning_fabric": "lightning.fabric", "lightning": "lightning"}

#: a Lightning module -> the torchfleet module that holds its public names. A submodule that is not listed maps
#: through its longest listed parent plus the rest of its path, where torchfleet has a module of that name.
MODULES = {
    "lightning": "torchfleet",
    "lightning.pytorch": "torchfleet",
    "lightning.pytorch.trainer": "torchfleet.trainer.trainer",
    "lightning.pytorch.trainer.trainer": "torchfleet.trainer.trainer",
    "lightning.pytorch.trainer.states": "torchfleet.trainer.states",
    "lightning.pytorch.trainer.connectors.accelerator_connector": "torchfleet.connector",
    "lightning.pytorch.core": "torchfleet.module",
    "lightning.pytorch.core.module": "torchfleet.module",
    "lightning.pytorch.core.hooks": "torchfleet.module",
    "lightning.pytorch.core.datamodule": "torchfleet.data",
    "lightning.pytorch.core.saving": "torchfleet.module",
    "lightning.pytorch.callbacks": "torchfleet.callbacks",
    "lightning.pytorch.callbacks.callback": "torchfleet.trainer.callbacks.base",
    "lightning.pytorch.callbacks.model_checkpoint": "torchfleet.trainer.callbacks.checkpoint",
    "lightning.pytorch.callbacks.early_stopping": "torchfleet.trainer.callbacks.early_stopping",
    "lightning.pytorch.callbacks.lr_monitor": "torchfleet.trainer.callbacks.lr_monitor",
    "lightning.pytorch.callbacks.timer": "torchfleet.trainer.callbacks.timer",
    "lightning.pytorch.callbacks.throughput_monitor": "torchfleet.trainer.callbacks.throughput",
    "lightning.pytorch.callbacks.model_summary": "torchfleet.trainer.callbacks.model_summary",
    "lightning.pytorch.callbacks.progress": "torchfleet.trainer.callbacks.progress",
    "lightning.pytorch.callbacks.progress.tqdm_progress": "torchfleet.trainer.callbacks.progress",
    "lightning.pytorch.callbacks.progress.rich_progress": "torchfleet.trainer.callbacks.rich_progress",
    "lightning.pytorch.loggers": "torchfleet.loggers",
    "lightning.pytorch.loggers.logger": "torchfleet.loggers.base",
    "lightning.pytorch.loggers.csv_logs": "torchfleet.loggers.csv",
    "lightning.pytorch.strategies": "torchfleet.strategies",
    "lightning.pytorch.strategies.strategy": "torchfleet.strategies.strategy",
    "lightning.pytorch.strategies.launchers": "torchfleet.launchers",
    "lightning.pytorch.accelerators": "torchfleet.accelerators",
    "lightning.pytorch.accelerators.accelerator": "torchfleet.accelerators.base",
    "lightning.pytorch.plugins": "torchfleet.plugins",
    "lightning.pytorch.plugins.precision": "torchfleet.precision",
    "lightning.pytorch.plugins.io": "torchfleet.checkpoint",
    "lightning.pytorch.plugins.environments": "torchfleet.environments",
    "lightning.pytorch.demos": "torchfleet.demos",
    "lightning.pytorch.demos.boring_classes": "torchfleet.demos",
    "lightning.pytorch.profilers": "torchfleet.profilers",
    "lightning.pytorch.profilers.profiler": "torchfleet.profilers.base",
    "lightning.pytorch.utilities": "torchfleet.utilities",
    "lightning.pytorch.utilities.rank_zero": "torchfleet.utilities",
    "lightning.pytorch.utilities.seed": "torchfleet.seed",
    "lightning.pytorch.utilities.exceptions": "torchfleet.errors",
    "lightning.pytorch.cli": "torchfleet.cli",
    "lightning.fabric": "torchfleet",
    "lightning.fabric.fabric": "torchfleet.fleet",
    "lightning.fabric.accelerators": "torchfleet.accelerators",
    "lightning.fabric.strategies": "torchfleet.strategies",
    "lightning.fabric.loggers": "torchfleet.loggers",
    "lightning.fabric.loggers.csv_logs": "torchfleet.loggers.csv",
    "lightning.fabric.plugins": "torchfleet.plugins",
    "lightning.fabric.plugins.precision": "torchfleet.precision",
    "lightning.fabric.plugins.io": "torchfleet.checkpoint",
    "lightning.fabric.plugins.environments": "torchfleet.environments",
    "lightning.fabric.plugins.environments.lightning": "torchfleet.environments.local",
    "lightning.fabric.utilities": "torchfleet.utilities",
    "lightning.fabric.utilities.seed": "torchfleet.seed",
    "lightning.fabric.utilities.rank_zero": "torchfleet.utilities",
    "lightning.fabric.utilities.exceptions": "torchfleet.errors",
    "lightning.fabric.utilities.device_parser": "torchfleet.accelerators.devices",
}

#: Lightning's name -> torchfleet's, where torchfleet chose another name on purpose
RENAMES = {
    "LightningModule": "Module",
    "LightningDataModule": "DataModule",
    "Fabric": "Fleet",
    "MisconfigurationException": "ConfigurationError",
    "LightningEnvironment": "LocalEnvironment",
    "ExperimentWriter": "CSVWriter",
    "_ExperimentWriter": "CSVWriter",
}

#: string constants the port rewrites: environment variables torchfleet names with its own prefix
ENV_RENAMES = {"PL_GLOBAL_SEED": "TF_GLOBAL_SEED", "PL_SEED_WORKERS": "TF_SEED_WORKERS"}

#: where a public name is looked for when its own module has no counterpart, in this order
DISCOVERY = (
    "torchfleet", "torchfleet.callbacks", "torchfleet.loggers", "torchfleet.strategies", "torchfleet.accelerators",
    "torchfleet.precision", "torchfleet.plugins", "torchfleet.plugins.environments", "torchfleet.environments",
    "torchfleet.checkpoint", "torchfleet.profilers", "torchfleet.demos", "torchfleet.seed", "torchfleet.utilities",
    "torchfleet.errors", "torchfleet.trainer.states",
)

#: Lightning's import flags that name a package: the flag's stem -> the package to look for
_PACKAGES = {"TENSORBOARDX": "tensorboardX", "TORCHVISION": "torchvision", "OMEGACONF": "omegaconf", "RICH": "rich",
             "TENSORBOARD": "tensorboard", "PSUTIL": "psutil", "SKLEARN": "sklearn", "TORCHMETRICS": "torchmetrics",
             "JSONARGPARSE": "jsonargparse", "JSONARGPARSE_SIGNATURES": "jsonargparse", "DEEPSPEED": "deepspeed", "HYDRA": "hydra", "MLFLOW": "mlflow",
             "WANDB": "wandb", "XLA": "torch_xla", "BITSANDBYTES": "bitsandbytes", "TORCHAO": "torchao"}
_VERSIONED = re.compile(r"_(?P<what>[A-Z]+)_GREATER_EQUAL_(?P<version>\d+(?:_\d+)*)$")
_AVAILABLE = re.compile(r"_(?P<what>[A-Z_]+?)_AVAILABLE$")


class PortGap(AttributeError):
    """A ported test used a Lightning name that torchfleet has no counterpart for.

    An AttributeError, so that introspection (``hasattr``, ``getattr(x, name, default)``, ``Mock(spec=...)``)
    treats the missing name as an object without attributes instead of failing where the test did not use it.
    """


def normalize(path: str) -> str:
    """``pytorch_lightning.x`` and ``lightning_fabric.x`` as ``lightning.pytorch.x`` / ``lightning.fabric.x``."""
    root, _, rest = path.partition(".")
    base = ROOTS.get(root, root)
    return f"{base}.{rest}" if rest else base


def is_lightning(path: str) -> bool:
    return path.partition(".")[0] in ROOTS


def _importable(module: str) -> types.ModuleType | None:
    try:
        return importlib.import_module(module)
    except ImportError:
        return None


def map_module(path: str) -> str | None:
    """The torchfleet module for the Lightning module ``path``, or None where torchfleet has none."""
    path = normalize(path)
    if path in MODULES:
        return MODULES[path]
    parts = path.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        parent = ".".join(parts[:cut])
        if parent in MODULES:
            candidate = ".".join([MODULES[parent], *parts[cut:]])
            return candidate if _importable(candidate) is not None else None
    return None


def fact(name: str) -> Any:
    """A Lightning import flag about this machine (a package's presence or version), or ``PortGap``'s sentinel."""
    if name == "_IS_WINDOWS":
        return sys.platform == "win32"
    if name == "_IS_INTERACTIVE":
        return hasattr(sys, "ps1")
    match = _VERSIONED.match(name)
    if match:
        what = match["what"]
        wanted = tuple(int(v) for v in match["version"].split("_"))
        if what == "PYTHON":
            return sys.version_info[: len(wanted)] >= wanted
        package = "torch" if what == "TORCH" else _PACKAGES.get(what)
        if package is None or importlib.util.find_spec(package) is None:
            return False if package else _NO_FACT
        from importlib.metadata import PackageNotFoundError, version

        try:
            have = version(package)
        except PackageNotFoundError:
            return False
        numbers = tuple(int(p) for p in re.findall(r"\d+", have.split("+")[0])[: len(wanted)])
        return numbers >= wanted
    match = _AVAILABLE.match(name)
    if match and match["what"] in _PACKAGES:
        return importlib.util.find_spec(_PACKAGES[match["what"]]) is not None
    return _NO_FACT


_NO_FACT = object()


def resolve(module: str, name: str) -> tuple[str, Any]:
    """How ``from <module> import <name>`` ports: ("object", (tf_module, tf_name)), ("module", tf_module),
    ("fact", value) or ("missing", lightning_path)."""
    module = normalize(module)
    full = f"{module}.{name}"
    if full in MODULES:
        return "module", MODULES[full]
    value = fact(name)
    if value is not _NO_FACT:
        return "fact", value
    wanted = RENAMES.get(name, name)
    target = map_module(module)
    found = _importable(target) if target else None
    if found is not None and hasattr(found, wanted):
        return "object", (target, wanted)
    if not name.startswith("_"):
        for candidate in DISCOVERY:
            found = _importable(candidate)
            if found is not None and hasattr(found, wanted):
                return "object", (candidate, wanted)
    submodule = map_module(full)
    if submodule is not None:
        return "module", submodule
    return "missing", full


#: the missing names the running test used (the record plugin empties it before each test and reports it)
TOUCHED: list[str] = []


class _MissingMeta(type):
    """Every use of a missing name (reading from it, testing it) raises ``PortGap``.

    Calling it gives a placeholder object rather than raising, so that a parametrize list that builds one
    (``[TorchSyncBatchNorm()]``) does not stop the whole file from being collected; using that object raises.
    """

    _path: str

    def _gap(cls) -> PortGap:
        TOUCHED.append(cls._path)
        return PortGap(f"torchfleet has no counterpart of {cls._path}")

    def __call__(cls, *args: Any, **kwargs: Any) -> Any:
        return _MissingObject(cls._path)

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise cls._gap()

    def __bool__(cls) -> bool:
        raise cls._gap()

    def __iter__(cls) -> Any:
        # a missing constant used as a parametrize list: one placeholder value, so the test runs and fails on it
        return iter([_MissingObject(cls._path)])

    def __instancecheck__(cls, instance: Any) -> bool:
        raise cls._gap()

    def __subclasscheck__(cls, subclass: type) -> bool:
        raise cls._gap()


class _MissingObject:
    """What calling a missing name returns: any attribute read raises ``PortGap``."""

    def __init__(self, path: str) -> None:
        object.__setattr__(self, "_path", path)
        TOUCHED.append(path)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise PortGap(f"torchfleet has no counterpart of {self._path}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise PortGap(f"torchfleet has no counterpart of {self._path}")

    def __repr__(self) -> str:
        return f"<missing in torchfleet: {self._path}()>"


def missing(path: str) -> type:
    """A placeholder class for the Lightning name ``path``: defining the file works, using the name raises."""
    return _MissingMeta(path.rsplit(".", 1)[-1], (), {"_path": path})


class Namespace(types.ModuleType):
    """``import lightning.pytorch as pl``: attributes resolve as ``from lightning.pytorch import <name>`` would.

    A subpackage is another Namespace (``lightning.fabric.plugins.environments.mpi`` maps through its own path,
    not through ``torchfleet.plugins``'s attributes); setting an attribute (``monkeypatch.setattr``) sets it on the
    torchfleet module the path maps to.
    """

    def __init__(self, path: str) -> None:
        super().__init__(normalize(path))

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        kind, value = resolve(self.__name__, name)
        if kind == "object":
            return getattr(importlib.import_module(value[0]), value[1])
        if kind == "module":
            return Namespace(f"{self.__name__}.{name}")
        if kind == "fact":
            return value
        # a lower-case name is a subpackage: keep the path, so the name finally used is the one reported
        return Namespace(value) if name[:1].islower() else missing(value)

    def __setattr__(self, name: str, value: Any) -> None:
        if name.startswith("__"):
            super().__setattr__(name, value)
            return
        target = map_module(self.__name__)
        if target is None:
            raise PortGap(f"torchfleet has no counterpart of {self.__name__} (to set {name} on)")
        setattr(importlib.import_module(target), RENAMES.get(name, name), value)

    def __delattr__(self, name: str) -> None:
        target = map_module(self.__name__)
        if target is None or name.startswith("__"):
            super().__delattr__(name)
            return
        delattr(importlib.import_module(target), RENAMES.get(name, name))


def namespace(path: str) -> Namespace:
    return Namespace(path)


def map_dotted(text: str) -> str | None:
    """A dotted Lightning path in a string (``mock.patch("lightning.pytorch.x.Y.z")``) as torchfleet's, or None."""
    parts = normalize(text).split(".")
    for cut in range(len(parts), 0, -1):
        target = map_module(".".join(parts[:cut]))
        if target is not None and _importable(target) is not None:
            rest = [RENAMES.get(p, p) for p in parts[cut:]]
            return ".".join([target, *rest])
    return None
