"""The collectives a user calls on a Module, the Trainer or a Fleet: ``all_gather``, ``all_reduce``, ``broadcast``
and ``barrier``, written once for the three.

Each client says which strategy runs its collectives (``_collective_strategy``) and the name its calls carry in
hang and desync reports (``_collective_label``: ``self.all_gather``, ``trainer.all_gather``, ``fleet.all_gather``).
"""

from __future__ import annotations

from typing import Any

from torchfleet.watchdog import labelled


class UserCollectives:
    """``all_gather``/``all_reduce``/``broadcast``/``barrier`` over the strategy that runs this object."""

    #: the prefix of this object's collectives in hang and desync reports (no annotation: TorchScript reads a
    #: Module's class annotations)
    _collective_label = "self"

    def _collective_strategy(self) -> Any:
        """The strategy whose collectives these calls run (a one-process strategy outside a run)."""
        raise NotImplementedError

    def all_gather(self, data: Any, group: Any | None = None, sync_grads: bool = False) -> Any:
        """Gather tensors (or nested collections of them) from every process, stacked along a new dim 0.

        Tensors whose first dimension differs between processes come back as a list, one per process. ``group``:
        the processes to gather from (None: all); a ``torch.distributed`` ProcessGroup, a 1-D DeviceMesh
        (``self.device_mesh["tensor_parallel"]``) or the name of a dimension of the strategy's device mesh
        (``"tensor_parallel"``: on each rank, that dimension's group containing it). A rank outside the group
        gets an error at once.
        """
        with labelled(f"{self._collective_label}.all_gather"):
            return self._collective_strategy().all_gather_tree(data, sync_grads, group=group)

    def all_reduce(self, data: Any, group: Any | None = None, reduce_op: str = "mean") -> Any:
        """Reduce tensors (or numbers, or nested collections of them) across processes: mean, sum, max, min.

        ``group``: the processes to reduce over (None: all), as ``all_gather``'s.
        """
        with labelled(f"{self._collective_label}.all_reduce"):
            return self._collective_strategy().all_reduce_tree(data, reduce_op, group=group)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        """Return process ``src``'s ``obj`` on every process."""
        with labelled(f"{self._collective_label}.broadcast"):
            return self._collective_strategy().broadcast(obj, src=src)

    def barrier(self, name: str | None = None) -> None:
        """Wait until every process gets here."""
        self._collective_strategy().barrier(name)
