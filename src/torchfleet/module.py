"""Module: the user's model — an nn.Module with training hooks and ``self.log``.

Hook names and signatures follow PyTorch Lightning's LightningModule, so a LightningModule
ports by changing its imports and its base class.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from torchfleet.collectives import UserCollectives
from torchfleet.compiled import jit_scanning
from torchfleet.errors import CheckpointError, ConfigurationError
from torchfleet.hparams import AttributeDict, HyperparametersMixin
from torchfleet.module_export import ModuleExport
from torchfleet.precision import CLIP_HOOKS
from torchfleet.precision import user_overrides as precision_overrides
from torchfleet.running import LoopDoor
from torchfleet.utilities.enums import GradClipAlgorithmType

if TYPE_CHECKING:
    from torchfleet.running import FleetRunner, ModuleRunner

log = logging.getLogger(__name__)


class Module(nn.Module, HyperparametersMixin, ModuleExport, UserCollectives):
    """A model plus what the Trainer needs to train it: steps, optimizers, hooks and logging.

    The Trainer or Fleet running it reaches it only through its public names and its ``loop_door``
    (torchfleet/running.py); it asks them only what ``ModuleRunner`` and ``FleetRunner`` name.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer: ModuleRunner | None = None
        self._fleet: FleetRunner | None = None
        self._door = LoopDoor()
        self._hparams: AttributeDict = AttributeDict()
        self._hparams_initial: AttributeDict = AttributeDict()
        self.automatic_optimization: bool = True
        self.example_input_array: Any = None
        self._strict_loading: bool | None = None

    # ------------------------------------------------------------------ steps
    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return super().forward(*args, **kwargs)

    def training_step(self, *args: Any, **kwargs: Any) -> Tensor | Mapping[str, Any] | None:
        """Compute and return the loss for one batch (or a dict with "loss", or None to skip the batch)."""
        raise ConfigurationError(
            f"{type(self).__name__} does not define training_step(self, batch, batch_idx), which Trainer.fit "
            "needs. Define it to return the loss tensor."
        )

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        """Evaluate one validation batch (log metrics with self.log)."""

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        """Evaluate one test batch."""

    def predict_step(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> Any:
        """Return the prediction for one batch; default: ``self(batch)``."""
        return self(batch)

    def configure_optimizers(self) -> Any:
        """Return an optimizer; (optimizers, schedulers); or a dict with "optimizer" and "lr_scheduler"."""
        raise ConfigurationError(
            f"{type(self).__name__} does not define configure_optimizers(), which Trainer.fit needs. Return an "
            "optimizer, e.g. torch.optim.AdamW(self.parameters(), lr=1e-3)."
        )

    def configure_model(self) -> None:
        """Create the model's layers here instead of in ``__init__`` (Lightning >= 2.1), for large models.

        The Trainer calls it inside the strategy's creation context: on the device, in the precision's
        parameter dtype, and under fsdp on the meta device (each rank then materialises only its shards, set by
        the layers' ``reset_parameters``). It runs once per module and process, before ``configure_optimizers``:
        a later stage with the same module (``trainer.test`` after ``fit``) or a resume in the same process does
        not call it again (Lightning calls it every stage and asks for it to be idempotent).
        """

    def configure_sharded_model(self) -> None:
        """Lightning's deprecated name for ``configure_model``: overridden, it runs where that runs (before it)."""

    def configure_callbacks(self) -> Any:
        """Callbacks this model always wants; they are added to the Trainer's."""
        return []

    # ------------------------------------------------------------------ hooks
    def on_fit_start(self) -> None: ...
    def on_fit_end(self) -> None: ...
    def on_train_start(self) -> None: ...
    def on_train_end(self) -> None: ...
    def on_validation_start(self) -> None: ...
    def on_validation_end(self) -> None: ...
    def on_test_start(self) -> None: ...
    def on_test_end(self) -> None: ...
    def on_predict_start(self) -> None: ...
    def on_predict_end(self) -> None: ...
    def on_train_epoch_start(self) -> None: ...
    def on_train_epoch_end(self) -> None: ...
    def on_validation_epoch_start(self) -> None: ...
    def on_validation_epoch_end(self) -> None: ...
    def on_test_epoch_start(self) -> None: ...
    def on_test_epoch_end(self) -> None: ...
    def on_predict_epoch_start(self) -> None: ...
    def on_predict_epoch_end(self) -> None: ...

    # switching the mode around evaluation; override to keep some layers as they are (dropout for MC sampling)
    def on_validation_model_eval(self) -> None:
        self.eval()

    def on_validation_model_train(self) -> None:
        self.train()

    def on_test_model_eval(self) -> None:
        self.eval()

    def on_test_model_train(self) -> None:
        self.train()

    def on_predict_model_eval(self) -> None:
        self.eval()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> int | None: ...
    def on_train_batch_end(self, outputs: Any, batch: Any, batch_idx: int) -> None: ...
    def on_validation_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_validation_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_test_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_batch_start(self, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_predict_batch_end(self, outputs: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None: ...
    def on_before_backward(self, loss: Tensor) -> None: ...
    def on_after_backward(self) -> None: ...
    def on_before_optimizer_step(self, optimizer: Optimizer) -> None: ...
    def on_before_zero_grad(self, optimizer: Optimizer) -> None: ...
    def on_save_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...
    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None: ...
    def setup(self, stage: str) -> None: ...
    def teardown(self, stage: str) -> None: ...
    def prepare_data(self) -> None: ...

    #: ``prepare_data`` runs on local rank 0 of every machine (True) or on global rank 0 only (False)
    prepare_data_per_node: bool = True

    # where the Trainer looks for data when fit/validate/test/predict get none (a DataModule's come first)
    def train_dataloader(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} defines no train_dataloader()")

    def val_dataloader(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} defines no val_dataloader()")

    def test_dataloader(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} defines no test_dataloader()")

    def predict_dataloader(self) -> Any:
        raise NotImplementedError(f"{type(self).__name__} defines no predict_dataloader()")

    def on_before_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch

    def transfer_batch_to_device(self, batch: Any, device: torch.device, dataloader_idx: int) -> Any:
        from torchfleet.strategies.utils import move_to_device

        return move_to_device(batch, device)

    def on_after_batch_transfer(self, batch: Any, dataloader_idx: int) -> Any:
        return batch

    def optimizer_step(
        self, epoch: int, batch_idx: int, optimizer: Optimizer, optimizer_closure: Callable[[], Any] | None = None
    ) -> None:
        """Step ``optimizer`` at the end of an accumulation window (automatic optimisation only).

        Override to act around the step (a learning-rate warm-up, a step only on some batches). The override must
        call ``optimizer.step(closure=optimizer_closure)`` once: the closure returns the window's last loss (the
        Trainer has already run its forward and backward), and ``optimizer.step`` runs what the Trainer's own step
        runs (``on_before_optimizer_step``, gradient clipping, the strategy's step) and counts a global step.
        """
        optimizer.step(closure=optimizer_closure)

    def optimizer_zero_grad(self, epoch: int, batch_idx: int, optimizer: Optimizer) -> None:
        """Reset gradients before the next accumulation window; override to change how."""
        optimizer.zero_grad(set_to_none=True)

    def configure_gradient_clipping(
        self, optimizer: Optimizer, gradient_clip_val: float | None = None, gradient_clip_algorithm: str | None = None
    ) -> None:
        """Clip gradients before ``optimizer`` steps; the default applies the Trainer's clipping settings."""
        self.clip_gradients(optimizer, gradient_clip_val, gradient_clip_algorithm)

    # -------------------------------------------------------------- accessors
    @property
    def trainer(self) -> ModuleRunner:
        if self._trainer is None and not jit_scanning():  # TorchScript reads every attribute: no error then
            raise RuntimeError(f"{type(self).__qualname__} is not attached to a `Trainer`: self.trainer exists inside "
                               "Trainer.fit/validate/test/predict.")  # Lightning's words first
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: ModuleRunner | None) -> None:
        for child in (c for c in self.children() if isinstance(c, Module)):  # as Lightning: inner Modules too
            child.trainer = trainer
        object.__setattr__(self, "_trainer", trainer)

    def _strategy(self) -> Any:
        if self._trainer is not None:
            return self._trainer.strategy
        if self._fleet is not None:
            return self._fleet.strategy
        return None

    @property
    def device_mesh(self) -> Any:
        """The DeviceMesh to parallelise over in ``configure_model`` (ModelParallelStrategy's: dimensions
        "data_parallel" and "tensor_parallel"); None under every other strategy, and outside a run."""
        strategy = self._strategy()
        return None if strategy is None else strategy.module_device_mesh

    @property
    def pipeline_stages(self) -> Any:
        """This rank's pipeline stages (one ``nn.Sequential`` each) to shard in ``configure_model`` under a schedule
        running several per rank (``pipeline_schedule="Interleaved1F1B"``); None otherwise."""
        strategy = self._strategy()
        return None if strategy is None else strategy.pipeline_stages

    @property
    def device(self) -> torch.device:
        """The device of the module's first parameter or buffer (CPU when it has none)."""
        for t in self.parameters():
            return t.device
        for t in self.buffers():
            return t.device
        return torch.device("cpu")

    @property
    def on_gpu(self) -> bool:
        """Whether the module is on a CUDA device."""
        return self.device.type == "cuda"

    @property
    def fabric(self) -> FleetRunner | None:
        """The Fleet this module was set up with (Lightning's name: Fabric), or None; ``fleet.setup`` sets it."""
        return self._fleet

    @fabric.setter
    def fabric(self, fleet: FleetRunner | None) -> None:
        object.__setattr__(self, "_fleet", fleet)

    @property
    def loop_door(self) -> LoopDoor:
        """What the loop running this module tells it (where ``self.log`` records, the running hook): the loop
        writes its attributes, the module reads them (torchfleet/running.py). Set a new one only for a copy of the
        module that must record apart (a dp replica)."""
        door = self.__dict__.get("_door")
        if door is None:  # a subclass whose __init__ did not call ours
            door = LoopDoor()
            object.__setattr__(self, "_door", door)
        return door

    @loop_door.setter
    def loop_door(self, door: LoopDoor) -> None:
        object.__setattr__(self, "_door", door)

    @property
    def strict_loading(self) -> bool:
        """Whether restoring a checkpoint (``fit(ckpt_path=...)``, ``load_from_checkpoint``) needs every key of the
        state dict to match (default True); set it False to load a checkpoint that left some weights out."""
        return self._strict_loading in (None, True)

    @strict_loading.setter
    def strict_loading(self, strict: bool) -> None:
        object.__setattr__(self, "_strict_loading", strict)

    @property
    def dtype(self) -> torch.dtype:
        for t in self.parameters():
            return t.dtype
        return torch.get_default_dtype()

    @property
    def global_step(self) -> int:
        return self._trainer.global_step if self._trainer is not None else 0

    @property
    def current_epoch(self) -> int:
        return self._trainer.current_epoch if self._trainer is not None else 0

    @property
    def global_rank(self) -> int:  # read from the Trainer (or Fleet), as Lightning does
        owner = self._trainer if self._trainer is not None else self._fleet
        return owner.global_rank if owner is not None else 0

    @property
    def local_rank(self) -> int:
        owner = self._trainer if self._trainer is not None else self._fleet
        return owner.local_rank if owner is not None else 0

    @property
    def logger(self) -> Any:
        """The first logger of the Trainer (or of the Fleet that set this module up); None without one."""
        owner = self._trainer if self._trainer is not None else self._fleet
        return owner.logger if owner is not None else None

    @property
    def loggers(self) -> list[Any]:
        """Every logger of the Trainer (or of the Fleet that set this module up)."""
        owner = self._trainer if self._trainer is not None else self._fleet
        return owner.loggers if owner is not None else []

    def optimizers(self, use_pl_optimizer: bool = True) -> Optimizer | list[Optimizer]:
        """The optimizers from configure_optimizers (one object when there is one)."""
        trainer = self.trainer
        opts = trainer.manual_optimizers() if use_pl_optimizer else trainer.optimizers
        return opts[0] if len(opts) == 1 else opts

    def lr_schedulers(self) -> Any:
        """The LR schedulers from configure_optimizers (one object when there is one, None when none)."""
        scheds = [c.scheduler for c in self.trainer.lr_scheduler_configs]
        if not scheds:
            return None
        return scheds[0] if len(scheds) == 1 else scheds

    # ---------------------------------------------------------------- logging
    def log(
        self,
        name: str,
        value: Any,
        prog_bar: bool = False,
        logger: bool = True,
        on_step: bool | None = None,
        on_epoch: bool | None = None,
        reduce_fx: str | Callable = "mean",
        enable_graph: bool = False,
        sync_dist: bool = False,
        sync_dist_group: Any = None,
        add_dataloader_idx: bool = True,
        batch_size: int | None = None,
        metric_attribute: str | None = None,
        rank_zero_only: bool = False,
    ) -> None:
        """Record ``value`` under ``name`` for the progress bar, the loggers and callbacks.

        Defaults as in Lightning: per step in training hooks, per epoch (weighted mean over
        batches) in validation/test hooks. ``sync_dist=True`` reduces across processes with
        ``reduce_fx``; ``rank_zero_only=True`` logs only on rank 0 (do not monitor such values
        with callbacks that must decide alike on every rank).
        """
        door = self.loop_door
        results = door.results
        if results is None or (self._trainer is not None and self._trainer.barebones is True):
            if self._trainer is None:
                if self._fleet is not None and logger:  # in a Fleet loop: straight to the Fleet's loggers
                    self._fleet.log(name, value)
                return  # outside a Trainer and a Fleet (a unit test): nothing records it
            if self._trainer.barebones is True:  # "`Trainer(barebones=True)` is configured": Lightning's words
                return warnings.warn("self.log() does nothing: `Trainer(barebones=True)` is configured.", stacklevel=2)
            raise ConfigurationError(
                f"self.log({name!r}, ...) was called from {door.current_fx or 'a hook'} where the Trainer records "
                "nothing. Log from training_step, validation_step, test_step or the batch/epoch hooks."
            )
        if rank_zero_only:
            if sync_dist:
                raise ConfigurationError(
                    f"self.log({name!r}, sync_dist=True, rank_zero_only=True) asks every rank to join a reduction "
                    "of a value that only rank 0 logs. Choose one of the two."
                )
            if self.global_rank != 0:
                return
        results.log(door.current_fx, name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist, batch_size)

    def log_dict(self, dictionary: Mapping[str, Any], **kwargs: Any) -> None:
        """``self.log`` each item of ``dictionary`` with the same options."""
        if self.loop_door.results is None and self._trainer is None and self._fleet is not None:
            if kwargs.get("logger", True):  # in a Fleet loop: one call to the loggers for them all, as in Fabric
                self._fleet.log_dict(dict(dictionary))
            return
        for name, value in dictionary.items():
            self.log(name, value, **kwargs)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only."""
        if self.global_rank == 0:
            print(*args, **kwargs)

    # ----------------------------------------------------------- collectives (collectives.UserCollectives)
    def _collective_strategy(self) -> Any:
        # outside a Trainer/Fleet this is one process: the single-device identities
        strategy = self._strategy()
        if strategy is None:
            from torchfleet.strategies.single_device import SingleDeviceStrategy

            return SingleDeviceStrategy()
        return strategy

    # ----------------------------------------------------- manual optimisation
    def backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """How the Trainer's backward runs on ``loss`` (already scaled by the precision); override it to change
        that (``retain_graph=True``, say). Not called under DeepSpeed, whose engine runs the backward."""
        loss.backward(*args, **kwargs)

    def manual_backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """Backward pass under manual optimisation; goes through the strategy (scaling, DDP sync)."""
        trainer = self.trainer
        if self.automatic_optimization:
            raise ConfigurationError(
                "manual_backward() is for manual optimisation. Set self.automatic_optimization = False in "
                "__init__, or return the loss from training_step and let the Trainer call backward."
            )
        trainer.manual_backward(loss, *args, **kwargs)

    def toggle_optimizer(self, optimizer: Optimizer) -> None:
        """Let only ``optimizer``'s parameters get gradients (multi-optimizer setups such as GANs).

        As Lightning: every parameter of the Trainer's other optimizers gets ``requires_grad=False``, the
        previous flags are remembered, and ``optimizer``'s own parameters keep their previous flag (a frozen
        one stays frozen). :meth:`untoggle_optimizer` restores the flags.
        """
        state: dict[Tensor, bool] = {}
        for opt in self.trainer.optimizers:
            for group in opt.param_groups:
                for param in group["params"]:
                    if param not in state:
                        state[param] = param.requires_grad
                        param.requires_grad = False
        for group in optimizer.param_groups:
            for param in group["params"]:
                param.requires_grad = state.get(param, param.requires_grad)
        object.__setattr__(self, "_param_requires_grad_state", state)

    def untoggle_optimizer(self, optimizer: Optimizer) -> None:
        """Restore the ``requires_grad`` flags that :meth:`toggle_optimizer` changed."""
        state: dict[Tensor, bool] = self.__dict__.get("_param_requires_grad_state", {})
        own = {param for group in optimizer.param_groups for param in group["params"]}
        for param, flag in state.items():
            if param not in own:
                param.requires_grad = flag
        object.__setattr__(self, "_param_requires_grad_state", {})

    @contextmanager
    def toggled_optimizer(self, optimizer: Optimizer) -> Iterator[None]:
        """``with self.toggled_optimizer(opt):`` toggles ``opt`` and untoggles it on leaving, errors included."""
        self.toggle_optimizer(optimizer)
        try:
            yield
        finally:
            self.untoggle_optimizer(optimizer)

    def lr_scheduler_step(self, scheduler: Any, metric: Any) -> None:
        """How the Trainer steps an LR scheduler under automatic optimisation; override for a custom scheduler.

        ``metric`` is the monitored value for ReduceLROnPlateau-style schedulers, else None. A scheduler that is
        not a torch ``LRScheduler``/``ReduceLROnPlateau`` is accepted only when this is overridden.
        """
        if metric is None:
            scheduler.step()
        else:
            scheduler.step(metric)

    def clip_gradients(
        self,
        optimizer: Optimizer,
        gradient_clip_val: float | None = None,
        gradient_clip_algorithm: str | None = None,
    ) -> None:
        """Clip the gradients of ``optimizer``'s parameters by norm (default) or by value (in a Trainer, by default
        with its ``gradient_clip_val``/``gradient_clip_algorithm``; in a Fleet loop, through ``fleet.clip_gradients``)."""
        if self._trainer is None and self._fleet is not None:
            by_value = str(gradient_clip_algorithm).lower() == "value"
            return self._fleet.clip_gradients(self, optimizer, clip_val=gradient_clip_val if by_value else None,
                                              max_norm=None if by_value else gradient_clip_val)
        if self._trainer is not None:
            gradient_clip_val, gradient_clip_algorithm = self._trainer.gradient_clip_arguments(
                gradient_clip_val, gradient_clip_algorithm)
            precision = self._strategy().precision
            if CLIP_HOOKS & precision_overrides(precision):  # a Precision of yours clips (Lightning's hooks)
                return precision.clip_gradients(optimizer, gradient_clip_val or 0.0,
                                                GradClipAlgorithmType(gradient_clip_algorithm or "norm"))
        if gradient_clip_val is None or gradient_clip_val <= 0:
            return
        algorithm = gradient_clip_algorithm or "norm"
        strategy = self._strategy()
        if algorithm == "norm":
            strategy.clip_gradients_norm(self, optimizer, gradient_clip_val)
        elif algorithm == "value":
            strategy.clip_gradients_value(self, optimizer, gradient_clip_val)
        else:
            raise ConfigurationError(
                f"gradient_clip_algorithm={algorithm!r} is not supported. Accepted values are 'norm' and 'value'."
            )

    # ---------------------------------------------------------------- utility
    def freeze(self) -> None:
        """Stop gradients for every parameter and switch to eval mode."""
        for p in self.parameters():
            p.requires_grad = False
        self.eval()

    def unfreeze(self) -> None:
        """Re-enable gradients for every parameter and switch to train mode."""
        for p in self.parameters():
            p.requires_grad = True
        self.train()

    @classmethod
    def load_from_checkpoint(
        cls, checkpoint_path: str, map_location: Any = None, strict: bool | None = None,
        weights_only: bool | None = None, **kwargs: Any,
    ) -> Module:
        """Build the model from the hyperparameters saved in a checkpoint and load its weights.

        ``strict``: every key must match (default: the model's ``strict_loading``). The file is read without running
        code from it; ``weights_only=False`` unpickles anything (a file you trust). ``kwargs`` replace saved
        hyperparameters.
        """
        from torchfleet.checkpoint.format import read_checkpoint
        from torchfleet.checkpoint.hparams import still_plain

        checkpoint = read_checkpoint(checkpoint_path, map_location=map_location or "cpu",
                                     weights_only=weights_only is not False)
        hparams = {**checkpoint.get("hyper_parameters", {}), **kwargs}
        missing = still_plain(hparams)
        if missing:
            raise CheckpointError(
                f"{cls.__name__}.load_from_checkpoint({checkpoint_path!r}) cannot rebuild the hyperparameters "
                f"{', '.join(missing)}: their classes are not imported in this process (they are never imported from "
                "a checkpoint). Import the modules that define them first, or pass those arguments as keywords."
            )
        model = cls(**hparams)
        from torchfleet.checkpoint.state import load_state_dict_checked

        load_state_dict_checked(model, checkpoint["state_dict"], strict=model.strict_loading if strict is None else strict)
        model.on_load_checkpoint(checkpoint)
        return model


# TorchScript compiles the module's attributes: these are Python-only (some raise outside a run), so it skips them
Module.__jit_unused_properties__ = [name for cls in Module.__mro__ if cls.__module__.startswith("torchfleet")
                                    for name, value in vars(cls).items() if isinstance(value, property)]
