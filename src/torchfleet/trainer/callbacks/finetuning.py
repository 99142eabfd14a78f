"""BaseFinetuning and BackboneFinetuning: train with part of the model frozen, then unfreeze it into the optimizer.

Lightning's callbacks of the same names and behaviour. ``freeze_before_training`` runs in ``setup``, before
``configure_optimizers``, so an optimizer built over ``filter(lambda p: p.requires_grad, ...)`` leaves the frozen
part out; ``finetune_function`` runs at each training epoch's start and may add the unfrozen part as a new
parameter group. The groups added are kept in checkpoints by parameter name and rebuilt before the optimizer's
state is loaded, so a resumed run has the same groups (and optimizer state) as the uninterrupted one.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.optim import Optimizer

from torchfleet.errors import ConfigurationError
from torchfleet.trainer.callbacks.base import Callback

log = logging.getLogger("torchfleet")

Modules = nn.Module | Iterable[Any]


def multiplicative(epoch: int) -> float:
    """BackboneFinetuning's default ``lambda_func``: the backbone's learning rate doubles each epoch."""
    return 2.0


class BaseFinetuning(Callback):
    """Freeze modules before training and unfreeze them, as new parameter groups, at chosen epochs.

    Subclass it: ``freeze_before_training(pl_module)`` freezes (``self.freeze(pl_module.backbone)``),
    ``finetune_function(pl_module, epoch, optimizer)`` unfreezes
    (``self.unfreeze_and_add_param_group(pl_module.backbone, optimizer, lr=...)``), once per optimizer and epoch.
    """

    def __init__(self) -> None:
        #: per optimizer index, its parameter groups with parameter names in place of the parameters
        self._internal_optimizer_metadata: dict[int, list[dict[str, Any]]] = {}
        self._restarting = False
        self._groups_rebuilt = False
        #: the parameters this callback added to the optimizers (after the strategy wrapped the model)
        self._unfrozen: list[nn.Parameter] = []

    def state_dict(self) -> dict[str, Any]:
        return {"internal_optimizer_metadata": self._internal_optimizer_metadata}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._internal_optimizer_metadata = state_dict.get("internal_optimizer_metadata", state_dict)
        # on_load_checkpoint rebuilt the groups already when it ran (the Trainer's restore); else on_fit_start does
        self._restarting = not self._groups_rebuilt

    # -- what subclasses call --------------------------------------------------------------------
    @staticmethod
    def flatten_modules(modules: Modules) -> list[nn.Module]:
        """The modules that hold parameters themselves (leaves, or modules with their own parameters)."""
        if isinstance(modules, nn.ModuleDict):
            modules = modules.values()
        if isinstance(modules, nn.Module):
            found: Iterable[nn.Module] = modules.modules()
        else:
            found = [m for one in modules for m in BaseFinetuning.flatten_modules(one)]
        return [m for m in found if not list(m.children()) or m._parameters]

    @staticmethod
    def filter_params(modules: Modules, train_bn: bool = True, requires_grad: bool = True) -> Iterator[nn.Parameter]:
        """The parameters of ``modules`` whose ``requires_grad`` is ``requires_grad`` (BatchNorm's left out unless
        ``train_bn``)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and not train_bn:
                continue
            yield from (p for p in module.parameters(recurse=False) if p.requires_grad == requires_grad)

    @staticmethod
    def make_trainable(modules: Modules) -> None:
        """Let ``modules`` train again (BatchNorm layers track running statistics again)."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm):
                module.track_running_stats = True
            for param in module.parameters(recurse=False):
                param.requires_grad = True

    @staticmethod
    def freeze_module(module: nn.Module) -> None:
        """Stop ``module``'s own parameters from training (a BatchNorm also stops tracking statistics)."""
        if isinstance(module, _BatchNorm):
            module.track_running_stats = False
        for param in module.parameters(recurse=False):
            param.requires_grad = False

    @staticmethod
    def freeze(modules: Modules, train_bn: bool = True) -> None:
        """Freeze every module in ``modules``; BatchNorm layers keep training when ``train_bn``."""
        for module in BaseFinetuning.flatten_modules(modules):
            if isinstance(module, _BatchNorm) and train_bn:
                BaseFinetuning.make_trainable(module)
            else:
                BaseFinetuning.freeze_module(module)

    @staticmethod
    def filter_on_optimizer(optimizer: Optimizer, params: Iterable[nn.Parameter]) -> list[nn.Parameter]:
        """``params`` without those ``optimizer`` already updates (a parameter may be in one group only)."""
        present = {id(p) for group in optimizer.param_groups for p in group["params"]}
        params = list(params)
        kept = [p for p in params if id(p) not in present]
        if len(kept) != len(params):
            warnings.warn(
                f"{len(params) - len(kept)} of the parameters to unfreeze are already in {type(optimizer).__name__}'s "
                "parameter groups and are skipped: build the optimizer over the trainable parameters only, "
                f"{type(optimizer).__name__}(filter(lambda p: p.requires_grad, self.parameters()), ...).", UserWarning,
                stacklevel=3)
        return kept

    @staticmethod
    def unfreeze_and_add_param_group(modules: Modules, optimizer: Optimizer, lr: float | None = None,
                                     initial_denom_lr: float = 10.0, train_bn: bool = True) -> None:
        """Unfreeze ``modules`` and add their parameters to ``optimizer`` as a new group, at ``lr`` (default: the
        first group's learning rate divided by ``initial_denom_lr``)."""
        BaseFinetuning.make_trainable(modules)
        group_lr = optimizer.param_groups[0]["lr"] / initial_denom_lr if lr is None else float(lr)
        params = BaseFinetuning.filter_on_optimizer(optimizer, BaseFinetuning.filter_params(modules, train_bn))
        if params:
            optimizer.add_param_group({"params": params, "lr": group_lr})

    # -- what subclasses define ------------------------------------------------------------------
    def freeze_before_training(self, pl_module: Any) -> None:
        """Freeze what trains later (called in ``setup``, before ``configure_optimizers``)."""
        raise NotImplementedError(f"{type(self).__name__} must define freeze_before_training(pl_module)")

    def finetune_function(self, pl_module: Any, epoch: int, optimizer: Optimizer) -> None:
        """Unfreeze at this epoch's start, for each optimizer in turn."""
        raise NotImplementedError(f"{type(self).__name__} must define finetune_function(pl_module, epoch, optimizer)")

    # -- hooks -----------------------------------------------------------------------------------
    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        self._unfrozen = []  # a new run wraps the model again: only what this run unfreezes needs averaging
        self.freeze_before_training(pl_module)

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: dict[str, Any]) -> None:
        # before the optimizers' states are loaded: they need the groups the saved run had added
        state = checkpoint.get("callbacks", {}).get(self.state_key)
        if state is not None and trainer.optimizers:  # restored before setup (Lightning's order): on_fit_start does it
            self._rebuild_groups(trainer, pl_module, state.get("internal_optimizer_metadata", state))
            self._groups_rebuilt = True

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        if self._restarting:
            self._rebuild_groups(trainer, pl_module, self._internal_optimizer_metadata)
            self._restarting = False
        self._groups_rebuilt = False

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        names = {p: n for n, p in pl_module.named_parameters()}
        for index, optimizer in enumerate(trainer.optimizers):
            before = len(optimizer.param_groups)
            self.finetune_function(pl_module, trainer.current_epoch, optimizer)
            groups = optimizer.param_groups
            self._unfrozen.extend(p for g in groups[before:] for p in g["params"])
            known = self._internal_optimizer_metadata.setdefault(index, [])
            # the first epoch records every group; later ones the groups finetune_function added
            known.extend(_named_groups(groups if not known else groups[before:], names))

    def on_before_optimizer_step(self, trainer: Any, pl_module: Any, optimizer: Optimizer) -> None:
        # DistributedDataParallel synchronises only the parameters that trained when it wrapped the model: those
        # unfrozen since would drift apart between the ranks (as they do under Lightning), so their gradients are
        # averaged here, in one collective (sharded DTensor gradients are the sharding strategy's own)
        if trainer.world_size <= 1:
            return
        from torch.distributed.tensor import DTensor  # here: importing it costs every process about a second

        params = [p for p in self._unfrozen if not isinstance(p, DTensor)]
        if not params:
            return
        grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
        mean = trainer.strategy.reduce(torch.cat([g.reshape(-1) for g in grads]), reduce_op="mean")
        for p, piece in zip(params, torch.split(mean, [g.numel() for g in grads])):
            p.grad = piece.view_as(p).to(p.dtype)

    def _rebuild_groups(self, trainer: Any, pl_module: Any, metadata: dict[int, list[dict[str, Any]]]) -> None:
        params = dict(pl_module.named_parameters())
        for index, optimizer in enumerate(trainer.optimizers):
            saved = metadata.get(index)
            if not saved:
                continue
            missing = sorted({n for g in saved for n in g["params"]} - params.keys())
            if missing:
                raise ConfigurationError(
                    f"{type(self).__name__}'s checkpoint state names parameters {', '.join(missing[:5])} that "
                    f"{type(pl_module).__name__} does not have: resume with the model that was saved.")
            for group in saved[len(optimizer.param_groups):]:  # the groups finetune_function had added
                members = [params[n] for n in group["params"]]
                ids = {id(p) for p in members}
                self.make_trainable([m for m in pl_module.modules()
                                     if any(id(p) in ids for p in m.parameters(recurse=False))])
                optimizer.add_param_group({**group, "params": members})
                self._unfrozen.extend(members)


def _named_groups(groups: list[dict[str, Any]], names: dict[Any, str]) -> list[dict[str, Any]]:
    """Parameter groups with each parameter replaced by its name (plain values, for checkpoints)."""
    return [{**{k: v for k, v in g.items() if k != "params"}, "params": [names[p] for p in g["params"]]}
            for g in groups]


class BackboneFinetuning(BaseFinetuning):
    """Train with ``pl_module.backbone`` frozen until ``unfreeze_backbone_at_epoch``, then train it too, in a new
    parameter group whose learning rate starts low and grows each epoch towards the model's.

    The backbone's first learning rate is ``backbone_initial_lr``, or the optimizer's first group's times
    ``backbone_initial_ratio_lr``; each later epoch multiplies it by ``lambda_func(epoch + 1)``, capped at the first
    group's learning rate when ``should_align``. ``train_bn``: BatchNorm layers train while frozen.
    """

    def __init__(self, unfreeze_backbone_at_epoch: int = 10, lambda_func: Callable[[int], float] = multiplicative,
                 backbone_initial_ratio_lr: float = 10e-2, backbone_initial_lr: float | None = None,
                 should_align: bool = True, initial_denom_lr: float = 10.0, train_bn: bool = True,
                 verbose: bool = False, rounding: int = 12) -> None:
        super().__init__()
        self.unfreeze_backbone_at_epoch, self.train_bn = unfreeze_backbone_at_epoch, train_bn
        # the backbone's learning rate: where it starts, how it grows, and its cap
        self.backbone_initial_lr, self.backbone_initial_ratio_lr = backbone_initial_lr, backbone_initial_ratio_lr
        self.lambda_func, self.should_align, self.initial_denom_lr = lambda_func, should_align, initial_denom_lr
        self.verbose, self.rounding = verbose, rounding
        #: the backbone group's learning rate set at the latest epoch start
        self.previous_backbone_lr: float | None = None

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "previous_backbone_lr": self.previous_backbone_lr}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self.previous_backbone_lr = state_dict["previous_backbone_lr"]
        super().load_state_dict(state_dict)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if not isinstance(getattr(pl_module, "backbone", None), nn.Module):
            # "should have a nn.Module `backbone` attribute": Lightning's words, which ported tests match
            raise ConfigurationError(f"BackboneFinetuning needs the model to have a backbone: {type(pl_module).__name__} "
                                     "should have a nn.Module `backbone` attribute (the part trained later).")
        super().setup(trainer, pl_module, stage)

    def freeze_before_training(self, pl_module: Any) -> None:
        self.freeze(pl_module.backbone, train_bn=self.train_bn)

    def finetune_function(self, pl_module: Any, epoch: int, optimizer: Optimizer) -> None:
        if epoch < self.unfreeze_backbone_at_epoch:
            return
        current_lr = optimizer.param_groups[0]["lr"]
        if epoch == self.unfreeze_backbone_at_epoch:
            backbone_lr = (self.backbone_initial_lr if self.backbone_initial_lr is not None
                           else current_lr * self.backbone_initial_ratio_lr)
            self.unfreeze_and_add_param_group(pl_module.backbone, optimizer, backbone_lr, train_bn=self.train_bn,
                                              initial_denom_lr=self.initial_denom_lr)
        else:
            backbone_lr = self.lambda_func(epoch + 1) * self.previous_backbone_lr
            if self.should_align and backbone_lr > current_lr:
                backbone_lr = current_lr
            optimizer.param_groups[-1]["lr"] = backbone_lr
        self.previous_backbone_lr = backbone_lr
        if self.verbose:
            log.info("Current lr: %s, Backbone lr: %s", round(current_lr, self.rounding), round(backbone_lr, self.rounding))
