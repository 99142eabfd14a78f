"""The door between a Module and the loop that runs it: a Trainer, or a Fleet the user loops with.

Nothing else crosses between the two. A Module asks the Trainer running it only what ``ModuleRunner`` names (what
``self.trainer``, ``self.optimizers()``, ``self.manual_backward`` and ``self.clip_gradients`` need), and a Fleet only
what ``FleetRunner`` names. The loop tells the Module what it needs to know through one object, the Module's
``LoopDoor`` (``module.loop_door``): where ``self.log`` records and which hook is running. The loop writes the
door's attributes; only the Module reads them.

This file imports nothing of torchfleet: module.py, data.py and the loops import it, and it imports none of them,
so the Module and the loops do not import each other (not even for their annotations).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Mapping

    from torch import Tensor
    from torch.optim import Optimizer

__all__ = ["FleetRunner", "LoopDoor", "ModuleRunner", "ResultsSink", "Runner"]


class ResultsSink(Protocol):
    """Where ``self.log`` records a value: the Trainer's Results of the running stage (a dp replica's ReplicaLog)."""

    def log(self, fx: str, name: str, value: Any, prog_bar: bool, logger: bool, on_step: bool | None,
            on_epoch: bool | None, reduce_fx: Any, sync_dist: bool, batch_size: int | None) -> Any: ...


class LoopDoor:
    """What the loop running a Module tells it; the loop writes these attributes, the Module reads them.

    ``results``: where ``self.log`` records (None: outside a stage, or in a hook where the Trainer records nothing).
    ``current_fx``: the name of the hook running now; it decides ``self.log``'s defaults (per step, per epoch).
    ``configured``: ``configure_model`` has run for this Module in this process (it runs once).
    """

    __slots__ = ("results", "current_fx", "configured")

    def __init__(self, results: ResultsSink | None = None, current_fx: str = "", configured: bool = False) -> None:
        self.results = results
        self.current_fx = current_fx
        self.configured = configured

    def with_results(self, results: ResultsSink | None) -> LoopDoor:
        """A copy of this door that records into ``results`` (a dp replica's own, while the hook runs in threads)."""
        return LoopDoor(results, self.current_fx, self.configured)

    def __getstate__(self) -> tuple[Any, ...]:  # __slots__ without __dict__: pickled as a tuple (spawned ranks)
        return self.results, self.current_fx, self.configured

    def __setstate__(self, state: tuple[Any, ...]) -> None:
        self.results, self.current_fx, self.configured = state

    def __repr__(self) -> str:
        return f"LoopDoor(current_fx={self.current_fx!r}, results={type(self.results).__name__})"


class Runner(Protocol):
    """What a Module asks of whichever runs it, a Trainer or a Fleet (``self.global_rank``, ``self.logger``, ...)."""

    @property
    def strategy(self) -> Any: ...

    @property
    def global_rank(self) -> int: ...

    @property
    def local_rank(self) -> int: ...

    @property
    def logger(self) -> Any: ...

    @property
    def loggers(self) -> list[Any]: ...


class ModuleRunner(Runner, Protocol):
    """What a Module asks of the Trainer that runs it (``self.trainer``).

    Ported code reads more of ``self.trainer`` (it is the Trainer itself); the Module's own code reads only these.
    """

    #: ``Trainer(barebones=True)``: ``self.log`` does nothing
    barebones: bool
    optimizers: list[Optimizer]
    lr_scheduler_configs: list[Any]
    global_step: int
    current_epoch: int

    def manual_optimizers(self) -> list[Optimizer]:
        """The optimizers as ``self.optimizers()`` returns them under manual optimisation."""
        ...

    def manual_backward(self, loss: Tensor, *args: Any, **kwargs: Any) -> None:
        """The backward of ``self.manual_backward(loss)``."""
        ...

    def gradient_clip_arguments(self, gradient_clip_val: float | None,
                                gradient_clip_algorithm: str | None) -> tuple[float | None, str]:
        """What ``self.clip_gradients`` clips with: the arguments given, else the Trainer's settings."""
        ...


class FleetRunner(Runner, Protocol):
    """What a Module asks of the Fleet that set it up (``self.fabric``), when a user's loop runs it."""

    def log(self, name: str, value: Any, step: int | None = None) -> None: ...

    def log_dict(self, metrics: Mapping[str, Any], step: int | None = None) -> None: ...

    def clip_gradients(self, module: Any, optimizer: Any, clip_val: float | None = None,
                       max_norm: float | None = None, norm_type: float = 2.0,
                       error_if_nonfinite: bool = True) -> Any: ...
