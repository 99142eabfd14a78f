"""The ``group`` of a collective: a process group, a device mesh dimension (by name or as a 1-D DeviceMesh), checked.

``resolve_group(strategy, group, what)`` turns what the user gave into the process group the collective runs over
(None: every rank) and its text for the watchdog (torchfleet.watchdog.group_text: the mesh dimension's name when
known, and the group's ranks). A rank that is not a member of the group gets ``GroupMembershipError`` at once,
instead of torch's silent no-op (a non-member's tensor comes back unreduced) or a hang.
"""

from __future__ import annotations

from typing import Any

from torchfleet.errors import ConfigurationError, TorchfleetError
from torchfleet.watchdog import group_text

#: process group -> its watchdog text (a group's ranks and mesh dimension never change): the hot path reads this
_TEXTS: dict[Any, str] = {}
_REDUCE_OPS = frozenset({"mean", "avg", "sum", "max", "min"})


class GroupMembershipError(TorchfleetError, RuntimeError):
    """A rank called a collective over a group (a mesh dimension) that it is not a member of."""


def resolve_group(strategy: Any, group: Any, what: str) -> tuple[Any, str]:
    """(the process group ``what`` runs over, None for every rank; its watchdog text, "" for every rank)."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import DeviceMesh

    if group is None or group is dist.group.WORLD:
        return None, ""
    text = _TEXTS.get(group) if not isinstance(group, (str, DeviceMesh)) else None
    if text is not None:
        return group, text
    name = None
    if isinstance(group, str):
        name, group = group, _dimension(strategy, group, what)
    if isinstance(group, DeviceMesh):
        if group.ndim != 1:
            raise ConfigurationError(
                f"{what}(group=...) got a {group.ndim}-D DeviceMesh {tuple(group.mesh_dim_names or ())}: a "
                "collective runs over one dimension. Pick it, e.g. group=self.device_mesh['tensor_parallel'] or "
                "group='tensor_parallel'."
            )
        name = name or (group.mesh_dim_names[0] if group.mesh_dim_names else None)
        if group.get_coordinate() is None:
            raise _not_member(what, group.mesh.flatten().tolist(), name, dist.get_rank())
        group = group.get_group()
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        raise _not_member(what, None, name, dist.get_rank())
    ranks = dist.get_process_group_ranks(group)
    if dist.get_rank() not in ranks:
        raise _not_member(what, ranks, name, dist.get_rank())
    text = _TEXTS[group] = group_text(ranks, name or _dimension_of(strategy, group))
    return group, text


def _dimension(strategy: Any, name: str, what: str) -> Any:
    """The 1-D mesh of the strategy's device mesh dimension ``name``."""
    mesh = getattr(strategy, "module_device_mesh", None)
    names = tuple(mesh.mesh_dim_names or ()) if mesh is not None else ()
    if name in names:
        return mesh[name]
    hint = (f" (a reduce op? group is the second argument, as in Lightning: write {what}(data, reduce_op={name!r}))"
            if name in _REDUCE_OPS else "")
    where = (f"the strategy's device mesh has the dimensions {names}" if names
             else f"{type(strategy).__name__} has no device mesh (model_parallel has one)")
    raise ConfigurationError(
        f"{what}(group={name!r}): {where}, so {name!r} names no group{hint}. Give a mesh dimension's name, a "
        "DeviceMesh dimension (self.device_mesh['tensor_parallel']) or a torch.distributed ProcessGroup."
    )


def _dimension_of(strategy: Any, group: Any) -> str | None:
    """The name of the strategy's mesh dimension whose group (on this rank) is ``group``; None when none is."""
    mesh = getattr(strategy, "module_device_mesh", None)
    for name in (mesh.mesh_dim_names or ()) if mesh is not None else ():
        if mesh.get_group(name) == group:
            return name
    return None


def _not_member(what: str, ranks: list[int] | None, name: str | None, rank: int) -> GroupMembershipError:
    dimension = f"the mesh dimension {name!r}" if name else "a process group"
    members = (f"whose ranks are {','.join(map(str, sorted(ranks)))}" if ranks is not None
               else "(torch gives a rank outside dist.new_group(ranks) a placeholder that names no ranks)")
    return GroupMembershipError(
        f"Rank {rank} called {what} over {dimension} {members}, and is not one of them: a collective over a group "
        "runs on that group's ranks only, and torch would hand this rank its own data back unreduced or leave the "
        "group's ranks waiting. Call it on the group's ranks only (under `if self.global_rank in ranks:`), or let "
        "every rank run it over its own group of the dimension: group='tensor_parallel' (a dimension of the "
        "strategy's device mesh, by name) or group=self.device_mesh['tensor_parallel'] is, on each rank, the group "
        "of that dimension that contains it."
    )
