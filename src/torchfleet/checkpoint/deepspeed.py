"""The "deepspeed" layout of sharded checkpoints: DeepSpeed's engine checkpoint beside torchfleet.pt; consolidation.

A checkpoint directory holds DeepSpeed's engine checkpoint under ``deepspeed/<tag>/`` and our
``torchfleet.pt`` (written by torchfleet.checkpoint.distributed.write_meta) with everything else,
including a ``"deepspeed"`` entry: the world size and ZeRO stage it was written with, its tag, and
which checkpoint entries (modules, optimizers) the engine checkpoint stands for. While saving and
after reading, those entries are ``InEngine`` placeholders.

The engine writes and reloads its own files (DeepSpeedStrategy does that); what is read here needs
one process and no engine: the float32 weights (DeepSpeed's ``get_fp32_state_dict_from_zero_checkpoint``)
and the optimizer state whole (torchfleet.checkpoint.zero: any torch optimizer, every state key),
which is how ``consolidate_deepspeed`` writes one ordinary checkpoint and how a run at another
world size or stage resumes.
"""

from __future__ import annotations

import contextlib
import io
import logging
import os
import sys
from collections.abc import Callable, Iterator, Mapping
from typing import Any

from torch import Tensor

from torchfleet.checkpoint import safe
from torchfleet.checkpoint.distributed import (
    Ranks,
    atomic_checkpoint_dir,
    checkpoint_layout,
    is_sharded_checkpoint,
    read_meta,
    sharded_marker,
    write_meta,
)
from torchfleet.checkpoint.schema import FORMAT_KEY, FORMAT_VERSION
from torchfleet.checkpoint.zero import (
    FullOptimizerState,
    check_engine_files,
    engine_globals,
    has_zero_files,
    read_zero_optimizer,
    strip_wrapper,
)
from torchfleet.errors import CheckpointError, ConfigurationError

log = logging.getLogger(__name__)

#: the engine's checkpoint lives in this subdirectory of a "deepspeed" layout checkpoint
DEEPSPEED_SUBDIR = "deepspeed"
#: the engine checkpoint's tag (its directory name under DEEPSPEED_SUBDIR); one tag per checkpoint directory
CHECKPOINT_TAG = "checkpoint"
#: the meta entry describing the engine checkpoint (world size, stage, tag, which entries it holds)
META_DEEPSPEED_KEY = "deepspeed"
#: DeepSpeed's own universal-checkpoint converter (ds_to_universal, Adam-family only) needs this marker in checkpoints
#: of stages 1-2; written so that users can still run it, though torchfleet reads the ZeRO files itself
UNIVERSAL_INFO = {"universal_checkpoint_info": {"universal_checkpoint_version": 0.4}}
#: how to install the optional dependency
INSTALL_HINT = 'pip install "torchfleet[deepspeed]"'

_MODEL_STATES = "mp_rank_00_model_states.pt"


# ---------------------------------------------------------------------------- the optional dependency
def deepspeed_available() -> bool:
    """Whether ``import deepspeed`` can work here (cheap: nothing is imported)."""
    if "deepspeed" in sys.modules:
        return sys.modules["deepspeed"] is not None
    import importlib.util

    return importlib.util.find_spec("deepspeed") is not None


def not_installed(what: str) -> ConfigurationError:
    """The error for ``what`` needing deepspeed where it is not installed."""
    return ConfigurationError(
        f"{what} needs the deepspeed package, which is not installed in this Python environment. Install it with "
        f"`{INSTALL_HINT}` (or `pip install deepspeed`); on CPU-only machines it works with gloo, no GPU needed."
    )


def import_deepspeed(what: str = "DeepSpeedStrategy") -> Any:
    """``import deepspeed``, or a ConfigurationError that says how to install it."""
    if not deepspeed_available():
        raise not_installed(what)
    try:
        import deepspeed
    except ImportError as exc:
        raise ConfigurationError(
            f"{what} could not import deepspeed ({exc}). Reinstall it with `{INSTALL_HINT}`."
        ) from exc
    return deepspeed


@contextlib.contextmanager
def quiet_deepspeed() -> Iterator[None]:
    """DeepSpeed's checkpoint tools print progress to stdout/stderr; keep it in the debug log instead."""
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            yield
    finally:
        text = (out.getvalue() + err.getvalue()).strip()
        if text:
            log.debug("DeepSpeed said:\n%s", text)


# ---------------------------------------------------------------------------- layout
class InEngine(dict):
    """Stands in a checkpoint dict for a module's or optimizer's state that lives in the DeepSpeed engine checkpoint.

    An empty mapping, so hooks that look at ``checkpoint["state_dict"]`` still find a dict; ``path``
    says which checkpoint directory the engine loads it from (None while saving), ``weights_only``
    whether its files are read without running code from them (the load's choice).
    """

    def __init__(self, kind: str, path: str | None = None, weights_only: bool = True) -> None:
        super().__init__()
        self.kind = kind
        self.path = path
        self.weights_only = weights_only

    def __repr__(self) -> str:
        return f"<{self.kind} state in the DeepSpeed engine checkpoint{'' if self.path is None else ' ' + self.path}>"


def is_deepspeed_checkpoint(path: str | os.PathLike, weights_only: bool = True) -> bool:
    """Whether ``path`` is a complete sharded checkpoint directory of the "deepspeed" layout."""
    return is_sharded_checkpoint(path) and checkpoint_layout(path, weights_only) == "deepspeed"


def _is_optimizer_marker(value: Any) -> bool:
    if isinstance(value, InEngine):
        return value.kind == "optimizer"
    return isinstance(value, list) and bool(value) and all(
        isinstance(v, InEngine) and v.kind == "optimizer" for v in value)


def save_deepspeed_checkpoint(
    path: str | os.PathLike, plain: Mapping[str, Any], ranks: Ranks, engine_info: Mapping[str, Any],
    save_engine: Callable[..., Any],
) -> None:
    """Write ``plain`` (modules and optimizers already ``InEngine`` placeholders) as a "deepspeed" directory at ``path``.

    Every rank calls it; ``save_engine`` is the engine's ``save_checkpoint``, called on every rank with the
    engine directory, ``tag`` and ``client_state``. ``engine_info`` (world_size, zero_stage, half,
    param_names) goes into the meta entry that says how the engine checkpoint was written.
    """
    modules = [k for k, v in plain.items() if isinstance(v, InEngine) and v.kind == "module"]
    optimizers = {k: (len(v) if isinstance(v, list) else None) for k, v in plain.items() if _is_optimizer_marker(v)}
    meta = {k: v for k, v in plain.items() if k not in modules and k not in optimizers}
    meta[FORMAT_KEY] = sharded_marker("deepspeed")
    meta[META_DEEPSPEED_KEY] = {"tag": CHECKPOINT_TAG, **engine_info, "modules": modules, "optimizers": optimizers}
    with atomic_checkpoint_dir(path, ranks) as tmp:
        # every rank writes its own partition files; DeepSpeed synchronises the ranks inside
        save_engine(os.path.join(tmp, DEEPSPEED_SUBDIR), tag=CHECKPOINT_TAG, client_state=dict(UNIVERSAL_INFO))
        if ranks.is_global_zero:
            write_meta(tmp, meta)


def deepspeed_info(meta: Mapping[str, Any], path: Any) -> dict[str, Any]:
    """The meta entry of a "deepspeed" checkpoint that says how its engine checkpoint was written."""
    info = meta.get(META_DEEPSPEED_KEY)
    if not isinstance(info, Mapping) or "tag" not in info:
        raise CheckpointError(
            f"{os.fspath(path)!r} is marked as a DeepSpeed checkpoint but its {META_DEEPSPEED_KEY!r} entry, which says "
            "how the engine checkpoint was written, is missing. The checkpoint was not written by DeepSpeedStrategy; "
            "resume from one that was."
        )
    return dict(info)


def read_deepspeed_checkpoint(path: str | os.PathLike, weights_only: bool = True) -> dict[str, Any]:
    """The checkpoint dict of a "deepspeed" directory: its meta, with placeholders for what the engine checkpoint holds."""
    meta = read_meta(path, weights_only)
    info = deepspeed_info(meta, path)
    checkpoint = dict(meta)
    where = os.fspath(path)
    for key in info.get("modules", []):
        checkpoint[key] = InEngine("module", where, weights_only)
    for key, count in info.get("optimizers", {}).items():
        checkpoint[key] = InEngine("optimizer", where, weights_only) if count is None else [
            InEngine("optimizer", where, weights_only) for _ in range(count)]
    return checkpoint


def engine_entry(checkpoint: Mapping[str, Any]) -> InEngine:
    """A placeholder of a checkpoint dict read by ``read_deepspeed_checkpoint``: where it came from, how to read it."""
    for value in checkpoint.values():
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, InEngine) and v.path is not None:
                return v
    raise CheckpointError("The checkpoint dict does not say which DeepSpeed checkpoint directory it came from.")


# ---------------------------------------------------------------------------- reading whole, in one process
def consolidated_weights(path: str | os.PathLike, info: Mapping[str, Any] | None = None,
                         weights_only: bool = True) -> dict[str, Tensor]:
    """The float32 weights of a "deepspeed" checkpoint under the user module's names (one process, any stage)."""
    if info is None:
        info = deepspeed_info(read_meta(path, weights_only), path)
    import_deepspeed("Reading a DeepSpeed checkpoint")
    ds_dir = os.path.join(os.fspath(path), DEEPSPEED_SUBDIR)
    tag_dir = os.path.join(ds_dir, info["tag"])
    if not os.path.isdir(tag_dir):
        raise CheckpointError(f"{os.fspath(path)!r} lacks the engine checkpoint {tag_dir!r}: the directory is incomplete.")
    if int(info.get("zero_stage", 0)) == 0 and not has_zero_files(tag_dir):
        # no ZeRO: the model-states file holds the whole module
        module = _read_model_states(tag_dir, weights_only)["module"]
        return {k: v.float() if v.is_floating_point() else v for k, v in _strip_wrapper(module).items()}
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    check_engine_files(tag_dir, weights_only)  # DeepSpeed's reader unpickles them with weights_only=False
    with quiet_deepspeed():
        state = get_fp32_state_dict_from_zero_checkpoint(ds_dir, tag=info["tag"])
    return {k: v.clone() for k, v in _strip_wrapper(state).items()}


def _strip_wrapper(state: Mapping[str, Any]) -> dict[str, Any]:
    return {strip_wrapper(k): v for k, v in state.items()}


def _read_model_states(tag_dir: str, weights_only: bool) -> dict[str, Any]:
    return safe.load(os.path.join(tag_dir, _MODEL_STATES), weights_only=weights_only,
                     allow=engine_globals() if weights_only else ())


def read_full_optimizer(path: str | os.PathLike, info: Mapping[str, Any], weights_only: bool = True) -> FullOptimizerState:
    """The ZeRO optimizer partitions of a "deepspeed" checkpoint, whole and per parameter (one process)."""
    tag_dir = os.path.join(os.fspath(path), DEEPSPEED_SUBDIR, info["tag"])
    if not os.path.isdir(tag_dir):
        raise CheckpointError(f"{os.fspath(path)!r} lacks the engine checkpoint {tag_dir!r}: the directory is incomplete.")
    return read_zero_optimizer(tag_dir, weights_only)


def consolidated_optimizer_state(path: str | os.PathLike, info: Mapping[str, Any],
                                 weights_only: bool = True) -> dict[str, Any]:
    """The optimizer state of a "deepspeed" checkpoint in ``torch.optim.Optimizer.state_dict()`` form (one process).

    Any torch optimizer: every state key is mapped back onto the parameters. They are numbered as
    the user's optimizer held them (recorded at save time; frozen parameters included, without
    state), or, for checkpoints without that record, in the order ZeRO flattened them.
    """
    tag_dir = os.path.join(os.fspath(path), DEEPSPEED_SUBDIR, info["tag"])
    if int(info.get("zero_stage", 0)) == 0 and not has_zero_files(tag_dir):
        # no ZeRO: DeepSpeed saved the torch optimizer's own state dict
        return _read_model_states(tag_dir, weights_only)["optimizer"]
    return read_full_optimizer(path, info, weights_only).to_torch(info.get("param_names"))


def consolidate_deepspeed(path: str | os.PathLike, with_optimizer: bool = False,
                          weights_only: bool = True) -> dict[str, Any]:
    """One torchfleet checkpoint dict from a "deepspeed" layout checkpoint directory, in this one process.

    ``state_dict`` holds the float32 weights under the user module's names (any ZeRO stage, any
    world size it was written with); with ``with_optimizer`` also ``optimizer_states`` in
    ``torch.optim`` form (any torch optimizer, every state key), so the result resumes under any strategy.
    """
    import_deepspeed("Consolidating a DeepSpeed checkpoint")
    if not is_deepspeed_checkpoint(path, weights_only):
        raise CheckpointError(
            f"{os.fspath(path)!r} is not a DeepSpeed checkpoint directory (one holding a torchfleet.pt that names the "
            "'deepspeed' layout, written by DeepSpeedStrategy). Give the path of such a directory."
        )
    meta = read_meta(path, weights_only)
    info = deepspeed_info(meta, path)
    out = {k: v for k, v in meta.items() if k != META_DEEPSPEED_KEY}
    marker = dict(meta.get(FORMAT_KEY, {}))
    marker.pop("layout", None)
    marker["format"] = FORMAT_VERSION
    out[FORMAT_KEY] = marker
    weights = consolidated_weights(path, info, weights_only)
    for key in info.get("modules", []):
        out[key] = weights
    optimizer = consolidated_optimizer_state(path, info, weights_only) if with_optimizer else None
    for key, count in info.get("optimizers", {}).items():
        if optimizer is not None:
            out[key] = optimizer if count is None else [optimizer]
    return out
