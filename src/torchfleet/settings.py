"""What strategies are told about the training they serve: TrainingSettings, ReplicaHooks (dp's replicas), TrainerStage.

Strategies never read the Trainer or the Module's logging. The caller (the Trainer, or a Fleet user)
hands them these at ``Strategy.configure_training``, before ``setup``.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from torchfleet.errors import ConfigurationError

if TYPE_CHECKING:
    import torch
    from torch import nn

CLIP_ALGORITHMS = ("norm", "value")


def clip_arguments(given_val: float | None, given_algorithm: str | None, trainer_val: float | None,
                   trainer_algorithm: str | None) -> tuple[float | None, str]:
    """What ``Module.clip_gradients`` clips with inside a Trainer: the Trainer's settings where none are given; a
    value that differs from one the Trainer was given is refused (they would fight over every step), as Lightning."""
    for name, given, trainers in (("gradient_clip_val", given_val, trainer_val),
                                  ("gradient_clip_algorithm", given_algorithm, trainer_algorithm)):
        if given is not None and trainers is not None and given != trainers:
            # "You have set `Trainer(x=...)` and have passed `clip_gradients(x=...)`": Lightning's words
            raise ConfigurationError(
                f"You have set `Trainer({name}={trainers!r})` and have passed `clip_gradients({name}={given!r})`: "
                "use only one of them (or call clip_gradients without it to use the Trainer's).")
    algorithm = str(given_algorithm if given_algorithm is not None else trainer_algorithm or "norm").lower()
    return (given_val if given_val is not None else trainer_val), algorithm


@dataclass(frozen=True)
class TrainingSettings:
    """How the caller trains, for strategies that must know it ahead of the loop (DeepSpeed's config).

    ``accumulate_grad_batches``: batches whose gradients add up before one optimizer step.
    ``gradient_clip_val`` (None or 0: no clipping) and ``gradient_clip_algorithm`` ("norm" or "value").
    ``micro_batch_size``: the batch size of one process's step (None: taken from the training
    DataLoader the strategy prepared, else 1).
    ``manual_optimization``: the caller runs backward and steps the optimizers itself (a Module with
    ``automatic_optimization = False``), possibly several backward passes per forward (GANs).
    ``sync_batchnorm``: data-parallel strategies turn BatchNorm layers into SyncBatchNorm.
    """

    accumulate_grad_batches: int = 1
    gradient_clip_val: float | None = None
    gradient_clip_algorithm: str = "norm"
    micro_batch_size: int | None = None
    manual_optimization: bool = False
    sync_batchnorm: bool = False

    def __post_init__(self) -> None:
        accumulate = self.accumulate_grad_batches
        if isinstance(accumulate, bool) or not isinstance(accumulate, int) or accumulate < 1:
            raise ConfigurationError(f"accumulate_grad_batches={accumulate!r} is not valid: it must be an int >= 1.")
        clip = self.gradient_clip_val
        if clip is not None and (isinstance(clip, bool) or not isinstance(clip, (int, float)) or clip < 0):
            raise ConfigurationError(f"gradient_clip_val={clip!r} is not valid: give a number >= 0 or None.")
        if self.gradient_clip_algorithm not in CLIP_ALGORITHMS:
            raise ConfigurationError(
                f"gradient_clip_algorithm={self.gradient_clip_algorithm!r} is not supported. Accepted values are "
                "'norm' and 'value'."
            )
        size = self.micro_batch_size
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ConfigurationError(
                f"micro_batch_size={size!r} is not valid: give the per-process batch size as an int >= 1, or None to "
                "take it from the training DataLoader."
            )


def loader_batch_size(loader: Any) -> int | None:
    """The batch size of ``loader`` (a DataLoader, or one with a batch sampler); None when it has none."""
    size = getattr(loader, "batch_size", None) or getattr(getattr(loader, "batch_sampler", None), "batch_size", None)
    return size if isinstance(size, int) and size > 0 else None


class ReplicaHooks(Protocol):
    """What a strategy that runs a hook on copies of the module in one process (dp) calls around the copies.

    ``enter`` runs in each replica's thread before the hook, with that replica's copy of the user's
    module, and returns what the replica collects (None: nothing). ``merge`` runs once in the main
    thread afterwards, with the original module, the non-None values ``enter`` returned (in replica
    order) and the device the outputs are gathered on.
    """

    def enter(self, replica: nn.Module) -> Any: ...

    def merge(self, module: nn.Module, collected: list[Any], device: torch.device) -> None: ...


@dataclass(frozen=True)
class TrainerStage:
    """What one Trainer stage gives the strategy's Lightning-contract methods, before ``setup(trainer)``.

    Lightning's ``Strategy.setup(trainer)`` builds the optimizers from the LightningModule and its ``backward``
    runs the Module's and callbacks' ``on_before_backward``/``on_after_backward``; torchfleet's strategies never
    read the Trainer, so the Trainer hands them these instead (``Strategy.configure_stage``).

    ``fn``: "fit", "validate", "test" or "predict". ``build_optimizers``: ``configure_optimizers()`` parsed and
    checked, as ``(optimizers, lr_scheduler_configs)`` (fit only; None otherwise). ``before_backward(loss)`` and
    ``after_backward()``: the Module's and callbacks' hooks of those names, or None when none overrides them.
    """

    fn: str
    build_optimizers: Callable[[], tuple[list[Any], list[Any]]] | None = None
    before_backward: Callable[[Any], None] | None = None
    after_backward: Callable[[], None] | None = None

    @property
    def fitting(self) -> bool:
        """Whether the stage trains (``fn == "fit"``): only then are optimizers built and DDP wraps the module."""
        return self.fn == "fit"
