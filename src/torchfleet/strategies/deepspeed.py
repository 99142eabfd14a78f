"""DeepSpeedStrategy: ZeRO stages 0-3 with optional CPU/NVMe offload, through ``deepspeed.initialize``.

It is ParallelStrategy's process handling (processes.py: launchers, the process group; sampler injection) with
the model, optimizer, backward and step handed to a DeepSpeed engine instead of DistributedDataParallel.
We create the torch.distributed process group ourselves and DeepSpeed joins it.

The Trainer's loop stays as it is: it divides the loss by ``accumulate_grad_batches`` and calls
backward on every batch, then the optimizer step at the accumulation boundary. DeepSpeed is told
the boundary explicitly (``set_gradient_accumulation_boundary``, False inside ``no_backward_sync``)
and its backward does not divide the loss a second time. LR schedulers stay the Trainer's: they
are not handed to DeepSpeed, which would step them on every optimizer step regardless of their
interval and frequency.

Checkpoints are directories (the "deepspeed" layout of torchfleet.checkpoint.deepspeed): the
engine's own checkpoint under ``deepspeed/`` plus our ``torchfleet.pt`` with everything else.
``torchfleet.checkpoint.deepspeed.consolidate_deepspeed`` turns one into an ordinary single-file
checkpoint in one process.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from torchfleet.checkpoint.deepspeed import (
    InEngine,
    deepspeed_available,
    import_deepspeed,
    is_deepspeed_checkpoint,
    not_installed,
    read_deepspeed_checkpoint,
)
from torchfleet.checkpoint.state import OPTIMIZER, OPTIMIZERS, map_stateful, stateful_kind
from torchfleet.errors import CheckpointError, ConfigurationError
from torchfleet.settings import loader_batch_size
from torchfleet.strategies import _deepspeed_config as dsc
from torchfleet.strategies._deepspeed_accelerator import (
    device_rank,
    local_rank_env,
    select_deepspeed_accelerator,
    skip_shm_build,
)
from torchfleet.strategies._deepspeed_checkpoint import (
    load_engine_checkpoint,
    load_full_weights,
    save_deepspeed,
)
from torchfleet.strategies._deepspeed_optimizer import _EngineOptimizer
from torchfleet.strategies._deepspeed_unshard import Before, Detached, unshard
from torchfleet.strategies.arguments import takes
from torchfleet.strategies.ddp import _HOOK_KWARG, DDPStrategy, _HookDispatch
from torchfleet.strategies.utils import check_keep_sharded, stays_sharded

log = logging.getLogger(__name__)

class DeepSpeedStrategy(DDPStrategy):
    """Sharded data-parallel training with DeepSpeed ZeRO (stages 0-3), optionally offloading to CPU or NVMe.

    The arguments are Lightning's DeepSpeedStrategy parameters (same names and defaults); they build
    the DeepSpeed config exposed as ``strategy.config``. A ``config`` (a dict or the path of a JSON
    file) replaces that default config entirely. Entries the Trainer knows (``train_micro_batch_size_per_gpu``,
    ``gradient_accumulation_steps``, ``gradient_clipping``, ``fp16``/``bf16`` enabled) may be
    ``"auto"`` or left out: setup fills them from the TrainingSettings that the Trainer (or Fleet's
    ``training=``) gives ``configure_training`` (micro_batch_size, else the training DataLoader's batch
    size; ``accumulate_grad_batches``; ``gradient_clip_val``) and from the precision.

    ``remote_device`` is where ``init_module`` creates a ZeRO stage-3 model (``"cpu"``/``"nvme"``;
    None: the training device). ``logging_level`` sets DeepSpeed's logger. ``load_full_weights`` is
    accepted for compatibility: a single-file checkpoint is always loaded as full weights, also
    under stage 3. ``process_group_backend``, ``timeout``, ``start_method`` and ``max_restarts`` are the shared
    process options (processes.ProcessOptions).

    Why DDPStrategy is its base: Lightning's DeepSpeedStrategy subclasses DDPStrategy, and ported programs check
    ``isinstance(trainer.strategy, DDPStrategy)``. It borrows nothing of DDP's wrapping (setup, steps, backward,
    synchronisation are its own, overriding DDP's); launching and the process group are ParallelStrategy's pieces,
    the same that FSDPStrategy uses; from DDPStrategy it keeps the teardown that gives ``model`` back as the Module.

    When a Trainer stage ends, the module is made an ordinary one again on every rank (``unshard_module``):
    the trained (float32 master) weights, whole, on the CPU, in the dtypes it had before, without DeepSpeed's
    hooks, so user code can call it on any rank. ``keep_sharded=True`` keeps the engine and its partitions
    instead (for a model that does not fit in one process; a later evaluation stage reuses the engine;
    spawned or forked ranks end with the stage, so there the caller's process gets the module whole anyway).
    """

    reseeds_for = frozenset({"trainer", "fleet"})  # as Lightning's and Fabric's
    requires_package = "deepspeed"

    @takes("accelerator", "zero_optimization", "stage", "remote_device", "offload_optimizer",
           "offload_parameters", "offload_params_device", "nvme_path", "params_buffer_count",
           "params_buffer_size", "max_in_cpu", "offload_optimizer_device", "optimizer_buffer_count",
           "block_size", "queue_depth", "single_submit", "overlap_events", "thread_count", "pin_memory",
           "sub_group_size", "contiguous_gradients", "overlap_comm", "allgather_partitions",
           "reduce_scatter", "allgather_bucket_size", "reduce_bucket_size", "zero_allow_untested_optimizer",
           "logging_batch_size_per_gpu", "config", "logging_level", "parallel_devices",
           "cluster_environment", "loss_scale", "initial_scale_power", "loss_scale_window", "hysteresis",
           "min_loss_scale", "partition_activations", "cpu_checkpointing", "contiguous_memory_optimization",
           "synchronize_checkpoint_boundary", "load_full_weights", "precision", "process_group_backend",
           "timeout", "start_method", "precision_plugin", "max_restarts", "keep_sharded")
    def __init__(
        self,
        given: dict[str, Any],
        zero_optimization: bool = True,
        stage: int = 2,
        remote_device: str | None = None,
        offload_optimizer: bool = False,
        offload_parameters: bool = False,
        offload_params_device: str = "cpu",
        nvme_path: str | os.PathLike[str] = "/local_nvme",
        params_buffer_count: int = 5,
        params_buffer_size: int = 100_000_000,
        max_in_cpu: int = 1_000_000_000,
        offload_optimizer_device: str = "cpu",
        optimizer_buffer_count: int = 4,
        block_size: int = 1_048_576,
        queue_depth: int = 8,
        single_submit: bool = False,
        overlap_events: bool = True,
        thread_count: int = 1,
        pin_memory: bool = False,
        sub_group_size: int = 1_000_000_000_000,
        contiguous_gradients: bool = True,
        overlap_comm: bool = True,
        allgather_partitions: bool = True,
        reduce_scatter: bool = True,
        allgather_bucket_size: int = 200_000_000,
        reduce_bucket_size: int = 200_000_000,
        zero_allow_untested_optimizer: bool = True,
        logging_batch_size_per_gpu: str | int = "auto",
        config: str | os.PathLike[str] | Mapping[str, object] | None = None,
        logging_level: int = logging.WARN,
        loss_scale: float = 0,
        initial_scale_power: int = 16,
        loss_scale_window: int = 1000,
        hysteresis: int = 2,
        min_loss_scale: int = 1,
        partition_activations: bool = False,
        cpu_checkpointing: bool = False,
        contiguous_memory_optimization: bool = False,
        synchronize_checkpoint_boundary: bool = False,
        load_full_weights: bool = False,
        keep_sharded: bool = False,
    ) -> None:
        if not deepspeed_available():
            raise not_installed("A DeepSpeed strategy")
        super().__init__(**given)
        # every config-building keyword is checked, also when a given config replaces what they would build
        options = dsc.DeepSpeedOptions.from_arguments(locals())
        if remote_device not in (None, "cpu", "nvme"):
            raise ConfigurationError(
                f"remote_device={remote_device!r} is not understood. Accepted: None (create the model on the training "
                "device), 'cpu' or 'nvme' (where ZeRO stage 3 keeps parameters while init_module builds the model)."
            )
        self.config: dict[str, Any] = dsc.user_config(config) if config is not None else options.to_config()
        dsc.check_config(self.config)
        self.remote_device = remote_device
        self.logging_level = logging_level
        self.load_full_weights = load_full_weights
        self._config_template = self.config
        self._engine: Any = None
        self._half: str | None = None
        #: per param group of the user's optimizer, its parameters' names in the module (None: not in it)
        self.optimizer_param_names: list[list[str | None]] | None = None
        self._loader_batch_size: int | None = None
        self.keep_sharded = check_keep_sharded("DeepSpeedStrategy", keep_sharded)
        #: the module as setup received it (dtypes): what unsharding gives back
        self._before: Before | None = None
        #: the engine's view of its module once that was made whole (the engine is kept for a save after the stage)
        self._detached: Detached | None = None
        #: the running stage raised: its end leaves the module in the engine (making it whole needs every rank)
        self._interrupted = False

    # ----------------------------------------------------------------- properties
    @property
    def zero_stage(self) -> int:
        """The ZeRO stage of ``config`` (0 when ZeRO is off)."""
        return dsc.zero_stage(self.config)

    @property
    def engine(self) -> Any:
        """The DeepSpeed engine of the current run (None before setup)."""
        return self._engine

    # ----------------------------------------------------------------- data
    def process_dataloader(self, dataloader: Any) -> Any:
        """The loader as it is; its batch size is the default micro batch size (the training loader comes last)."""
        self._loader_batch_size = loader_batch_size(dataloader)
        return dataloader

    @property
    def even_evaluation_shards(self) -> str | None:  # type: ignore[override]
        """Under ZeRO stage 3 every forward gathers parameters from all ranks: evaluation loaders then give every
        rank the same number of batches (as under fsdp), else a rank with one batch more would wait forever."""
        return "deepspeed stage 3" if self.zero_stage == 3 else None

    def batch_to_device(self, batch: Any, device: torch.device | None = None, dataloader_idx: int = 0) -> Any:
        """Move the batch; under DeepSpeed's fp16/bf16 the module's parameters are 16-bit, so floating inputs are too."""
        from torchfleet.precision import _cast_floating
        from torchfleet.strategies.utils import move_to_device

        batch = move_to_device(batch, device or self.root_device)
        if self._half is not None:
            batch = _cast_floating(batch, torch.float16 if self._half == "fp16" else torch.bfloat16)
        return batch

    # ----------------------------------------------------------------- setup
    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: Sequence[Optimizer] = (), scheduler: Any = None
    ) -> tuple[nn.Module, list[Optimizer], Any]:
        """Create the DeepSpeed engine over ``module`` and its optimizer (at most one): ``(engine, [optimizer], scheduler)``.

        ZeRO runs the given optimizer over its partitions; the optimizer returned wraps it so that
        stepping goes through the engine (LR schedulers built over the given one keep working).
        """
        deepspeed = import_deepspeed()
        optimizers = list(optimizers)
        engine = self._engine
        self._interrupted = False
        if not optimizers and engine is not None and self._detached is None and self.unwrap(engine) is module:
            # evaluation after fit with the same module (keep_sharded): its engine holds the trained partitions
            return engine, [], scheduler
        # a later stage (a second fit, another module): the previous engine's ZeRO-3 hooks are still on the
        # module's layers and would fetch parameters alongside the new engine's
        self._release_engine()
        if len(optimizers) > 1:
            raise ConfigurationError(
                f"DeepSpeed trains with one optimizer, but {len(optimizers)} were given. Combine the parameter groups "
                "into one optimizer (one param group per set of hyperparameters)."
            )
        settings = self.training_settings
        config, half = dsc.fill_auto(
            self._config_template,
            micro_batch_size=settings.micro_batch_size or self._loader_batch_size or 1,
            accumulate_grad_batches=settings.accumulate_grad_batches,
            gradient_clip_val=settings.gradient_clip_val,
            gradient_clip_algorithm=settings.gradient_clip_algorithm,
            precision_name=self.precision.name,
        )
        dsc.check_config(config)
        _check_nvme_supported(config)
        if not optimizers and dsc.zero_stage(config) in (1, 2):
            # ZeRO 1-2 partition the optimizer's state and the gradients, which evaluation has none of (DeepSpeed
            # refuses such an engine); the parameters are whole under them anyway
            config = {**config, "zero_optimization": {**config["zero_optimization"], "stage": 0}}
        self.config, self._half = config, half
        from deepspeed.utils import logger as ds_logger

        ds_logger.setLevel(self.logging_level)
        select_deepspeed_accelerator(self.root_device)
        skip_shm_build(self.root_device)
        self.optimizer_param_names = _param_names(module, optimizers[0]) if optimizers else None
        # evaluation in 16 bits: DeepSpeed converts the weights in place, so the stage's end gives the originals back
        self._before = Before.of(module, keep_originals=not optimizers and half is not None)
        with local_rank_env(self.local_rank):
            engine, _, _, _ = deepspeed.initialize(
                args=argparse.Namespace(device_rank=device_rank(self.root_device, self.local_rank)),
                model=_HookDispatch(module), optimizer=optimizers[0] if optimizers else None, config=config,
                dist_init_required=False,
            )
        if torch.device(engine.device).type != self.root_device.type:
            raise ConfigurationError(
                f"DeepSpeed placed its engine on {engine.device} although this run trains on {self.root_device}. "
                "Something selected DeepSpeed's accelerator after torchfleet did (DS_ACCELERATOR or "
                "deepspeed.accelerator.set_accelerator in the script); leave the choice to Trainer(accelerator=...)."
            )
        if optimizers:
            # the Trainer says where the accumulation boundary is (no_backward_sync); not DeepSpeed's counter
            engine.set_gradient_accumulation_boundary(True)
        self._engine, self._detached = engine, None
        return engine, [_EngineOptimizer(o, self) for o in optimizers], scheduler

    def setup_module(self, module: nn.Module) -> nn.Module:
        """DeepSpeed wraps the module and its optimizer together: see ``setup_module_and_optimizers``."""
        return self.setup_module_and_optimizers(module)[0]

    def setup_and_build_optimizers(
        self, module: nn.Module, build: Callable[[], list[Optimizer]]
    ) -> tuple[nn.Module, list[Optimizer]]:
        """The optimizers first: ``deepspeed.initialize`` builds the engine from the module and its optimizer together."""
        engine, optimizers, _ = self.setup_module_and_optimizers(module, build())
        return engine, optimizers

    def setup_for_evaluation(self, module: nn.Module) -> nn.Module:
        """An engine for evaluation too (ZeRO-3 keeps the parameters partitioned)."""
        return self.setup_module_and_optimizers(module, [])[0]

    def model_to_device(self) -> None:
        """Nothing: ``deepspeed.initialize`` places the module (ZeRO-3 partitions it on the way)."""

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        """True: an engine checkpoint loads into the engine, which ``setup`` creates."""
        return True

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """The optimizer is given to DeepSpeed with the module; one set up on its own cannot join the engine."""
        if isinstance(optimizer, _EngineOptimizer):
            return optimizer
        raise ConfigurationError(
            "DeepSpeed builds its engine from the module and its optimizer together. Pass the optimizer with the "
            "module: fleet.setup(model, optimizer), not fleet.setup_module(model) then fleet.setup_optimizers(...)."
        )

    def unshard_module(self, module: nn.Module) -> None:
        """Make the engine's module an ordinary one with its whole trained weights, on every rank (all call it)."""
        engine = self._engine
        if engine is None or self._detached is not None or self.unwrap(module) is not self.unwrap(engine):
            return
        assert self._before is not None
        self._detached = unshard(engine, self.unwrap(engine), self._before)

    def on_exception(self, exception: BaseException) -> None:
        """The stage raised: ``teardown`` then leaves the module in the engine (the other ranks may be anywhere)."""
        self._interrupted = True
        super().on_exception(exception)

    def unwrap(self, module: nn.Module) -> nn.Module:
        """The user's module inside the engine and its hook dispatcher."""
        if self._engine is not None and module is self._engine:
            module = self._engine.module
        return module.module if isinstance(module, _HookDispatch) else module

    def step_function(self, module: nn.Module, name: str) -> Callable[..., Any]:
        """training_step runs inside the engine's forward; under stage 3 every step does, as parameters are fetched there."""
        if module is self._engine and self._engine is not None and (name == "training_step" or self.zero_stage == 3):
            return functools.partial(module, **{_HOOK_KWARG: name})
        return getattr(self.unwrap(module), name)

    @property
    def outside_forward(self) -> str:  # type: ignore[override]
        """ZeRO-3 partitions parameters (fetched in forward); below, gradients are reduced only for forward's work."""
        return "never" if self.zero_stage == 3 else "without_grad"

    def forward_method(self, module: nn.Module, name: str) -> Callable[..., Any]:
        """``name`` run inside the engine's forward (through the hook dispatcher)."""
        if module is self._engine and self._engine is not None:
            return functools.partial(module, **{_HOOK_KWARG: name})
        return getattr(self.unwrap(module), name)

    # ----------------------------------------------------------------- training
    def forward_context(self) -> contextlib.AbstractContextManager:
        """DeepSpeed runs 16-bit training with 16-bit parameters itself: no autocast on top."""
        return contextlib.nullcontext()

    backward_through_precision = False

    def run_backward(self, tensor: Tensor, module: nn.Module | None, *args: Any, **kwargs: Any) -> None:
        """``engine.backward(tensor)``: loss scaling, gradient partitioning and reduction are DeepSpeed's.

        The Trainer has already divided the loss by ``accumulate_grad_batches``; DeepSpeed does not divide again.
        """
        self._require_engine("backward")
        self._engine.backward(tensor, retain_graph=bool(kwargs.get("retain_graph", False)), scale_wrt_gas=False)

    def optimizer_step(
        self, optimizer: Optimizer, closure: Callable[[], Any] | None = None, model: nn.Module | None = None,
        **kwargs: Any,
    ) -> Any:
        """``engine.step()``: unscale, clip (``gradient_clipping``), step the optimizer, zero the gradients."""
        self._require_engine("optimizer_step")
        out = closure() if closure is not None else None
        self._engine.step()
        return out

    @contextlib.contextmanager
    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> Iterator[None]:
        """Inside the block, backward passes are not accumulation boundaries: DeepSpeed defers its reductions."""
        engine = self._engine
        if not enabled or engine is None or engine.optimizer is None:
            yield
            return
        engine.set_gradient_accumulation_boundary(False)
        try:
            yield
        finally:
            engine.set_gradient_accumulation_boundary(True)

    def clip_gradients_norm(
        self, module: nn.Module | None, optimizer: Optimizer | None, max_norm: float, norm_type: float = 2.0,
        error_if_nonfinite: bool = False,
    ) -> Tensor:
        """DeepSpeed clips inside ``engine.step`` to the config's ``gradient_clipping``; this only checks they agree.

        Returns NaN: the norm is computed later, inside the step, over the partitioned gradients.
        """
        configured = float(self.config.get("gradient_clipping", 0.0) or 0.0)
        if norm_type != 2.0 or abs(configured - float(max_norm)) > 1e-12:
            raise ConfigurationError(
                f"Clipping to max_norm={max_norm} (norm_type={norm_type}) was asked for, but DeepSpeed clips the 2-norm "
                f"inside its optimizer step to the config's gradient_clipping ({configured}). Set "
                "Trainer(gradient_clip_val=...) or the config's 'gradient_clipping' to the value you want; a "
                "configure_gradient_clipping hook cannot change it per step under DeepSpeed."
            )
        return torch.tensor(float("nan"))

    def clip_gradients_value(self, module: nn.Module | None, optimizer: Optimizer | None, clip_val: float) -> None:
        """Not available: DeepSpeed clips by norm only."""
        raise ConfigurationError(
            "gradient_clip_algorithm='value' cannot run under DeepSpeed, which clips gradients by their norm inside "
            "its optimizer step. Use gradient_clip_algorithm='norm'."
        )

    def _require_engine(self, what: str) -> None:
        if self._engine is None:
            raise ConfigurationError(f"DeepSpeedStrategy.{what}() needs the engine, which setup() creates first.")
        if self._engine.optimizer is None and what != "forward":
            raise ConfigurationError(
                f"DeepSpeedStrategy.{what}() needs an optimizer, but the engine was set up without one (configure_"
                "optimizers() returned None, or fleet.setup() got no optimizer)."
            )

    # ----------------------------------------------------------------- state dicts
    def module_state_dict(self, module: nn.Module) -> dict[str, Any]:
        """The full state dict of the user's module; under stage 3 its parameters are gathered from every rank first."""
        user = self.unwrap(module)
        if self.zero_stage != 3 or self._engine is None or self._detached is not None:
            return user.state_dict()
        import deepspeed

        with deepspeed.zero.GatheredParameters(list(user.parameters()), modifier_rank=None):
            return {k: v.detach().clone() for k, v in user.state_dict().items()}

    def load_module_state_dict(self, module: nn.Module, state: Mapping[str, Any], strict: bool = True) -> None:
        """Load full (unsharded) weights into the engine's module, then refresh ZeRO's float32 master copy from them."""
        load_full_weights(self, self.unwrap(module), state, strict=strict)

    def optimizer_state_dict(self, optimizer: Optimizer) -> dict[str, Any]:
        """A placeholder: the optimizer's (partitioned) state is written by the engine's checkpoint."""
        return InEngine("optimizer")

    def load_optimizer_state(self, optimizer: Optimizer, state: Mapping[str, Any]) -> None:
        """Unsharded optimizer state (from another strategy) cannot be mapped onto ZeRO's partitions."""
        raise CheckpointError(
            "This checkpoint holds optimizer state written by another strategy (unsharded, per parameter); DeepSpeed "
            "resumes only from its own checkpoints (any world size). Start the DeepSpeed run from its weights: load "
            "them in validate/test/predict, or with Module.load_from_checkpoint and fit without ckpt_path."
        )

    def state_for_saving(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """``state`` with modules and optimizers replaced by placeholders: the engine checkpoint holds them."""
        return map_stateful(state, lambda _: InEngine("module"), lambda _: InEngine("optimizer"))

    def lightning_module_state_dict(self) -> dict[str, Any]:
        """A placeholder: the engine's checkpoint holds the module (``save_checkpoint`` writes it)."""
        return InEngine("module")

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        """From an engine checkpoint: the engine loads it, with the optimizer's state when fitting; else full weights."""
        if _in_engine(checkpoint.get("state_dict")):
            load_engine_checkpoint(self, checkpoint, with_optimizer=bool(self.optimizers), strict=strict)
            return
        super().load_model_state_dict(checkpoint, strict)

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """An engine checkpoint's optimizer state came with the module (``load_model_state_dict``); another
        strategy's is refused (it cannot be mapped onto ZeRO's partitions)."""
        if not _in_engine(checkpoint.get("state_dict")):
            super().load_optimizer_state_dict(checkpoint)

    # ----------------------------------------------------------------- checkpoints
    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: str | os.PathLike, storage_options: Any | None = None
    ) -> None:
        """Write a "deepspeed" layout checkpoint directory at ``filepath``: the engine checkpoint plus ``torchfleet.pt``.

        Every rank calls this and writes its shards; the directory appears at ``path`` only when complete.
        """
        if storage_options is not None:
            raise ConfigurationError(
                "storage_options cannot be used with DeepSpeedStrategy: the engine writes its checkpoint files itself, "
                "without a CheckpointIO. Call save_checkpoint without storage_options."
            )
        self._require_engine("save_checkpoint")
        # after the stage made the module whole, the engine writes what it held at the stage's end
        with self._detached.engine_view() if self._detached is not None else contextlib.nullcontext():
            save_deepspeed(self, filepath, checkpoint)

    def load_checkpoint(self, checkpoint_path: str | os.PathLike, weights_only: bool | None = None) -> dict[str, Any]:
        """Read a checkpoint: a "deepspeed" directory is read with placeholders for what the engine loads (any world
        size, in ``load_into``), anything else as full weights."""
        trusted = self.resolve_weights_only(weights_only)
        if not is_deepspeed_checkpoint(checkpoint_path, trusted):
            return super().load_checkpoint(checkpoint_path, weights_only)
        self._restoring = checkpoint_path
        return read_deepspeed_checkpoint(checkpoint_path, trusted)

    def load_into(
        self, checkpoint: Mapping[str, Any], state: Mapping[str, Any], strict: bool = True, path: Any = None
    ) -> None:
        """Load ``checkpoint`` into the engine: from the engine checkpoint it came with, or as full weights."""
        held = [h for h in (checkpoint.get(k) for k in state) if _in_engine(h)]
        if not held:
            super().load_into(checkpoint, state, strict=strict, path=path)
            return
        with_optimizer = any(stateful_kind(t) in (OPTIMIZER, OPTIMIZERS) for t in state.values())
        load_engine_checkpoint(self, checkpoint, with_optimizer=with_optimizer, strict=strict)

    def _release_engine(self) -> None:
        engine, self._engine = self._engine, None
        if engine is not None and self._detached is None:  # unsharding destroyed it already
            engine.destroy()

    def memory_model(self, module: nn.Module, world_size: int, num_nodes: int) -> Any:  # a MemoryModel
        return dsc.memory_model(self.config, world_size, self.precision.name, module)

    def teardown(self) -> None:
        """Make the module whole as at a stage's end, destroy an engine still attached to it, then DDPStrategy's
        (``model`` is the Module again, then ParallelStrategy's teardown).

        The engine of a module made whole (destroyed already, without hooks) is kept for ``trainer.save_checkpoint``
        after the stage, and with ``keep_sharded`` the engine stays for the next stage; the next ``setup`` drops both.
        """
        if self._engine is not None and not stays_sharded(self.keep_sharded, self.start_method, self._interrupted):
            self.unshard_module(self._engine)
        if self._detached is None and not self.keep_sharded:
            self._release_engine()
        super().teardown()

    def __repr__(self) -> str:
        return (f"DeepSpeedStrategy(stage={self.zero_stage}, devices={self.num_processes}, num_nodes={self.num_nodes}, "
                f"precision={self.precision!r})")


def _in_engine(entry: Any) -> bool:
    """Whether a checkpoint entry is a placeholder for what the engine checkpoint holds."""
    return isinstance(entry, InEngine) or (isinstance(entry, list) and bool(entry) and isinstance(entry[0], InEngine))


def _check_nvme_supported(config: Mapping[str, Any]) -> None:
    if not dsc.nvme_paths(config):
        return
    import deepspeed.ops
    if not deepspeed.ops.__compatible_ops__.get("async_io", False):
        raise ConfigurationError(
            "Offloading to NVMe needs DeepSpeed's async_io op, which cannot be built on this machine (it needs the "
            "libaio development files: apt-get install libaio-dev, then reinstall deepspeed). Offload to 'cpu' instead."
        )


def _param_names(module: nn.Module, optimizer: Optimizer) -> list[list[str | None]]:
    names = {id(p): n for n, p in module.named_parameters()}
    return [[names.get(id(p)) for p in group["params"]] for group in optimizer.param_groups]
