"""What a Trainer checkpoint holds, and putting it back: weights, optimizers, schedulers, loop position, RNG."""

from __future__ import annotations

import contextlib
import glob
import logging
import os
import re
import warnings
from typing import TYPE_CHECKING, Any

from torchfleet.checkpoint.distributed import META_NAME
from torchfleet.checkpoint.format import FORMAT_KEY, FORMAT_VERSION, check_checkpoint
from torchfleet.checkpoint.hparams import to_plain
from torchfleet.errors import CheckpointError
from torchfleet.preemption import RESTART_VARIABLES, is_restart
from torchfleet.seed import capture_rng
from torchfleet.trainer import runs
from torchfleet.trainer.preemption import preemption_checkpoint_path

if TYPE_CHECKING:
    from torchfleet.trainer.loop_trainer import LoopTrainer

log = logging.getLogger("torchfleet")


def dump_checkpoint(trainer: LoopTrainer, weights_only: bool = False) -> dict[str, Any]:
    """The checkpoint dict of the current run, modules and optimizers already turned into state dicts.

    As Lightning's: the strategy's ``lightning_module_state_dict()``, then ``optimizer_state(optimizer)`` for each
    optimizer, then the Callbacks' and the Module's ``on_save_checkpoint``.
    """
    import torchfleet

    module = trainer.module
    strategy = trainer.strategy
    run = trainer.state.state_dict()
    plain: dict[str, Any] = {
        FORMAT_KEY: {"version": torchfleet.__version__, "format": FORMAT_VERSION},
        "epoch": run["epoch"],
        "global_step": run["global_step"],
        "state_dict": strategy.lightning_module_state_dict(),
        "hyper_parameters": _plain_hparams(module),
        "run_id": runs.run_id(),  # which run wrote it (trainer/runs.py): "last" checks it when it reads the file
    }
    state = plain
    if not weights_only:
        state["optimizer_states"] = [strategy.optimizer_state(o) for o in trainer.optimizers]
        state["lr_schedulers"] = [c.scheduler.state_dict() for c in trainer.lr_scheduler_configs]
        state["loops"] = run["loops"]
        state["callbacks"] = {cb.state_key: cb.state_dict() for cb in trainer.callbacks if cb.state_dict()}
        state["precision"] = trainer.strategy.precision.state_dict()
        trainer.strategy.precision.on_save_checkpoint(state)
        state["rng"] = capture_rng()
        if trainer.datamodule is not None:
            state["datamodule"] = trainer.datamodule.state_dict()
    if not weights_only:
        for cb in trainer.callbacks:
            cb.on_save_checkpoint(trainer, module, plain)
    module.on_save_checkpoint(plain)
    return plain


def _plain_hparams(module: Any) -> dict[str, Any]:
    """The module's hyperparameters in the plain form that safe loading reads back (torchfleet.checkpoint.hparams)."""
    pickled: list[str] = []
    plain = to_plain(dict(module.hparams), pickled)
    if pickled:
        warnings.warn(
            f"{type(module).__name__}'s hyperparameters {', '.join(pickled[:4])}{' ...' if len(pickled) > 4 else ''} "
            "are saved pickled: loading the checkpoint refuses them unless it is given weights_only=False or their "
            "classes are allowed with torch.serialization.add_safe_globals. Pass plain values, enums, dataclasses, "
            "paths, or classes and functions defined at a module's top level (and partials of them) instead, or "
            "leave them out with save_hyperparameters(ignore=[...]).", UserWarning, stacklevel=4)
    return plain


def _complete_checkpoints(folder: str) -> list[str]:
    """The finished checkpoints in ``folder`` (not below it): ``*.ckpt`` files, and directories holding their metadata.

    A save in progress or cut short leaves only hidden names (``.x.ckpt.tmp-*``, ``.x.ckpt.partial``),
    which glob does not return; a sharded directory counts once its metadata, written last, is there.
    """
    found = []
    for path in glob.glob(os.path.join(glob.escape(folder), "*.ckpt")):
        if os.path.isfile(path) or os.path.isfile(os.path.join(path, META_NAME)):
            found.append(path)
    return found


def checkpoint_folders(trainer: LoopTrainer) -> list[str]:
    """The folders torchfleet itself writes this run's checkpoints into, where "last" and a restart look.

    Each ModelCheckpoint's dirpath; the preemption checkpoint's folder; and, for a ModelCheckpoint in the
    logger's version folder (its default), the ``checkpoints`` folders of the logger's other versions, since
    a restarted run logs to a new version. Never a search below default_root_dir, which may hold anyone's files.
    """
    folders = [os.path.dirname(preemption_checkpoint_path(trainer))]
    default = os.path.join(trainer.log_dir, "checkpoints")
    for cb in trainer.checkpoint_callbacks:
        folders.append(cb.dirpath or default)
    if os.path.normpath(trainer.log_dir) != os.path.normpath(trainer.default_root_dir) and default in folders:
        versions = os.path.dirname(os.path.normpath(trainer.log_dir))
        with contextlib.suppress(OSError):
            folders += [os.path.join(e.path, "checkpoints") for e in os.scandir(versions) if e.is_dir()]
    return list(dict.fromkeys(os.path.normpath(f) for f in folders))


def find_last_checkpoint(trainer: LoopTrainer) -> tuple[str | None, str | None]:
    """The checkpoint ``ckpt_path="last"`` (and a restart) means, and the run it belongs to (None: unrecorded).

    The newest complete one, by modification time, in ``checkpoint_folders`` (``preempted.ckpt``, ``last.ckpt``
    and ModelCheckpoint's files alike; on a tie ``last.ckpt`` and ``preempted.ckpt`` (or their ``-vN`` names) win)
    among this run's own files (each holds its run id: trainer/runs.py), whatever other runs wrote there meanwhile.
    A process that has saved none there (a new run resuming an old one) takes the newest of all, and says so when
    several runs wrote into those folders.
    """
    folders = checkpoint_folders(trainer)
    candidates = sorted({c for folder in folders for c in _complete_checkpoints(folder)})
    if not candidates:
        return None, None
    mine = runs.run_id()

    def newest(path: str) -> tuple[float, bool]:
        try:
            mtime = os.path.getmtime(path)
        except OSError:  # removed while we looked (another run's top-k)
            mtime = -1.0
        return mtime, re.fullmatch(r"(last|preempted)(-v\d+)?\.ckpt", os.path.basename(path)) is not None

    ordered = sorted(candidates, key=newest, reverse=True)  # newest first; a tie keeps the sorted names' order
    claimed: dict[str, str | None] = {}
    for path in ordered:  # each read costs a few milliseconds (mmap): stop at this run's newest
        claimed[path] = runs.owner_of(path)
        if claimed[path] == mine:
            return path, mine
    found = ordered[0]
    owner = claimed[found]
    others = set(claimed.values()) - {owner}
    if others:
        log.warning(
            "ckpt_path='last': this process has saved no checkpoint in %s, and %d runs have: it resumes %s, the "
            "newest (run %s), and continues that run. Pass ckpt_path=<file> to resume another run.",
            ", ".join(folders), len(others) + 1, found, owner or "unrecorded")
    return found, owner


def resolve_ckpt_path(trainer: LoopTrainer, ckpt_path: Any, stage: str) -> str | None:
    """Turn ``ckpt_path`` ("best", "last", a path or None) into a file path; CheckpointError for a missing file.

    In fit, None on a restarted run (``auto_resume``) means "last". All ranks get global rank 0's choice.
    """
    if ckpt_path is None:
        if stage != "fit" or not trainer.auto_resume or not is_restart():
            return None
        found = _agree_on_last(trainer, stage)
        if trainer.is_global_zero:
            restart = ", ".join(f"{v}={os.environ[v]}" for v in RESTART_VARIABLES if os.environ.get(v))
            if found is None:
                log.info("This run is a restart (%s) but no checkpoint was found in %s: fit starts from the "
                         "beginning.", restart, ", ".join(checkpoint_folders(trainer)))
            else:
                log.info("This run is a restart (%s): resuming from %s, the newest complete checkpoint "
                         "(Trainer(auto_resume=False) turns this off).", restart, found)
        return found
    if ckpt_path == "best":
        ck = trainer.checkpoint_callback
        if ck is None or not ck.best_model_path:
            raise CheckpointError(
                f"ckpt_path='best' needs a ModelCheckpoint that has saved a checkpoint in this Trainer, and there is "
                f"none yet. Run fit first, or pass the path of a checkpoint to {stage}."
            )
        return ck.best_model_path
    if ckpt_path == "last":
        found = _agree_on_last(trainer, stage)
        if found is not None and trainer.is_global_zero:
            log.info("ckpt_path='last' is %s.", found)
        if found is None:
            log.warning(
                "ckpt_path='last' found no checkpoint in %s; %s starts from the model as it is.",
                ", ".join(checkpoint_folders(trainer)), stage,
            )
        return found
    path = os.fspath(ckpt_path)
    if not os.path.exists(path):
        parent = os.path.dirname(os.path.abspath(path))
        near = sorted(glob.glob(os.path.join(parent, "*.ckpt")))[:5] if os.path.isdir(parent) else []
        listing = f" Checkpoints in {parent}: {', '.join(os.path.basename(n) for n in near)}." if near else ""
        raise CheckpointError(
            f"ckpt_path={path!r} does not exist.{listing} Pass the path of a file written by ModelCheckpoint or "
            "trainer.save_checkpoint, or ckpt_path='last' to resume from the newest one."
        )
    return path


def _agree_on_last(trainer: LoopTrainer, stage: str) -> str | None:
    """Global rank 0's ``find_last_checkpoint`` on every rank; a fit resuming another run's file continues that run."""
    found, owner = trainer.strategy.broadcast(find_last_checkpoint(trainer) if trainer.is_global_zero else None)
    if found is not None and owner is not None:
        if stage == "fit":
            runs.continue_run(owner)
        runs.remember_choice(found, owner)
    return found


def restore_before_setup(trainer: LoopTrainer, path: str | None, full: bool, weights_only: bool | None) -> dict[str, Any] | None:
    """Lightning's first restore point, before ``Strategy.setup``: the module (and, in fit, the callbacks) from
    ``path``, unless the strategy's ``restore_checkpoint_after_setup`` says after. Returns the checkpoint read."""
    if trainer.strategy.restore_checkpoint_after_setup or path is None:
        return None
    return _restore_module(trainer, path, full, weights_only)


def restore_after_setup(trainer: LoopTrainer, path: str | None, checkpoint: dict[str, Any] | None, full: bool,
                        weights_only: bool | None) -> None:
    """Lightning's second restore point, after ``setup`` and ``on_fit_start``: the module when the strategy
    restores after setup (sharded ones), then, in fit (``full``), the training state (``restore_training_state``)."""
    if trainer.strategy.restore_checkpoint_after_setup and path is not None:
        checkpoint = _restore_module(trainer, path, full, weights_only)
    if full and checkpoint is not None:
        assert path is not None
        restore_training_state(trainer, checkpoint, path)


def _restore_module(trainer: LoopTrainer, path: str, full: bool, weights_only: bool | None) -> dict[str, Any]:
    """``load_checkpoint``, the Module's ``on_load_checkpoint``, ``load_model_state_dict``; in fit, the callbacks'
    ``on_load_checkpoint`` and states and the DataModule's state (``weights_only``: see Strategy.load_checkpoint)."""
    strategy = trainer.strategy
    checkpoint = check_checkpoint(strategy.load_checkpoint(path, weights_only=weights_only), path,
                                  strategy.resolve_weights_only(weights_only))
    runs.check_chosen(path, checkpoint)
    if full and "optimizer_states" not in checkpoint:
        raise CheckpointError(
            f"{path!r} holds weights only (saved with weights_only=True): it cannot resume training. Load the "
            "weights with Module.load_from_checkpoint and call fit without ckpt_path."
        )
    module = trainer.module
    module.on_load_checkpoint(checkpoint)
    strategy.load_model_state_dict(checkpoint, strict=module.strict_loading)
    if not full:
        return checkpoint
    for cb in trainer.callbacks:
        cb.on_load_checkpoint(trainer, module, checkpoint)
    saved_cbs = checkpoint.get("callbacks", {})
    for cb in trainer.callbacks:
        if cb.state_key in saved_cbs:
            cb.load_state_dict(saved_cbs[cb.state_key])
    missing = [key for key in saved_cbs if key not in {cb.state_key for cb in trainer.callbacks}]
    if missing and trainer.is_global_zero:
        # "Please add the following callbacks: [...]" is Lightning's phrase, kept for ported warning filters
        warnings.warn(
            f"{path} holds the state of callbacks this Trainer does not have, so that state is not restored. Be "
            "aware that when using `ckpt_path`, callbacks used to create the checkpoint need to be provided during "
            f"`Trainer` instantiation. Please add the following callbacks: {missing!r}.", stacklevel=2,
        )
    if trainer.datamodule is not None and "datamodule" in checkpoint:
        trainer.datamodule.load_state_dict(checkpoint["datamodule"])
    return checkpoint


def restore_training_state(trainer: LoopTrainer, checkpoint: dict[str, Any], path: str) -> None:
    """What a fit resumes with besides the module: optimizers and schedulers (unless the strategy's
    ``lightning_restore_optimizer`` says it restores them), the precision's state and the loops' position."""
    strategy = trainer.strategy
    if strategy.lightning_restore_optimizer:
        strategy.load_optimizer_state_dict(checkpoint)
        saved_scheds = checkpoint.get("lr_schedulers", [])
        if len(saved_scheds) != len(trainer.lr_scheduler_configs):
            raise CheckpointError(
                f"{path!r} holds {len(saved_scheds)} LR scheduler states but configure_optimizers() returned "
                f"{len(trainer.lr_scheduler_configs)} schedulers."
            )
        for config, sched_state in zip(trainer.lr_scheduler_configs, saved_scheds):
            config.scheduler.load_state_dict(sched_state)
    strategy.precision.on_load_checkpoint(checkpoint)
    if checkpoint.get("precision"):  # as Lightning: a precision that saved no state is not asked to load one
        strategy.precision.load_state_dict(checkpoint["precision"])
    trainer.state.load_state_dict(checkpoint)
