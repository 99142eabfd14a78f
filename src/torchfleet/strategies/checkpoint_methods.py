"""How a strategy saves and loads: state dicts of modules and optimizers, checkpoint files, loading into objects.

A base of Strategy (split from strategy.py by job). ``save_checkpoint(checkpoint, filepath)`` and
``load_checkpoint(checkpoint_path)`` have Lightning's Trainer signatures; ``save_state`` / ``load_state`` are
Fabric's ``save_checkpoint(path, state)`` / ``load_checkpoint(path, state)``, for Fleet. Sharded strategies
override the per-object methods (``module_state_dict``, ``load_into``, ...) and the file layout.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from torch import nn
from torch.optim import Optimizer

from torchfleet.checkpoint.consolidate import read_full_checkpoint
from torchfleet.checkpoint.io import load_through
from torchfleet.checkpoint.state import (
    MODULE,
    load_state_dict_checked,
    map_stateful,
    paired_optimizer_states,
    stateful_entries,
)

if TYPE_CHECKING:
    from torchfleet.checkpoint.io import CheckpointIO


class CheckpointMethods:
    """The checkpoint half of a Strategy: what a save writes and who writes it, what a load reads and where it goes."""

    #: the checkpoint being restored (``load_checkpoint``), named in the errors of the loads that follow it
    _restoring: Any = None
    # Strategy's, used here
    checkpoint_io: CheckpointIO
    is_global_zero: bool
    unwrap: Callable[[nn.Module], nn.Module]

    def module_state_dict(self, module: nn.Module) -> dict[str, Any]:
        """The full (unsharded) state dict of the user's module inside ``module``."""
        return self.unwrap(module).state_dict()

    def load_module_state_dict(self, module: nn.Module, state: Mapping[str, Any], strict: bool = True) -> None:
        """Load ``state`` into the user's module inside ``module``."""
        load_state_dict_checked(self.unwrap(module), state, strict=strict)

    def optimizer_state_dict(self, optimizer: Optimizer) -> dict[str, Any]:
        """The state dict of ``optimizer`` as this strategy saves it."""
        return optimizer.state_dict()

    def load_optimizer_state(self, optimizer: Optimizer, state: Mapping[str, Any]) -> None:
        """Load one optimizer's saved ``state`` into ``optimizer``."""
        optimizer.load_state_dict(state)

    def state_for_saving(self, state: Mapping[str, Any]) -> dict[str, Any]:
        """``state`` with its modules and optimizers replaced by their state dicts (as this strategy saves them)."""
        return map_stateful(state, self.module_state_dict, self.optimizer_state_dict)

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: str | os.PathLike, storage_options: Any | None = None
    ) -> None:
        """Write ``checkpoint`` (plain values and state dicts, as ``state_for_saving`` makes them) to ``filepath``.

        Every process calls this; the strategy decides who writes (here: rank 0).
        """
        if self.is_global_zero:
            self.checkpoint_io.save_checkpoint(checkpoint, filepath, storage_options=storage_options)

    def save_state(self, path: str | os.PathLike, state: Mapping[str, Any], storage_options: Any | None = None) -> None:
        """Write ``state``, whose modules and optimizers are turned into state dicts here (Fabric's ``save_checkpoint``)."""
        self.save_checkpoint(self.state_for_saving(state), path, storage_options=storage_options)

    def load_checkpoint(self, checkpoint_path: str | os.PathLike, weights_only: bool | None = None) -> dict[str, Any]:
        """Read the checkpoint at ``checkpoint_path`` whole (a file, or a sharded directory of any layout).

        Nothing in the file runs (``weights_only``); ``weights_only=False`` trusts it. None: the CheckpointIO's
        setting. Sharded strategies leave their own shards on disk here, for ``load_into`` to read in place.
        """
        self._restoring = checkpoint_path
        if os.path.isdir(checkpoint_path):
            # a sharded checkpoint (any layout, any world size), read whole into this process
            return read_full_checkpoint(checkpoint_path, weights_only=self.resolve_weights_only(weights_only))
        return load_through(self.checkpoint_io, checkpoint_path, weights_only=weights_only)  # as Lightning's

    def load_state(
        self, path: str | os.PathLike, state: Mapping[str, Any] | None = None, strict: bool = True,
        weights_only: bool | None = None,
    ) -> dict[str, Any]:
        """Read the checkpoint at ``path``, load it into the modules/optimizers in ``state``, return it whole.

        Fabric's ``load_checkpoint(path, state, strict)`` (Fleet's ``load``).
        """
        checkpoint = self.load_checkpoint(path, weights_only=weights_only)
        self.load_into(checkpoint, state or {}, strict=strict, path=path)
        return checkpoint

    def resolve_weights_only(self, weights_only: bool | None) -> bool:
        """Whether a load reads files without running code from them: ``weights_only``, else the CheckpointIO's setting."""
        return self.checkpoint_io.weights_only if weights_only is None else bool(weights_only)

    def load_into(
        self, checkpoint: Mapping[str, Any], state: Mapping[str, Any], strict: bool = True, path: Any = None
    ) -> None:
        """Load the entries of ``checkpoint`` into the modules and optimizers found under the same keys in ``state``."""
        for key, target, kind, saved in stateful_entries(checkpoint, state, path):
            if kind == MODULE:
                self.load_module_state_dict(target, saved, strict=strict)
            else:
                for opt, opt_state in paired_optimizer_states(key, target, saved, path):
                    self.load_optimizer_state(opt, opt_state)

    def remove_checkpoint(self, filepath: str | os.PathLike) -> None:
        """Delete a checkpoint through the CheckpointIO (rank 0 only)."""
        if self.is_global_zero:
            self.checkpoint_io.remove_checkpoint(filepath)

