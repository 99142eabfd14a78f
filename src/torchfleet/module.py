"""Module: the user's model — an nn.Module with training hooks and ``self.log``.

Hook names and signatures follow PyTorch Lightning's LightningModule, so a LightningModule
ports by changing its imports and its base class.
"""

from __future__ import annotations

import copy
import inspect
import logging
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from torchfleet.errors import CheckpointError, ConfigurationError
from torchfleet.watchdog import labelled

if TYPE_CHECKING:
    from torchfleet.trainer.trainer import Trainer

log = logging.getLogger(__name__)


class AttributeDict(dict):
    """A dict whose keys are also attributes (``self.hparams.lr``)."""

    def __getattr__(self, key: str) -> Any:
        try:
            return self[key]
        except KeyError as exc:
            raise AttributeError(f"No hyperparameter {key!r}; saved ones are: {', '.join(self) or 'none'}.") from exc

    def __setattr__(self, key: str, value: Any) -> None:
        self[key] = value




class HyperparametersMixin:
    """``save_hyperparameters``, ``hparams`` and ``hparams_initial``, shared by Module and DataModule."""

    #: whether the Trainer sends these hyperparameters to its loggers: as in Lightning, only once
    #: ``save_hyperparameters()`` was called (and not with ``logger=False``)
    _log_hyperparams: bool = False

    @property
    def hparams(self) -> AttributeDict:
        found = self.__dict__.get("_hparams")
        if found is None:  # a subclass whose __init__ did not call ours
            found = AttributeDict()
            object.__setattr__(self, "_hparams", found)
        return found

    @property
    def hparams_initial(self) -> AttributeDict:
        return copy.deepcopy(self.__dict__.get("_hparams_initial") or AttributeDict())

    def save_hyperparameters(
        self, *args: Any, ignore: str | list[str] | None = None, frame: Any = None, logger: bool = True
    ) -> None:
        """Store the ``__init__`` arguments of the calling constructor in ``self.hparams`` (and checkpoints).

        With names as ``args``, store only those (or one dict of values); ``ignore`` lists names to leave out;
        ``logger=False`` keeps them out of the loggers (they are still saved in checkpoints).
        """
        frame = frame or inspect.currentframe().f_back  # type: ignore[union-attr]
        # every __init__ of this object on the stack contributes (a subclass's arguments override its
        # parent's), so a parent that calls save_hyperparameters() also records the subclass's arguments
        values: dict[str, Any] = {}
        f = frame
        while f is not None:
            if f.f_code.co_name == "__init__" and f.f_locals.get("self") is self:
                values.update(_init_args(f))
            f = f.f_back
        if not values:
            values = _init_args(frame)
        if args:
            if len(args) == 1 and isinstance(args[0], Mapping):
                values = dict(args[0])
            else:
                missing = [a for a in args if a not in values]
                if missing:
                    raise ConfigurationError(
                        f"save_hyperparameters({', '.join(map(repr, args))}): {', '.join(missing)} are not "
                        f"arguments of {type(self).__name__}.__init__ (its arguments: {', '.join(values)})."
                    )
                values = {a: values[a] for a in args}
        ignored = [ignore] if isinstance(ignore, str) else list(ignore or [])
        for name in ignored:
            values.pop(name, None)
        for name in list(values):
            if isinstance(values[name], nn.Module):
                values.pop(name)  # modules are weights, not hyperparameters
        self.hparams.update(values)
        object.__setattr__(self, "_hparams_initial", copy.deepcopy(AttributeDict(self.hparams)))
        object.__setattr__(self, "_log_hyperparams", logger)


class Module(nn.Module, HyperparametersMixin):
    """A model plus what the Trainer needs to train it: steps, optimizers, hooks and logging."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._trainer: Trainer | None = None
        self._fleet: Any = None
        self._results: Any = None
        self._current_fx: str = ""
        self._hparams: AttributeDict = AttributeDict()
        self._hparams_initial: AttributeDict = AttributeDict()
        self.automatic_optimization: bool = True
        self.example_input_array: Any = None

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
    def trainer(self) -> Trainer:
        if self._trainer is None:
            raise RuntimeError(
                f"{type(self).__name__} is not attached to a Trainer. self.trainer exists inside "
                "Trainer.fit/validate/test/predict."
            )
        return self._trainer

    @trainer.setter
    def trainer(self, trainer: Trainer | None) -> None:
        object.__setattr__(self, "_trainer", trainer)

    def _strategy(self) -> Any:
        if self._trainer is not None:
            return self._trainer.strategy
        if self._fleet is not None:
            return self._fleet.strategy
        return None

    @property
    def device(self) -> torch.device:
        """The device of the module's first parameter or buffer (CPU when it has none)."""
        for t in self.parameters():
            return t.device
        for t in self.buffers():
            return t.device
        return torch.device("cpu")

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
    def global_rank(self) -> int:
        strategy = self._strategy()
        return strategy.global_rank if strategy is not None else 0

    @property
    def local_rank(self) -> int:
        strategy = self._strategy()
        return strategy.local_rank if strategy is not None else 0

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
        opts = trainer._manual_optimizer_list() if use_pl_optimizer else trainer.optimizers
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
        results = self._results
        if results is None:
            if self._trainer is None:
                if self._fleet is not None and logger:  # in a Fleet loop: straight to the Fleet's loggers
                    self._fleet.log(name, value)
                return  # outside a Trainer and a Fleet (a unit test): nothing records it
            raise ConfigurationError(
                f"self.log({name!r}, ...) was called from {self._current_fx or 'a hook'} where the Trainer records "
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
        results.log(self._current_fx, name, value, prog_bar, logger, on_step, on_epoch, reduce_fx, sync_dist, batch_size)

    def log_dict(self, dictionary: Mapping[str, Any], **kwargs: Any) -> None:
        """``self.log`` each item of ``dictionary`` with the same options."""
        for name, value in dictionary.items():
            self.log(name, value, **kwargs)

    def print(self, *args: Any, **kwargs: Any) -> None:
        """``print`` on global rank 0 only."""
        if self.global_rank == 0:
            print(*args, **kwargs)

    # ----------------------------------------------------------- collectives
    def all_gather(self, data: Any, sync_grads: bool = False) -> Any:
        """Gather tensors (or nested collections of them) from every process, stacked along a new dim 0.

        Tensors whose first dimension differs between processes come back as a list, one per process.
        """
        with labelled("self.all_gather"):
            return self._collectives().all_gather_tree(data, sync_grads)

    def all_reduce(self, data: Any, reduce_op: str = "mean") -> Any:
        """Reduce tensors (or numbers, or nested collections of them) across processes: mean, sum, max, min."""
        with labelled("self.all_reduce"):
            return self._collectives().all_reduce_tree(data, reduce_op)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Return process ``src``'s ``obj`` on every process."""
        with labelled("self.broadcast"):
            return self._collectives().broadcast(obj, src=src)

    def barrier(self, name: str | None = None) -> None:
        """Wait until every process gets here."""
        self._collectives().barrier(name)

    def _collectives(self) -> Any:
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
        trainer._manual_backward(self, loss, *args, **kwargs)

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
        """Clip the gradients of ``optimizer``'s parameters by norm (default) or by value."""
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
        cls, checkpoint_path: str, map_location: Any = None, strict: bool = True, weights_only: bool | None = None,
        **kwargs: Any,
    ) -> Module:
        """Build the model from the hyperparameters saved in a checkpoint and load its weights.

        The file is read without running code from it; ``weights_only=False`` unpickles anything (a file you trust).
        ``kwargs`` replace saved hyperparameters.
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

        load_state_dict_checked(model, checkpoint["state_dict"], strict=strict)
        model.on_load_checkpoint(checkpoint)
        return model


def _init_args(frame: Any) -> dict[str, Any]:
    """The named arguments (and expanded ``**kwargs``) of the function running in ``frame``."""
    code = frame.f_code
    local = frame.f_locals
    n_named = code.co_argcount + code.co_kwonlyargcount
    names = code.co_varnames[1:n_named]
    values = {n: local[n] for n in names if n in local}
    if code.co_flags & inspect.CO_VARKEYWORDS:
        kw_name = code.co_varnames[n_named + bool(code.co_flags & inspect.CO_VARARGS)]
        values.update(local.get(kw_name, {}))
    return values
