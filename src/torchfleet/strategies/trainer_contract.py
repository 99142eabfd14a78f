"""Lightning's Trainer contract, the base of every Strategy: what Lightning's Trainer calls on a strategy, under its names.

A strategy written for PyTorch Lightning's Trainer (a subclass overriding ``setup(self, trainer)``,
``configure_ddp``, ``training_step``, ``optimizer_step(optimizer, closure, model)``, ``on_train_start``, ...)
ports by changing its imports: torchfleet's Trainer calls these methods at the points, as often and with the
arguments Lightning's does, and uses what they return as Lightning does (docs/strategy_hooks.md has the
order). Their defaults are built on the methods the strategy shares with Fleet, whose contract is Fabric's
(``setup_module_and_optimizers``, ``run_backward``, ``step_function``, ``module_state_dict``, ...), so both
clients drive one class tree. Per batch, the Trainer calls one of these only when the strategy's class
overrides it (``user_overrides``, decided once per stage); the defaults do exactly what the Trainer does
without them, so a strategy that overrides none costs nothing more per step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn
from torch.optim import Optimizer

if TYPE_CHECKING:
    from torchfleet.settings import TrainerStage

#: the Trainer's per-batch calls of the contract: made only when the strategy's class overrides the method
PER_BATCH_HOOKS = (
    "batch_to_device", "on_train_batch_start", "optimizer_step", "training_step", "post_training_step", "backward",
    "pre_backward", "post_backward", "block_backward_sync", "validation_step", "test_step", "predict_step",
)
#: the per-batch hooks that run inside the optimizer step's closure in Lightning: overriding any of them makes the
#: Trainer run training_step and backward inside ``optimizer_step(optimizer, closure)``
CLOSURE_HOOKS = ("optimizer_step", "training_step", "post_training_step", "backward", "pre_backward", "post_backward")


_STEP_CONTEXTS = {"training_step": "train_step_context", "validation_step": "val_step_context",
                  "test_step": "test_step_context", "predict_step": "predict_step_context"}


def user_overrides(strategy: Any, names: Iterable[str] = PER_BATCH_HOOKS) -> frozenset[str]:
    """The ``names`` that ``strategy``'s class defines anew below torchfleet's own strategy classes.

    torchfleet's classes (``torchfleet.strategies.*``) implement these hooks as what the Trainer does without
    calling them; a subclass of yours (or a third party's) changes that, and the Trainer then calls the hook.
    Read from the class, so a profiler's instance wrappers do not count.
    """
    cls = type(strategy)
    own = next(c for c in cls.__mro__ if c.__module__.startswith("torchfleet.strategies"))
    return frozenset(n for n in names if getattr(cls, n, None) is not getattr(own, n, None))


class TrainerContract:
    """Lightning's ``Strategy`` methods and properties that its Trainer uses, with Lightning's signatures.

    State: ``lightning_module`` (the Module, set by ``connect``), ``model`` (what the steps run through: the
    Module, or its DDP wrapper / sharded module / DeepSpeed engine after ``setup``), ``optimizers`` and
    ``lr_scheduler_configs`` (built in ``setup`` when fitting). Fleet never sets them: it passes its modules
    to the Fabric-shaped methods instead.
    """

    _lightning_module: Any = None
    _model: nn.Module | None = None
    _optimizers: list[Optimizer] | None = None
    #: Lightning's ``lr_scheduler_configs``: the LRSchedulerConfig objects ``setup_optimizers`` built
    lr_scheduler_configs: list[Any] = []  # noqa: RUF012 - replaced, never mutated: setup assigns a new list
    _stage: TrainerStage | None = None

    def configure_stage(self, stage: TrainerStage | None) -> None:
        """Receive what the Trainer's stage gives ``setup(trainer)`` and ``backward`` (before ``setup``; None after)."""
        self._stage = stage

    # ------------------------------------------------------------------ the Module and its wrapper
    @property
    def lightning_module(self) -> Any:
        """The Trainer's Module, never a wrapper (None outside a Trainer stage's ``connect``)."""
        return self._lightning_module

    @property
    def model(self) -> nn.Module | None:
        """What the steps run through: the Module's wrapper after ``setup`` (DDP, sharded, the engine), else the Module."""
        return self._model if self._model is not None else self._lightning_module

    @model.setter
    def model(self, model: nn.Module | None) -> None:
        self._model = model

    @property
    def optimizers(self) -> list[Optimizer]:
        """The optimizers ``setup`` built for a fit (empty otherwise)."""
        return self._optimizers if self._optimizers is not None else []

    @optimizers.setter
    def optimizers(self, optimizers: list[Optimizer]) -> None:
        self._optimizers = list(optimizers)

    def connect(self, model: Any) -> None:
        """Take the Trainer's Module, first in every stage (Lightning's order); nothing is converted or moved yet."""
        self._lightning_module = model
        self.model = model

    # ------------------------------------------------------------------ setup
    def setup(self, trainer: Any) -> None:
        """Place and wrap ``self.model``; when fitting, build the optimizers (``setup_optimizers``) around that.

        The order of wrapping and building is the strategy's (``setup_and_build_optimizers``: ddp wraps first,
        fsdp shards first, DeepSpeed builds its engine from both); outside fit, ``setup_for_evaluation``.
        Ends with ``setup_precision_plugin``. ``trainer`` is passed on to ``setup_optimizers`` (an override may
        read it); the defaults take what they need from ``configure_stage``.
        """
        if self.accelerator is not None:  # type: ignore[attr-defined]
            self.accelerator.setup(trainer)  # type: ignore[attr-defined]
        self.model_to_device()
        stage = self._stage
        module = self.model
        assert module is not None, "connect(model) comes before setup(trainer)"
        if stage is not None and stage.fitting:
            def build() -> list[Optimizer]:
                self.setup_optimizers(trainer)
                return self.optimizers

            self.model, self.optimizers = self.setup_and_build_optimizers(module, build)  # type: ignore[attr-defined]
        else:
            self._optimizers, self.lr_scheduler_configs = None, []  # none from an earlier fit
            self.model = self.setup_for_evaluation(module)  # type: ignore[attr-defined]
        self.setup_precision_plugin()

    def model_to_device(self) -> None:
        """Move ``self.model`` to ``root_device`` (in place, as Lightning's: nothing is assigned)."""
        assert self.model is not None
        self.module_to_device(self.model)  # type: ignore[attr-defined]

    def setup_optimizers(self, trainer: Any) -> None:
        """Build ``optimizers`` and ``lr_scheduler_configs`` from the Module's ``configure_optimizers``."""
        stage = self._stage
        if stage is None or stage.build_optimizers is None:
            self.optimizers, self.lr_scheduler_configs = [], []
            return
        self.optimizers, self.lr_scheduler_configs = stage.build_optimizers()

    def setup_precision_plugin(self) -> None:
        """Let the precision adapt the model, optimizers and schedulers (``Precision.connect``) and keep what it returns."""
        model, optimizers, configs = self.precision.connect(  # type: ignore[attr-defined]
            self.model, self.optimizers, self.lr_scheduler_configs)
        self.model = model
        self.optimizers = optimizers
        self.lr_scheduler_configs = configs

    @contextlib.contextmanager
    def model_sharded_context(self) -> Iterator[None]:
        """Where ``configure_model`` creates the Module's layers (inside ``tensor_init_context``); sharded strategies
        create them on the meta device here. Default: nothing changes."""
        yield

    # ------------------------------------------------------------------ what the Trainer reads
    @property
    def restore_checkpoint_after_setup(self) -> bool:
        """Whether the Trainer loads a checkpoint's module state after ``setup`` (sharded modules), not before."""
        return False

    @property
    def lightning_restore_optimizer(self) -> bool:
        """Whether the Trainer restores the optimizers and schedulers (False: the strategy does it itself)."""
        return True

    @property
    def handles_gradient_accumulation(self) -> bool:
        """Whether the strategy accumulates gradients itself: the Trainer then steps every batch, undivided."""
        return False

    # ------------------------------------------------------------------ checkpoints
    def lightning_module_state_dict(self) -> dict[str, Any]:
        """The ``state_dict`` entry of a Trainer checkpoint: the Module's state, as this strategy saves it."""
        assert self.model is not None
        return self.module_state_dict(self.model)  # type: ignore[attr-defined]

    def optimizer_state(self, optimizer: Optimizer) -> dict[str, Any]:
        """One entry of a Trainer checkpoint's ``optimizer_states``, as this strategy saves it."""
        return self.optimizer_state_dict(optimizer)  # type: ignore[attr-defined]

    def load_model_state_dict(self, checkpoint: Mapping[str, Any], strict: bool = True) -> None:
        """Load ``checkpoint["state_dict"]`` (``checkpoint``: the whole dict ``load_checkpoint`` returned) into the Module."""
        assert self.model is not None
        self.load_into(checkpoint, {"state_dict": self.model}, strict=strict,  # type: ignore[attr-defined]
                       path=self._restoring)  # type: ignore[attr-defined]

    def load_optimizer_state_dict(self, checkpoint: Mapping[str, Any]) -> None:
        """Load ``checkpoint["optimizer_states"]`` into ``optimizers``, in order."""
        self.load_into(checkpoint, {"optimizer_states": self.optimizers},  # type: ignore[attr-defined]
                       path=self._restoring)  # type: ignore[attr-defined]

    # ------------------------------------------------------------------ steps
    def _run_step(self, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        assert self.model is not None
        with self._step_context(name):
            return self.step_function(self.model, name)(*args, **kwargs)  # type: ignore[attr-defined]

    def _step_context(self, name: str) -> Any:
        """The precision's ``<stage>_step_context`` (Lightning's), unless this strategy replaces ``forward_context``."""
        owner = next(c for c in type(self).__mro__ if "forward_context" in vars(c))
        if owner.__module__ != "torchfleet.strategies.strategy":
            return self.forward_context()  # type: ignore[attr-defined]
        return getattr(self.precision, _STEP_CONTEXTS[name])()  # type: ignore[attr-defined]

    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """Run the Module's ``training_step`` through the wrapper (inside DDP's forward), under the precision."""
        return self._run_step("training_step", args, kwargs)

    def post_training_step(self) -> None:
        """Called right after ``training_step`` (deprecated in Lightning; still called, as there)."""

    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        """Run the Module's ``validation_step`` (outside DDP's forward: uneven shards cannot hang)."""
        return self._run_step("validation_step", args, kwargs)

    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        """Run the Module's ``test_step``."""
        return self._run_step("test_step", args, kwargs)

    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        """Run the Module's ``predict_step``."""
        return self._run_step("predict_step", args, kwargs)

    def backward(self, closure_loss: Tensor, optimizer: Optimizer | None, *args: Any, **kwargs: Any) -> Tensor:
        """Backpropagate ``closure_loss`` (already divided for accumulation); returns it, as Lightning's does.

        ``pre_backward`` (the strategy's, then the precision's, which may return another tensor), the Module's and
        callbacks' ``on_before_backward``, the precision's backward (through the wrapper: ``run_backward``),
        ``on_after_backward``, ``post_backward`` (the strategy's, then the precision's). ``optimizer`` is the one that will
        step (None in manual optimisation); extra arguments go to ``Tensor.backward``.
        """
        self.pre_backward(closure_loss)
        precision = self.precision  # type: ignore[attr-defined]
        closure_loss = precision.pre_backward(closure_loss, self.lightning_module)
        stage = self._stage
        if stage is not None and stage.before_backward is not None:
            stage.before_backward(closure_loss)
        self._stepping = optimizer
        try:
            self.run_backward(closure_loss, self.model, *args, **kwargs)  # type: ignore[attr-defined]
        finally:
            self._stepping = None
        if stage is not None and stage.after_backward is not None:
            stage.after_backward()
        self.post_backward(closure_loss)
        precision.post_backward(closure_loss, self.lightning_module)
        return closure_loss

    def pre_backward(self, closure_loss: Tensor) -> None:
        """Called before the precision's backward."""

    def post_backward(self, closure_loss: Tensor) -> None:
        """Called after the precision's backward."""

    @contextlib.contextmanager
    def block_backward_sync(self) -> Iterator[None]:
        """Around training_step and backward of a micro-batch that does not step: no gradient synchronisation."""
        assert self.model is not None
        with self.no_backward_sync(self.model):  # type: ignore[attr-defined]
            yield

    # ------------------------------------------------------------------ stage events (called after the Callbacks' and Module's)
    def on_train_start(self) -> None:
        """Training begins (after the sanity check)."""

    def on_train_end(self) -> None:
        """Training ended (not after an exception)."""

    def on_validation_start(self) -> None:
        """A validation run begins (the sanity check's too)."""

    def on_validation_end(self) -> None:
        """A validation run ended."""

    def on_test_start(self) -> None:
        """Testing begins."""

    def on_test_end(self) -> None:
        """Testing ended."""

    def on_predict_start(self) -> None:
        """Prediction begins."""

    def on_predict_end(self) -> None:
        """Prediction ended."""

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        """A training batch begins (after ``batch_to_device`` and the Callbacks' and Module's hook of this name)."""

    @classmethod
    def register_strategies(cls, strategy_registry: Any) -> None:
        """Lightning registers its own classes' names through this at import; torchfleet's live in
        strategies/registry.py and a package's come through the ``torchfleet.strategies`` entry points."""
