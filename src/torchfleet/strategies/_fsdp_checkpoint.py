"""FSDPStrategy's checkpoints: sharded state dicts for the DCP files, and loading any layout into sharded modules.

What a sharded module loads from:

* a "dcp" directory: every rank reads the parts of the saved tensors that overlap its own shards
  (any world size wrote it), straight into its parameters and optimizer state;
* a single file (ddp, single_device, ``state_dict_type="full"``, ``torchfleet consolidate``): every
  rank reads the whole file and keeps its shards;
* a "deepspeed" directory: consolidated in each process first, then as a single file.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from torch import nn
from torch.optim import Optimizer

from torchfleet.checkpoint.dcp import (
    DCPEntry,
    DCPStateDict,
    files_problem,
    load_dcp_into,
    optimizer_state_to_fqn,
    optimizer_state_to_positional,
    saved_keys,
)
from torchfleet.checkpoint.state import (
    MODULE,
    paired_optimizer_states,
    stateful_entries,
)
from torchfleet.errors import CheckpointError, ConfigurationError


class ShardedStrategy(Protocol):
    """What these functions read of FSDPStrategy (a Protocol, so that fsdp.py alone imports this module)."""

    state_dict_type: str

    @property
    def world_size(self) -> int: ...
    @property
    def global_rank(self) -> int: ...
    @property
    def is_global_zero(self) -> bool: ...
    def modules_set_up(self) -> list[nn.Module]: ...
    def all_gather_object(self, obj: Any, name: str | None = None) -> list[Any]: ...


def _options(**kwargs: Any) -> Any:
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(**kwargs)


def module_of(strategy: ShardedStrategy, optimizer: Optimizer) -> nn.Module:
    """The sharded module whose parameters ``optimizer`` updates."""
    ids = {id(p) for g in optimizer.param_groups for p in g["params"]}
    for module in strategy.modules_set_up():
        if any(id(p) in ids for p in module.parameters()):
            return module
    raise ConfigurationError(
        f"The {type(optimizer).__name__} holds no parameter of a module the fsdp strategy has set up, so its sharded "
        "state cannot be saved or loaded. Set up the model first, then build the optimizer over model.parameters()."
    )


def param_names(module: nn.Module, optimizer: Optimizer) -> list[list[str]]:
    """The names (in ``module``) of the optimizer's parameters, group by group."""
    names = {id(p): n for n, p in module.named_parameters()}
    out = []
    for group in optimizer.param_groups:
        unknown = sum(1 for p in group["params"] if id(p) not in names)
        if unknown:
            raise ConfigurationError(
                f"The {type(optimizer).__name__} holds {unknown} parameter(s) that are not in the "
                f"{type(module).__name__} it was set up with; build one optimizer per model, over its parameters."
            )
        out.append([names[id(p)] for p in group["params"]])
    return out


def module_state(strategy: ShardedStrategy, module: nn.Module) -> dict[str, Any]:
    """What the checkpoint holds for ``module`` (see FSDPStrategy.module_state_dict)."""
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    if strategy.state_dict_type == "full":
        # gathered shard by shard onto rank 0's CPU memory; the other ranks get {}
        return get_model_state_dict(module, options=_options(full_state_dict=True, cpu_offload=True))
    return DCPStateDict(get_model_state_dict(module), kind="module")


def optimizer_state(strategy: ShardedStrategy, optimizer: Optimizer) -> dict[str, Any]:
    """What the checkpoint holds for ``optimizer`` (see FSDPStrategy.optimizer_state_dict)."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    module = module_of(strategy, optimizer)
    full = strategy.state_dict_type == "full"
    if not optimizer.state:
        # nothing stepped yet; torch's helper would take a zero step to create the state, changing e.g. Adam's count
        positional = optimizer.state_dict()
        return positional if full else DCPStateDict(
            optimizer_state_to_fqn(positional, param_names(module, optimizer)), kind="optimizer")
    if full:
        state = get_optimizer_state_dict(module, optimizer, options=_options(full_state_dict=True, cpu_offload=True))
        return optimizer_state_to_positional(state) if strategy.is_global_zero else {}
    return DCPStateDict(get_optimizer_state_dict(module, optimizer), kind="optimizer")


def load_into(
    strategy: ShardedStrategy, checkpoint: Mapping[str, Any], state: Mapping[str, Any], strict: bool = True,
    path: Any = None,
) -> None:
    """Load the entries of ``checkpoint`` into the sharded modules and optimizers under the same keys in ``state``.

    Entries still in DCP files are loaded together, in one pass over the files, after every one
    of them was checked against the checkpoint's names and shapes.
    """
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    _agree_files_load(strategy, checkpoint, state)
    template: dict[str, Any] = {}
    finish = []
    dcp_path: str | None = None
    weights_only = True
    for key, target, kind, entry in stateful_entries(checkpoint, state, path):
        if kind == MODULE:
            if isinstance(entry, DCPEntry):
                dcp_path, weights_only = entry.path, entry.weights_only
                model_state = template[key] = _module_template(target)
                finish.append(lambda m=target, s=model_state: set_model_state_dict(m, s, options=_options(strict=strict)))
            else:
                _load_whole_module(target, entry, strict, path)
            continue
        states = []
        for optimizer, saved in paired_optimizer_states(key, target, entry, path):
            module = module_of(strategy, optimizer)
            if isinstance(saved, DCPEntry):
                dcp_path, weights_only = saved.path, saved.weights_only
                opt_state = _optimizer_template(module, optimizer, saved)
                states.append(opt_state)
                finish.append(lambda m=module, o=optimizer, s=opt_state: _set_optimizer(m, o, s))
            else:
                _load_whole_optimizer(module, optimizer, saved)
        if states:
            template[key] = states if isinstance(entry, list) else states[0]
    if template:
        assert dcp_path is not None
        load_dcp_into(dcp_path, template, strict=strict, weights_only=weights_only)
        for step in finish:
            step()


def _agree_files_load(strategy: ShardedStrategy, checkpoint: Mapping[str, Any], state: Mapping[str, Any]) -> None:
    """Raise the same CheckpointError on every rank when the DCP files this load reads cannot be read on any rank.

    A rank that failed alone, before DCP's collective read, would leave the others waiting in it; and
    DCP's own report of a failed read is a traceback per rank.
    """
    entries = [e for k in state for v in [checkpoint.get(k)] for e in (v if isinstance(v, list) else [v])
               if isinstance(e, DCPEntry)]
    if not entries:
        return
    # the ranks share the comparison of the files with the save's record, then agree
    problem = files_problem(entries[0].path, entries[0].weights_only, (strategy.global_rank, strategy.world_size))
    if strategy.world_size > 1:
        problem = next((p for p in strategy.all_gather_object(problem, name="checkpoint files check") if p), None)
    if problem is not None:
        raise CheckpointError(problem)


def _module_template(module: nn.Module) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import get_model_state_dict

    return get_model_state_dict(module)


def _optimizer_template(module: nn.Module, optimizer: Optimizer, entry: DCPEntry) -> dict[str, Any]:
    """An FQN-keyed state dict of ``optimizer`` with this rank's shapes, to be filled from the DCP files."""
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    has_state = any(k.startswith(f"{entry.prefix}.state.") for k in saved_keys(entry.path, entry.weights_only))
    if not has_state:
        # saved before its first step: only the hyperparameters (param_groups) are to be loaded
        return optimizer_state_to_fqn({"state": {}, "param_groups": optimizer.state_dict()["param_groups"]},
                                      param_names(module, optimizer))
    # creates the optimizer's state (a zero step at lr 0) where it has none, so every tensor has a place to load into
    return get_optimizer_state_dict(module, optimizer)


def _set_optimizer(module: nn.Module, optimizer: Optimizer, named: dict[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    if not named["state"]:  # hyperparameters only: torch's helper would create state with a zero step first
        optimizer.load_state_dict(optimizer_state_to_positional(named))
    else:
        set_optimizer_state_dict(module, optimizer, named)


def _load_whole_module(module: nn.Module, saved: Mapping[str, Any], strict: bool, path: Any) -> None:
    from torch.distributed.checkpoint.state_dict import set_model_state_dict

    from torchfleet.checkpoint.state import state_dict_mismatch

    if not isinstance(saved, Mapping):
        raise CheckpointError(f"The checkpoint {path} holds a {type(saved).__name__} where a state dict was expected.")
    problem = state_dict_mismatch(module, saved, strict=strict)
    if problem:
        raise CheckpointError(
            f"The checkpoint's weights do not fit {type(module).__name__}: {problem}. The model's architecture or its "
            "hyperparameters differ from the run that wrote the checkpoint; build the model with the same arguments, "
            "or load with strict=False to skip missing and extra keys."
        )
    # each rank holds the whole state and keeps the parts that fall in its shards (a copy: the call may change it)
    set_model_state_dict(module, dict(saved), options=_options(full_state_dict=True, strict=strict))


def _load_whole_optimizer(module: nn.Module, optimizer: Optimizer, saved: Mapping[str, Any]) -> None:
    from torch.distributed.checkpoint.state_dict import set_optimizer_state_dict

    named = optimizer_state_to_fqn(saved, param_names(module, optimizer))
    if not named["state"]:
        optimizer.load_state_dict(optimizer_state_to_positional(named))
        return
    set_optimizer_state_dict(module, optimizer, named, options=_options(full_state_dict=True))
