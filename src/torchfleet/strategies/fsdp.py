"""FSDPStrategy: parameters, gradients and optimizer state sharded across processes with FSDP2 (``fully_shard``).

It is ParallelStrategy's process set-up (launchers, process group, samplers) with its own wrapper: each
submodule the ``auto_wrap_policy`` matches becomes its own FSDP unit, then the root. Between its
forward and backward a unit's parameters are gathered whole; the rest of the time each rank holds
1/N of them (FULL_SHARD). Checkpoints are torch.distributed.checkpoint directories by default
(``state_dict_type="sharded"``, see torchfleet.checkpoint.dcp), loadable at any world size and by
every strategy; ``"full"`` writes one ordinary file from rank 0.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import weakref
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from torchfleet.checkpoint.consolidate import read_keeping_dcp_entries
from torchfleet.checkpoint.dcp import save_dcp_checkpoint
from torchfleet.errors import ConfigurationError
from torchfleet.strategies import _fsdp_checkpoint, _fsdp_hooks
from torchfleet.strategies._fsdp_init import (
    LayerPolicy,
    _apply_activation_checkpointing,
    _as_policy,
    _materialize,
    _on_meta,
)
from torchfleet.strategies.arguments import PARALLEL, pick, takes
from torchfleet.strategies.memory_model import MemoryModel
from torchfleet.strategies.parallel import ParallelStrategy
from torchfleet.strategies.processes import ProcessOptions
from torchfleet.strategies.utils import check_keep_sharded, stays_sharded

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy, ShardingStrategy

    from torchfleet.environments.base import ClusterEnvironment

log = logging.getLogger(__name__)

SHARDING_STRATEGIES = ("FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD")
STATE_DICT_TYPES = ("sharded", "full")
#: the Module hooks that run the model: each runs FSDP's pre/post-forward (gather, then free, the root's parameters)
_STEP_HOOKS = ("training_step", "validation_step", "test_step", "predict_step")
_MESH_DIMS = ("replicate", "shard")

#: the modules an FSDPStrategy sharded in this process and that are still sharded (``keep_sharded``, or a stage that
#: raised): a later stage with the same module (``trainer.test(model)`` after ``fit``) uses those shards as they are
_SHARDED: weakref.WeakSet[nn.Module] = weakref.WeakSet()


def _sharding_name(value: str | ShardingStrategy) -> str:
    # torch's FSDP1 ShardingStrategy enum members are accepted by name
    name = getattr(value, "name", value)
    if isinstance(name, str) and name.upper() in SHARDING_STRATEGIES:
        return name.upper()
    from torchfleet.errors import closest

    near = closest(str(name), SHARDING_STRATEGIES)
    raise ConfigurationError(
        f"sharding_strategy={value!r} is not understood.{f' Did you mean {near[0]!r}?' if near else ''} Accepted: "
        "'FULL_SHARD' (parameters, gradients and optimizer state sharded; parameters gathered per layer and freed "
        "after use), 'SHARD_GRAD_OP' (kept gathered from forward to backward), 'NO_SHARD' (replicated, like ddp) and "
        "'HYBRID_SHARD' (sharded within a node, replicated across nodes)."
    )


class FSDPStrategy(ParallelStrategy):
    """Fully sharded data parallel training with FSDP2 (``torch.distributed.fsdp.fully_shard``).

    ``auto_wrap_policy``: layer classes (``{nn.TransformerEncoderLayer}``) or a callable(module) -> bool;
    each matching submodule is sharded as its own unit (gathered one at a time), then the root.
    ``sharding_strategy``: "FULL_SHARD" (default), "SHARD_GRAD_OP" (no reshard after forward),
    "NO_SHARD" (replicate: a mesh with a shard dimension of 1), "HYBRID_SHARD" (a 2-D mesh, nodes x
    processes per node: shard within a node, replicate across nodes). ``device_mesh``: a DeviceMesh
    (1-D: shard over it; 2-D: replicate x shard) or a tuple ``(replicate, shard)`` built after the
    process group exists. ``cpu_offload``: True or a CPUOffloadPolicy (sharded parameters, gradients
    and the optimizer step on the CPU; memory is pinned only with CUDA). ``mixed_precision``: a
    MixedPrecisionPolicy; by default derived from the Trainer's precision ("bf16-mixed"/"16-mixed":
    gather parameters in bf16/fp16, reduce gradients in fp32). ``activation_checkpointing_policy``:
    layer classes (or a callable) whose activations are recomputed in backward.
    ``state_dict_type``: "sharded" (a DCP directory, default) or "full" (one file from rank 0).
    ``process_group_backend``, ``timeout``, ``start_method`` and ``max_restarts``: processes.ProcessOptions (as
    for DDPStrategy).

    When a Trainer stage (fit, validate, test, predict) ends, the module is made whole again on every
    rank (``unshard_module``): ordinary parameters on the CPU with the trained weights, so user code can
    call it or any submodule on any rank; a later stage shards it again. ``keep_sharded=True`` leaves it
    sharded instead (for a model that does not fit in one process): then call it on every rank together
    (spawned or forked ranks end with the stage, so there the caller's process gets it whole anyway).
    """

    reseeds_for = frozenset({"trainer", "fleet"})  # as Lightning's and Fabric's

    @takes("accelerator", "parallel_devices", "cluster_environment", "checkpoint_io", "precision",
           "process_group_backend", "timeout", "start_method", "auto_wrap_policy", "sharding_strategy", "device_mesh",
           "cpu_offload", "mixed_precision", "activation_checkpointing_policy", "state_dict_type", "precision_plugin",
           "max_restarts", "keep_sharded")
    def __init__(
        self,
        given: dict[str, Any],
        auto_wrap_policy: LayerPolicy = None,
        sharding_strategy: str | ShardingStrategy = "FULL_SHARD",
        device_mesh: DeviceMesh | tuple[int, int] | None = None,
        cpu_offload: bool | OffloadPolicy = False,
        mixed_precision: MixedPrecisionPolicy | None = None,
        activation_checkpointing_policy: LayerPolicy = None,
        state_dict_type: str = "sharded",
        keep_sharded: bool = False,
    ) -> None:
        super().__init__(**pick(given, PARALLEL))
        self.processes = ProcessOptions.of(given)
        from torch.distributed.fsdp import MixedPrecisionPolicy, OffloadPolicy

        self.keep_sharded = check_keep_sharded("FSDPStrategy", keep_sharded)
        self.auto_wrap_policy = auto_wrap_policy
        self._wrap_policy = _as_policy("auto_wrap_policy", auto_wrap_policy)
        self._checkpoint_policy = _as_policy("activation_checkpointing_policy", activation_checkpointing_policy)
        self.sharding_strategy = _sharding_name(sharding_strategy)
        if device_mesh is not None and not _is_mesh(device_mesh) and not _is_mesh_shape(device_mesh):
            raise ConfigurationError(
                f"device_mesh={device_mesh!r} is not understood. Give a torch.distributed.device_mesh.DeviceMesh "
                "(1-D: shard over it; 2-D: replicate x shard) or a tuple of two positive ints (replicate, shard) "
                "whose product is the world size."
            )
        self.device_mesh = device_mesh
        if not isinstance(cpu_offload, (bool, OffloadPolicy)):
            raise ConfigurationError(
                f"cpu_offload={cpu_offload!r} is not valid: give True/False or a "
                "torch.distributed.fsdp.CPUOffloadPolicy."
            )
        self.cpu_offload = cpu_offload
        if mixed_precision is not None and not isinstance(mixed_precision, MixedPrecisionPolicy):
            raise ConfigurationError(
                f"mixed_precision={mixed_precision!r} is not valid: give a torch.distributed.fsdp.MixedPrecisionPolicy, "
                "or leave it None to derive it from the Trainer's precision."
            )
        self._mixed_precision = mixed_precision
        if state_dict_type not in STATE_DICT_TYPES:
            raise ConfigurationError(
                f"state_dict_type={state_dict_type!r} is not valid. Accepted: 'sharded' (every rank writes its shard "
                "into a checkpoint directory, loadable at any world size) and 'full' (rank 0 gathers the whole model "
                "into one ordinary checkpoint file)."
            )
        self.state_dict_type = state_dict_type
        self._mesh: DeviceMesh | None = None
        self._modules: list[weakref.ref[nn.Module]] = []
        #: the optimizers set up over sharded parameters (unsharding points them at the whole ones)
        self._optimizer_refs: list[weakref.ref[Optimizer]] = []
        #: the running stage raised: its end leaves the module sharded (making it whole needs every rank)
        self._interrupted = False
        # parameters replaced by fully_shard: id(old) -> (weak reference to old, new), to rebind optimizers built before
        self._replaced: dict[int, tuple[weakref.ref[Tensor], nn.Parameter]] = {}

    # ----------------------------------------------------------------- configuration
    def configure(self, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment) -> None:
        super().configure(devices, num_nodes, cluster_environment)
        self._mesh_shape()  # a mesh that does not fit the world fails here, before any process starts
        if self.sharding_strategy == "HYBRID_SHARD" and num_nodes == 1 and self.device_mesh is None:
            log.warning(
                "sharding_strategy='HYBRID_SHARD' on one node: there is nothing to replicate across, so it shards "
                "over all %d processes, exactly as 'FULL_SHARD'. Give num_nodes, or device_mesh=(replicate, shard) "
                "to replicate within the node.", self.world_size,
            )

    def _mesh_shape(self) -> tuple[int, ...] | None:
        """(replicate, shard) for 2-D meshes, (world,) for 1-D; None when a DeviceMesh object was given."""
        world, nodes = self.world_size, self.num_nodes
        if _is_mesh(self.device_mesh):
            return None
        if self.device_mesh is not None:
            replicate, shard = self.device_mesh
            if replicate * shard != world:
                raise ConfigurationError(
                    f"device_mesh=({replicate}, {shard}) has {replicate * shard} positions but the run has {world} "
                    f"processes. Give (replicate, shard) whose product is {world}, e.g. ({nodes}, {world // nodes})."
                )
            return (replicate, shard)
        if self.sharding_strategy == "HYBRID_SHARD":
            if world % nodes:
                raise ConfigurationError(
                    f"sharding_strategy='HYBRID_SHARD' shards within a node and replicates across the {nodes} nodes, but "
                    f"the world size {world} does not divide into {nodes} nodes. Start the same number of processes on "
                    "every node, or give device_mesh=(replicate, shard) with replicate x shard = world size."
                )
            return (nodes, world // nodes)
        if self.sharding_strategy == "NO_SHARD":
            return (world, 1)
        return (world,)

    def _build_mesh(self) -> DeviceMesh:
        if _is_mesh(self.device_mesh):
            mesh = self.device_mesh
            if mesh.size() != self.world_size or mesh.ndim not in (1, 2):  # type: ignore[union-attr]
                raise ConfigurationError(
                    f"device_mesh has shape {tuple(mesh.shape)} ({mesh.size()} positions) but the run has "  # type: ignore[union-attr]
                    f"{self.world_size} processes. Give a 1-D mesh of {self.world_size} (shard over all) or a 2-D mesh "
                    f"(replicate, shard) whose product is {self.world_size}."
                )
            return mesh  # type: ignore[return-value]
        from torch.distributed.device_mesh import init_device_mesh

        shape = self._mesh_shape()
        assert shape is not None
        names = _MESH_DIMS if len(shape) == 2 else ("shard",)
        return init_device_mesh(self.root_device.type, shape, mesh_dim_names=names)

    def _offload_policy(self) -> OffloadPolicy:
        from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

        policy = self.cpu_offload
        pin = self.root_device.type == "cuda"
        if policy is True:
            return CPUOffloadPolicy(pin_memory=pin)
        if isinstance(policy, CPUOffloadPolicy) and policy.pin_memory and not pin:
            log.info("cpu_offload: pinned memory needs CUDA; this %s run offloads without pinning.", self.root_device)
            return CPUOffloadPolicy(pin_memory=False)
        return policy if isinstance(policy, OffloadPolicy) else OffloadPolicy()

    @property
    def mixed_precision_policy(self) -> MixedPrecisionPolicy:
        """The MixedPrecisionPolicy given, or the one the precision implies (read at setup, after resolve)."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        if self._mixed_precision is not None:
            return self._mixed_precision
        compute = {"bf16-mixed": torch.bfloat16, "16-mixed": torch.float16}.get(self.precision.name)
        if compute is None:  # "-true" precisions already hold parameters in their dtype
            return MixedPrecisionPolicy()
        return MixedPrecisionPolicy(param_dtype=compute, reduce_dtype=torch.float32)

    # ----------------------------------------------------------------- creating the model
    @contextlib.contextmanager
    def tensor_init_context(self, empty_init: bool | None = None) -> Iterator[None]:
        """With ``empty_init``, parameters are created on the meta device (no memory) and materialised sharded in setup."""
        if not empty_init:
            with super().tensor_init_context(empty_init):
                yield
            return
        with self.model_sharded_context():
            yield

    @contextlib.contextmanager
    def model_sharded_context(self) -> Iterator[None]:
        """Around ``configure_model``: its layers are created on the meta device and materialised sharded in setup."""
        from torchfleet.strategies.utils import creation_context

        with creation_context("meta", self.precision.param_dtype):
            yield

    def module_to_device(self, module: nn.Module) -> nn.Module:
        # a module on the meta device is materialised after sharding, one shard per rank
        if _on_meta(module):
            return module
        return module.to(self.root_device)

    # ----------------------------------------------------------------- the module
    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: Sequence[Optimizer] = (), scheduler: Any = None
    ) -> tuple[nn.Module, list[Optimizer], Any]:
        """Shard ``module``, or reuse it as it is when an earlier stage left it sharded (``keep_sharded=True``)."""
        self._interrupted = False
        if module in _SHARDED:
            self._remember(module)
            return module, [self.setup_optimizer(o) for o in optimizers], scheduler
        return super().setup_module_and_optimizers(module, optimizers, scheduler)

    def _remember(self, module: nn.Module) -> None:
        if not any(r() is module for r in self._modules):
            self._modules.append(weakref.ref(module))

    def setup_module(self, module: nn.Module) -> nn.Module:
        """Shard ``module``: activation checkpointing, then fully_shard on each policy match, then on the root."""
        from torch.distributed.fsdp import FSDPModule, fully_shard

        if isinstance(module, FSDPModule):
            raise ConfigurationError(
                f"The {type(module).__name__} given to the fsdp strategy was already sharded with fully_shard. Pass the "
                "plain module: the strategy applies fully_shard itself, following auto_wrap_policy."
            )
        module = self.sync_batchnorm(module)
        old = {name: p for name, p in module.named_parameters()}
        if self._checkpoint_policy is not None:
            _apply_activation_checkpointing(module, self._checkpoint_policy)
        self._mesh = self._build_mesh()
        kwargs = {"mesh": self._mesh, "mp_policy": self.mixed_precision_policy, "offload_policy": self._offload_policy()}
        units = self._wrap_units(module)
        # the root keeps its parameters after forward (backward gathers them at once): what torch >= 2.8 does for
        # reshard_after_forward=None, written out because torch 2.6 and 2.7 refuse None
        for sub in units:
            fully_shard(sub, reshard_after_forward=self.sharding_strategy != "SHARD_GRAD_OP", **kwargs)
        fully_shard(module, reshard_after_forward=False, **kwargs)
        _fsdp_hooks.sum_gradients_on_gloo(module)
        for hook in _STEP_HOOKS:
            if callable(getattr(module, hook, None)):
                _fsdp_hooks.register_forward_method(module, hook)
        _fsdp_hooks.number_forward_gathers(module)
        _fsdp_hooks.follow_distributions(module)
        _fsdp_hooks.route_zero_grad(module)
        if _on_meta(module):
            _materialize(module, torch.device("cpu") if self.cpu_offload else self.root_device)
        _fsdp_hooks.route_reset_parameters(module)  # after materialising, whose initialisation stays as it was
        new = dict(module.named_parameters())
        self._replaced.update({id(p): (weakref.ref(p), new[n]) for n, p in old.items() if n in new and new[n] is not p})
        self._remember(module)
        _SHARDED.add(module)
        return module

    def memory_model(self, module: nn.Module, world_size: int, num_nodes: int) -> MemoryModel:
        shard = {"NO_SHARD": 1, "HYBRID_SHARD": world_size // num_nodes}.get(self.sharding_strategy, world_size)
        if isinstance(self.device_mesh, tuple):
            shard = self.device_mesh[1]
        elif self.device_mesh is not None:
            shard = self.device_mesh.size(-1)
        checkpoint = self._checkpoint_policy
        return MemoryModel(
            param_shards=shard, grad_shards=shard, state_shards=shard,
            offload=frozenset({"params", "grads", "states"} if self.cpu_offload else ()),
            units=(*self._wrap_units(module), module), reshard_after_forward=self.sharding_strategy != "SHARD_GRAD_OP",
            gathered_dtype_from_compute=self.mixed_precision_policy.param_dtype is not None,
            prepare=None if checkpoint is None else functools.partial(_apply_activation_checkpointing, policy=checkpoint))

    def _wrap_units(self, module: nn.Module) -> list[nn.Module]:
        policy = self._wrap_policy
        manual = self.training_settings.manual_optimization
        if policy is None and not manual:
            return []
        # children before parents: fully_shard on a parent must see its children already sharded
        matched = [m for m in reversed(list(module.modules())) if m is not module and policy is not None and policy(m)]
        if manual:
            matched += self._manual_units(module, matched)
        elif not matched:
            log.warning(
                "auto_wrap_policy=%r matched no submodule of %s: the whole model is one FSDP unit, so every parameter "
                "is gathered at once in forward and backward (peak memory as without sharding). Name the classes of "
                "its repeated blocks (e.g. {nn.TransformerEncoderLayer}).", self.auto_wrap_policy,
                type(module).__name__,
            )
        return matched

    @staticmethod
    def _manual_units(module: nn.Module, matched: list[nn.Module]) -> list[nn.Module]:
        """Under manual optimisation each child with parameters is a unit too.

        ``manual_backward`` runs inside ``training_step``, before the root's forward hooks finish, so fully_shard
        would reduce no gradient of the root's own parameters (silently: the shards would never change). A unit
        called inside the step gathers its parameters in its own forward and reduce-scatters their gradients in
        each backward, however many the step runs. Parameters of the root itself cannot be, and are refused.
        """
        own = [name for name, _ in module.named_parameters(recurse=False)]
        if own:
            raise ConfigurationError(
                f"{type(module).__name__} uses manual optimisation under fsdp and registers parameters on itself "
                f"({', '.join(own)}). fsdp can only synchronise gradients of a backward inside training_step for "
                "parameters of submodules: move them into a submodule (e.g. an nn.Module holding them), or use ddp."
            )
        done = {id(m) for m in matched}
        return [child for child in module.children()
                if id(child) not in done and any(True for _ in child.parameters())]

    def setup_optimizer(self, optimizer: Optimizer) -> Optimizer:
        """Point an optimizer built over the module's parameters before sharding at the sharded parameters."""
        groups = optimizer.param_groups
        found = [[self._replacement(p) for p in g["params"]] for g in groups]
        if any(r is not None for rs in found for r in rs):
            if optimizer.state:
                raise ConfigurationError(
                    f"The {type(optimizer).__name__} was built over the model's parameters before sharding and already "
                    "holds state, which cannot follow the parameters into their shards. Create the optimizer after "
                    "the model is set up (Fleet: fleet.setup_module(model), then the optimizer, then "
                    "fleet.setup_optimizers(optimizer))."
                )
            for group, replacements in zip(groups, found):
                group["params"] = [r if r is not None else p for r, p in zip(replacements, group["params"])]
        if not any(r() is optimizer for r in self._optimizer_refs):
            self._optimizer_refs.append(weakref.ref(optimizer))
        return optimizer

    def _replacement(self, param: Tensor) -> nn.Parameter | None:
        entry = self._replaced.get(id(param))
        return entry[1] if entry is not None and entry[0]() is param else None

    def setup_and_build_optimizers(
        self, module: nn.Module, build: Callable[[], list[Optimizer]]
    ) -> tuple[nn.Module, list[Optimizer]]:
        """Shard first, then build the optimizers: they must hold the sharded parameters (and only 1/N of the state)."""
        sharded, _, _ = self.setup_module_and_optimizers(module, [])
        return sharded, [self.setup_optimizer(o) for o in build()]

    def setup_for_evaluation(self, module: nn.Module) -> nn.Module:
        """Sharded for evaluation too: every rank holds its shards (the module may not fit in one process)."""
        return self.setup_module_and_optimizers(module, [])[0]

    @property
    def restore_checkpoint_after_setup(self) -> bool:
        """True: a checkpoint's sharded entries load into the sharded module, so after ``setup``."""
        return True

    def modules_set_up(self) -> list[nn.Module]:
        """The modules this strategy has sharded (and that still exist)."""
        return [m for m in (r() for r in self._modules) if m is not None]

    #: the parameters are DTensor shards outside forward: nothing can compute with them there
    outside_forward = "never"

    def forward_method(self, module: nn.Module, name: str) -> Callable[..., Any]:
        """``name`` with fully_shard's forward hooks around it (gather before, reshard after), applied once per method."""
        _fsdp_hooks.register_forward_method(module, name)
        return getattr(module, name)

    @contextlib.contextmanager
    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> Iterator[None]:
        """Keep gradients unsharded and unreduced in the block (gradient accumulation); the next synced backward reduces."""
        from torch.distributed.fsdp import FSDPModule

        if not (enabled and isinstance(module, FSDPModule)):
            yield
            return
        module.set_requires_gradient_sync(False)
        try:
            yield
        finally:
            module.set_requires_gradient_sync(True)

    #: every forward gathers parameters from all ranks, so a rank with one evaluation batch more than the others
    #: would wait for them forever: where the samples do not divide evenly, the last ranks repeat a sample or two
    #: (as torch's DistributedSampler does), which the metrics count
    even_evaluation_shards = "fsdp"

    def unshard_module(self, module: nn.Module) -> None:
        """Make the sharded ``module`` an ordinary one, with whole parameters on the CPU, on every rank (all call it).

        Calls on any rank alone then give what the unsharded model gives. The optimizers keep their sharded
        state (``trainer.save_checkpoint`` after ``fit`` still saves it); a later stage shards the module again.
        """
        if _fsdp_hooks.unshard(module, [o for o in (r() for r in self._optimizer_refs) if o is not None]):
            _SHARDED.discard(module)

    def on_exception(self, exception: BaseException) -> None:
        """The stage raised: ``teardown`` then leaves the module sharded (the other ranks may be anywhere)."""
        self._interrupted = True
        super().on_exception(exception)

    def teardown(self) -> None:
        """Make the modules this strategy sharded whole on the CPU again, then ParallelStrategy's teardown.

        Not with ``keep_sharded`` (while the ranks outlive the stage), nor after a stage that raised: gathering needs
        every rank. The optimizers keep their sharded state, so ``trainer.save_checkpoint`` after the stage saves it.
        """
        if not stays_sharded(self.keep_sharded, self.start_method, self._interrupted):
            for module in self.modules_set_up():
                self.unshard_module(module)
        super().teardown()

    @property
    def supports_inference_mode(self) -> bool:
        # FSDP gathers parameters into buffers it reuses in training; inference tensors cannot be written to later
        return False

    # ----------------------------------------------------------------- checkpoints
    def module_state_dict(self, module: nn.Module) -> dict[str, Any]:
        """Sharded: this rank's shards (DTensors) under the user's names. Full: the whole state on rank 0, {} elsewhere."""
        return _fsdp_checkpoint.module_state(self, module)

    def optimizer_state_dict(self, optimizer: Optimizer) -> dict[str, Any]:
        """Sharded: FQN-keyed shards. Full: ``torch.optim``'s positional form, whole, on rank 0 ({} elsewhere)."""
        return _fsdp_checkpoint.optimizer_state(self, optimizer)

    def save_checkpoint(
        self, checkpoint: dict[str, Any], filepath: str | os.PathLike, storage_options: Any | None = None
    ) -> None:
        """Sharded: every rank writes its shards into the checkpoint directory ``filepath``. Full: rank 0 writes one file."""
        if self.state_dict_type == "full":
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        if storage_options is not None:
            raise TypeError(
                f"FSDPStrategy(state_dict_type='sharded') writes checkpoint directories itself and takes no "
                f"storage_options (got {storage_options!r}); use state_dict_type='full' with a custom CheckpointIO."
            )
        save_dcp_checkpoint(filepath, checkpoint, self)

    def load_checkpoint(self, checkpoint_path: str | os.PathLike, weights_only: bool | None = None) -> dict[str, Any]:
        """Read a checkpoint of any layout; sharded entries stay on disk until ``load_into`` loads them in place."""
        self._restoring = checkpoint_path
        return read_keeping_dcp_entries(checkpoint_path, self.checkpoint_io, weights_only)

    def load_into(
        self, checkpoint: Mapping[str, Any], state: Mapping[str, Any], strict: bool = True, path: Any = None
    ) -> None:
        """Load into the sharded modules and optimizers in ``state``, from DCP files or whole state dicts."""
        _fsdp_checkpoint.load_into(self, checkpoint, state, strict=strict, path=path)

    def __repr__(self) -> str:
        return (f"FSDPStrategy(sharding_strategy={self.sharding_strategy!r}, devices={self.num_processes}, "
                f"num_nodes={self.num_nodes}, cpu_offload={bool(self.cpu_offload)}, "
                f"state_dict_type={self.state_dict_type!r}, precision={self.precision!r})")


def _is_mesh(value: Any) -> bool:
    from torch.distributed.device_mesh import DeviceMesh

    return isinstance(value, DeviceMesh)


def _is_mesh_shape(value: Any) -> bool:
    return (isinstance(value, tuple) and len(value) == 2
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value))
