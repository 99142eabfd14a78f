"""ModelParallelStrategy: tensor parallelism and FSDP2 on a 2-D device mesh, the user parallelising the model.

The strategy starts the processes and joins them (ParallelStrategy's launcher and process group, from
processes.py), then builds a DeviceMesh of shape ``(data_parallel_size, tensor_parallel_size)`` whose
dimensions are named ``"data_parallel"`` and ``"tensor_parallel"``; ranks ``k * tp ... k * tp + tp - 1`` form
tensor-parallel group ``k``, so "auto" puts the tensor-parallel groups inside a node and the data-parallel
dimension across nodes. The model is parallelised by the user: under the Trainer in the Module's
``configure_model()`` (``self.device_mesh``), under Fleet by ``parallelize_fn(module, device_mesh)``; typically
``parallelize_module`` over ``mesh["tensor_parallel"]``, then ``fully_shard(..., mesh=mesh["data_parallel"])``.
Data are split over the data-parallel dimension only: the ranks of one tensor-parallel group read the same
batches. Checkpoints are FSDPStrategy's (``_fsdp_checkpoint``: torch's DTensor state dicts): a DCP directory
by default, loadable at any mesh and by every strategy, or one file from rank 0. With
``pipeline_parallel_size > 1`` the mesh gets a third, outermost dimension ``"pipeline_parallel"`` and the
Module's stages run under a ``torch.distributed.pipelining`` schedule (``_pipeline.py``).
"""

from __future__ import annotations

import contextlib
import os
import weakref
from collections.abc import Callable, Iterator, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn
from torch.optim import Optimizer

from torchfleet.checkpoint.dcp import save_dcp_checkpoint
from torchfleet.errors import ConfigurationError, not_valid
from torchfleet.strategies import _fsdp_checkpoint, _fsdp_hooks, _pipeline
from torchfleet.strategies._dtensor_checks import MESH_DIMS, check_even_shards, has_dtensors, total_norm
from torchfleet.strategies._fsdp_init import _materialize, _on_meta
from torchfleet.strategies._tp_memory import tensor_parallel_model
from torchfleet.strategies.arguments import DEFAULT_TIMEOUT
from torchfleet.strategies.fsdp import FSDPStrategy
from torchfleet.strategies.memory_model import MemoryModel
from torchfleet.strategies.parallel import ParallelStrategy
from torchfleet.strategies.processes import ProcessOptions

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

    from torchfleet.accelerators.base import Accelerator
    from torchfleet.checkpoint.io import CheckpointIO
    from torchfleet.environments.base import ClusterEnvironment
    from torchfleet.precision import Precision

ParallelizeFn = Callable[[nn.Module, "DeviceMesh"], nn.Module]


def _check_size(name: str, value: Any, auto: bool = True) -> Any:
    if (auto and value == "auto") or (isinstance(value, int) and not isinstance(value, bool) and value >= 1):
        return value
    accepted = "give 'auto' or a whole number" if auto else "give a whole number"
    raise not_valid(name, value, f"{accepted} >= 1", owner="ModelParallelStrategy")


def pipeline_mesh_sizes(pipeline: int, data_parallel: int | str, tensor_parallel: int | str, per_node: int,
                        num_nodes: int) -> tuple[int, int, int]:
    """``(pp, dp, tp)``: ``mesh_sizes`` of each pipeline stage's processes (stages across nodes when they divide)."""
    world = per_node * num_nodes
    given = data_parallel != "auto" and tensor_parallel != "auto"
    if world % pipeline or (given and pipeline * data_parallel * tensor_parallel != world):  # type: ignore[operator]
        raise ConfigurationError(
            f"ModelParallelStrategy(pipeline_parallel_size={pipeline}, data_parallel_size={data_parallel}, "
            f"tensor_parallel_size={tensor_parallel}) does not fit the run's {world} processes ({num_nodes} node(s) x "
            f"{per_node}): pipeline x data x tensor parallel must equal the world size. Give sizes that multiply to "
            f"{world}, leaving data_parallel_size or tensor_parallel_size 'auto'."
        )
    if num_nodes % pipeline == 0:
        return (pipeline, *mesh_sizes(data_parallel, tensor_parallel, per_node, num_nodes // pipeline))
    if per_node % pipeline == 0:
        return (pipeline, *mesh_sizes(data_parallel, tensor_parallel, per_node // pipeline, num_nodes))
    raise ConfigurationError(
        f"ModelParallelStrategy: pipeline_parallel_size={pipeline} divides neither the {num_nodes} node(s) nor a "
        f"node's {per_node} processes, so the stages would split nodes unevenly. Choose a divisor of either."
    )


def mesh_sizes(data_parallel: int | str, tensor_parallel: int | str, per_node: int, num_nodes: int) -> tuple[int, int]:
    """``(data_parallel_size, tensor_parallel_size)`` for ``num_nodes`` nodes of ``per_node`` processes each.

    Both "auto": one data-parallel replica per node, tensor parallel across a node's devices (Lightning's
    choice). One "auto": the world size divided by the other. Refused here, before any process starts: sizes whose
    product is not the world size, and tensor-parallel groups that would span nodes (larger than a node, or not
    dividing its processes): their collectives run in every layer, far too slow between machines.
    """
    world = per_node * num_nodes
    if data_parallel == "auto" and tensor_parallel == "auto":
        return num_nodes, per_node
    given = tensor_parallel if data_parallel == "auto" else data_parallel
    if isinstance(given, int) and (data_parallel == "auto" or tensor_parallel == "auto"):
        if world % given:
            raise ConfigurationError(
                f"ModelParallelStrategy: {'tensor' if data_parallel == 'auto' else 'data'}_parallel_size={given} does "
                f"not divide the run's {world} processes ({num_nodes} node(s) x {per_node}), so no mesh has that "
                "size. Choose a divisor of the world size, or change devices/num_nodes."
            )
        other = world // given
        data_parallel, tensor_parallel = (other, given) if data_parallel == "auto" else (given, other)
    assert isinstance(data_parallel, int) and isinstance(tensor_parallel, int)
    if data_parallel * tensor_parallel != world:
        raise ConfigurationError(
            f"ModelParallelStrategy(data_parallel_size={data_parallel}, tensor_parallel_size={tensor_parallel}) makes a "
            f"mesh of {data_parallel * tensor_parallel} processes, but the run has {world} ({num_nodes} node(s) x "
            f"{per_node} devices). The two sizes must multiply to the world size; give one and leave the other 'auto'."
        )
    if tensor_parallel > per_node or per_node % tensor_parallel:
        reason = ("larger than a node" if tensor_parallel > per_node
                  else f"does not divide a node's {per_node} processes, so some groups would span two nodes")
        raise ConfigurationError(
            f"ModelParallelStrategy: tensor_parallel_size={tensor_parallel} is {reason}. Tensor parallelism "
            "communicates in every layer's forward and backward and must stay within a node: give a "
            f"tensor_parallel_size that divides {per_node} (the devices per node), and let data_parallel_size span "
            "the nodes."
        )
    return data_parallel, tensor_parallel


class ModelParallelStrategy(ParallelStrategy):
    """Tensor parallelism with FSDP2 on a 2-D device mesh ("data_parallel" x "tensor_parallel"); Lightning's API.

    ``parallelize_fn(module, device_mesh) -> module``: how the model is parallelised (Fabric's form, for Fleet;
    under the Trainer the Module's ``configure_model`` does it with ``self.device_mesh`` instead, or this function
    when given). ``data_parallel_size`` / ``tensor_parallel_size``: the mesh's shape, whose product is the world
    size; "auto" (both): one data-parallel replica per node, tensor parallel within a node; one "auto": the world
    size divided by the other. ``save_distributed_checkpoint``: True (a DCP directory, each rank writing its
    shards, loadable at any mesh and under every strategy) or False (rank 0 writes one ordinary file).
    ``process_group_backend``, ``timeout`` and ``max_restarts`` are the shared process options (processes.py). The model stays
    parallelised after a stage (as Lightning's). ``pipeline_parallel_size`` > 1: a third, outermost mesh dimension
    "pipeline_parallel"; the Module declares its stages with ``configure_pipeline()`` (``_pipeline.PipelineSpec``)
    and each training step runs ``pipeline_schedule`` ("GPipe", "1F1B", or with ``stages_per_rank`` stages on each
    rank "Interleaved1F1B" or "LoopedBFS") over ``microbatches`` (default: pipeline_parallel_size) microbatches of
    the rank's batch. Under Fleet, ``pipeline`` (a ``PipelineSpec``; default: the
    module's ``configure_pipeline()``) splits the module ``setup_module`` gets, and ``pipeline_step(model, batch)``
    runs a step.
    """

    reseeds_for = frozenset({"trainer", "fleet"})  # as Lightning's and Fabric's
    #: the parameters are DTensors: computing with them outside the parallelised forward needs every rank
    outside_forward = "never"
    #: every forward runs the tensor-parallel collectives: evaluation shards must be even
    even_evaluation_shards = "model_parallel"

    def __init__(
        self,
        parallelize_fn: ParallelizeFn | None = None,
        data_parallel_size: int | str = "auto",
        tensor_parallel_size: int | str = "auto",
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | float | None = DEFAULT_TIMEOUT,
        *,
        pipeline_parallel_size: int = 1,
        pipeline_schedule: str = "1F1B",
        microbatches: int | None = None,
        stages_per_rank: int = 1,
        pipeline: _pipeline.PipelineSpec | None = None,
        max_restarts: int = 0,
        # the parts, as every strategy takes them (resolve() fills in those not given)
        accelerator: Accelerator | None = None, parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None, checkpoint_io: CheckpointIO | None = None,
        precision: Precision | None = None, precision_plugin: Precision | None = None,
    ) -> None:
        if parallelize_fn is not None and not callable(parallelize_fn):
            raise ConfigurationError(
                f"ModelParallelStrategy got {parallelize_fn!r} as its first argument, which is parallelize_fn(module, "
                "device_mesh) -> module (Fabric's order). Give the sizes by name: "
                "ModelParallelStrategy(data_parallel_size=..., tensor_parallel_size=...)."
            )
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=cluster_environment, checkpoint_io=checkpoint_io, precision=precision,
                         process_group_backend=process_group_backend, precision_plugin=precision_plugin)
        self._parallelize_fn = parallelize_fn
        self._data_parallel_size = _check_size("data_parallel_size", data_parallel_size)
        self._tensor_parallel_size = _check_size("tensor_parallel_size", tensor_parallel_size)
        if not isinstance(save_distributed_checkpoint, bool):
            raise not_valid("save_distributed_checkpoint", save_distributed_checkpoint,
                            "give True (a checkpoint directory, each rank writing its shards) or False (one file "
                            "written by rank 0)", owner="ModelParallelStrategy")
        self._save_distributed_checkpoint = save_distributed_checkpoint
        self._pipeline_size: int = _check_size("pipeline_parallel_size", pipeline_parallel_size, auto=False)
        self._microbatches = None if microbatches is None else _check_size("microbatches", microbatches, auto=False)
        self._stages_per_rank: int = _check_size("stages_per_rank", stages_per_rank, auto=False)
        self._pipeline_schedule = _pipeline.check_schedule(pipeline_schedule, stages_per_rank, self._microbatches,
                                                           self._pipeline_size)
        if self._pipeline_size > 1 and not save_distributed_checkpoint:
            raise ConfigurationError(
                "ModelParallelStrategy(pipeline_parallel_size > 1) saves distributed checkpoints only: each stage's "
                "ranks write their own layers, and no rank holds the whole model to write one file. Keep "
                "save_distributed_checkpoint=True (`torchfleet consolidate` makes one file of the directory)."
            )
        #: the rank's pipeline stage (pipeline_parallel_size > 1: the Trainer's once the processes are joined,
        #: Fleet's in setup_module); the spec Fleet's module is split by (else its configure_pipeline())
        self._pipeline: _pipeline.Pipeline | None = None
        self._pipeline_spec = pipeline
        self.processes = ProcessOptions(process_group_backend=process_group_backend, timeout=timeout,
                                        max_restarts=max_restarts)
        self._sizes: tuple[int, int] | None = None
        #: the mesh, once the process group exists (``setup_environment``); a Module's ``device_mesh`` reads it
        self.module_device_mesh: DeviceMesh | None = None
        self._modules: list[weakref.ref[nn.Module]] = []

    # ----------------------------------------------------------------- configuration and processes
    def configure(self, devices: list[torch.device], num_nodes: int, cluster_environment: ClusterEnvironment) -> None:
        super().configure(devices, num_nodes, cluster_environment)
        if self._pipeline_size > 1:
            self._sizes = pipeline_mesh_sizes(self._pipeline_size, self._data_parallel_size,
                                              self._tensor_parallel_size, self.num_processes, num_nodes)[1:]
        else:
            self._sizes = mesh_sizes(self._data_parallel_size, self._tensor_parallel_size, self.num_processes,
                                     num_nodes)

    @property
    def pipeline_parallel_size(self) -> int:
        """The number of pipeline stages (1: no "pipeline_parallel" mesh dimension)."""
        return self._pipeline_size

    @property
    def pipeline_stages(self) -> list[nn.Module] | None:
        """Under a multi-stage schedule ("Interleaved1F1B", "LoopedBFS"), this rank's stages: one ``nn.Sequential``
        of the kept layers each (the Module's own, under their names), which the schedule runs one by one and which
        ``configure_model`` / ``parallelize_fn`` shard each (``fully_shard(stage, mesh=...)``) instead of the
        whole Module; None otherwise."""
        return None if self._pipeline is None else self._pipeline.modules

    @property
    def step_backpropagates(self) -> bool:
        """Under pipeline parallelism the training step's schedule runs the backward itself."""
        return self._pipeline_size > 1

    @property
    def data_parallel_size(self) -> int:
        """The mesh's "data_parallel" size (known once the strategy is configured with the devices)."""
        return self._mesh_sizes()[0]

    @property
    def tensor_parallel_size(self) -> int:
        """The mesh's "tensor_parallel" size (known once the strategy is configured with the devices)."""
        return self._mesh_sizes()[1]

    def _mesh_sizes(self) -> tuple[int, int]:
        if self._sizes is None:
            raise RuntimeError("ModelParallelStrategy's mesh sizes are known once it is configured (Trainer/Fleet).")
        return self._sizes

    @property
    def device_mesh(self) -> DeviceMesh:
        """The DeviceMesh ("data_parallel", "tensor_parallel"), with "pipeline_parallel" first when
        pipeline_parallel_size > 1; it exists once the processes are joined."""
        if self.module_device_mesh is None:
            raise RuntimeError("The device mesh exists once the processes are joined (in configure_model, setup and "
                               "after): ModelParallelStrategy builds it in setup_environment.")
        return self.module_device_mesh

    @property
    def distributed_sampler_kwargs(self) -> dict[str, int]:
        """The data-parallel dimension only: every rank of a tensor-parallel group reads the same samples."""
        dp, tp = self._mesh_sizes()
        return {"num_replicas": dp, "rank": (self.global_rank // tp) % dp}  # the stages of a replica read alike

    def setup_environment(self) -> None:
        """Join the process group (ParallelStrategy's way), then build the mesh; a Trainer's Module must parallelise
        itself in ``configure_model``, which is checked first, in every rank alike."""
        self._check_configure_model()
        super().setup_environment()
        if self.module_device_mesh is None:
            from torch.distributed.device_mesh import init_device_mesh

            pp = self._pipeline_size
            self.module_device_mesh = init_device_mesh(
                self.root_device.type, (pp, *self._mesh_sizes()) if pp > 1 else self._mesh_sizes(),
                mesh_dim_names=_pipeline.PIPELINE_MESH_DIMS if pp > 1 else MESH_DIMS)
        if self._pipeline_size > 1 and self.lightning_module is not None and self._pipeline is None:
            # the stage's layers only, before configure_model parallelises them
            self._pipeline = _pipeline.Pipeline(self.lightning_module, self.device_mesh, self._pipeline_schedule,
                                                self._microbatches, stages_per_rank=self._stages_per_rank)
            from torchfleet.utilities.model_helpers import is_overridden

            # the Module's own optimizer_step gets the closure, whose result (the loss) it may read before stepping
            self._pipeline.defer_loss = not is_overridden("optimizer_step", self.lightning_module)

    def _check_configure_model(self) -> None:
        from torchfleet.utilities.model_helpers import is_overridden

        module = self.lightning_module
        if module is None or self._parallelize_fn is not None:
            return
        if not (is_overridden("configure_model", module) or is_overridden("configure_sharded_model", module)):
            raise ConfigurationError(
                f"{type(module).__name__} does not define configure_model(), which ModelParallelStrategy needs: the "
                "strategy does not decide how a model is split, the Module does. Define configure_model(self) and "
                "parallelise the layers there with self.device_mesh, e.g. parallelize_module(self.model, "
                "self.device_mesh['tensor_parallel'], {'ff.in': ColwiseParallel(), 'ff.out': RowwiseParallel()}) "
                "(torch.distributed.tensor.parallel), then fully_shard(self.model, "
                "mesh=self.device_mesh['data_parallel']) (torch.distributed.fsdp) for the data-parallel dimension; "
                "or use strategy='fsdp' or 'ddp', which need no such hook."
            )

    # ----------------------------------------------------------------- the module
    def tensor_init_context(self, empty_init: bool | None = None) -> contextlib.AbstractContextManager:
        """With ``empty_init``, parameters are created on the meta device and materialised after parallelising."""
        from torchfleet.strategies.utils import creation_context

        meta = creation_context("meta", self.precision.param_dtype) if empty_init else None
        return meta if meta is not None else super().tensor_init_context(empty_init)

    def module_to_device(self, module: nn.Module) -> nn.Module:
        # a module on the meta device is materialised once parallelised, each rank its own parts
        return module if _on_meta(module) else module.to(self.root_device)

    def setup_module_and_optimizers(
        self, module: nn.Module, optimizers: Sequence[Optimizer] = (), scheduler: Any = None
    ) -> tuple[nn.Module, list[Optimizer], Any]:
        if optimizers:
            raise ConfigurationError(
                "ModelParallelStrategy replaces the model's parameters by DTensors when it parallelises it, so an "
                "optimizer built before holds parameters that are no longer trained. Set up the model first, then "
                "build the optimizer over its parameters: model = fleet.setup_module(model); optimizer = "
                "torch.optim.AdamW(model.parameters()); optimizer = fleet.setup_optimizers(optimizer)."
            )
        return super().setup_module_and_optimizers(module, [], scheduler)

    def setup_and_build_optimizers(
        self, module: nn.Module, build: Callable[[], list[Any]]
    ) -> tuple[nn.Module, list[Any]]:
        """Parallelise first, then build the optimizers over the parallelised parameters (as Lightning's)."""
        module = self.setup_module_and_optimizers(module, [])[0]
        return module, build()

    def setup_module(self, module: nn.Module) -> nn.Module:
        """``parallelize_fn(module, mesh)`` when given (under the Trainer ``configure_model`` has already run), then
        materialise a meta-device module and check that the tensor-parallel shards are even."""
        from torch.distributed.fsdp import FullyShardedDataParallel

        if any(isinstance(m, FullyShardedDataParallel) for m in module.modules()):
            raise ConfigurationError(
                f"{type(module).__name__} holds modules wrapped in FSDP1's FullyShardedDataParallel, which "
                "ModelParallelStrategy does not support: shard with FSDP2's torch.distributed.fsdp.fully_shard."
            )
        if self._pipeline_size > 1 and (self._pipeline is None or module is not self._pipeline.module):
            # Fleet: the stage's layers, before parallelize_fn; the model set up last is the one pipeline_step runs
            self._pipeline = _pipeline.Pipeline(module, self.device_mesh, self._pipeline_schedule, self._microbatches,
                                                self._pipeline_spec, self._stages_per_rank)
        if self._parallelize_fn is not None:
            module = self._parallelize_fn(module, self.device_mesh)
            if not isinstance(module, nn.Module):
                raise ConfigurationError(f"parallelize_fn must return the nn.Module it parallelised; it returned a "
                                         f"{type(module).__name__}.")
        elif module is not self.lightning_module and not has_dtensors(module):
            raise ConfigurationError(
                f"ModelParallelStrategy was given no parallelize_fn, and the {type(module).__name__} being set up "
                "holds no DTensor parameter, so nothing would split it. Pass ModelParallelStrategy(parallelize_fn, "
                "...) with parallelize_fn(module, device_mesh) -> module applying parallelize_module and fully_shard."
            )
        if _on_meta(module):
            _materialize(module, self.root_device)
        _fsdp_hooks.sum_gradients_on_gloo(module)
        check_even_shards(module, self.device_mesh)
        if self._pipeline is not None:
            self._pipeline.build(module, self.root_device)
        if not any(r() is module for r in self._modules):
            self._modules.append(weakref.ref(module))
        return module

    def modules_set_up(self) -> list[nn.Module]:
        """The modules this strategy has set up (and that still exist)."""
        return [m for m in (r() for r in self._modules) if m is not None]

    def step_function(self, module: nn.Module, name: str) -> Callable[..., Any]:
        """Under pipeline parallelism, the training, validation and test steps are the schedule's (the Module's
        are not called); predict_step is refused."""
        if self._pipeline is None:
            return super().step_function(module, name)
        if name not in ("training_step", "validation_step", "test_step"):
            raise ConfigurationError(
                f"ModelParallelStrategy(pipeline_parallel_size={self._pipeline_size}) runs training, validation "
                f"and test steps only: {name} would call the Module's forward, which on each rank holds one stage's "
                "layers, and its outputs exist on the last stage only. Predict with pipeline_parallel_size=1 (a "
                "pipeline checkpoint loads there)."
            )
        return getattr(self._pipeline, name)

    def optimizer_step(
        self, optimizer: Any, closure: Callable[[], Any] | None = None, model: nn.Module | None = None,
        **kwargs: Any,
    ) -> Any:
        """Strategy's, then (pipeline parallel) the wait for the step's loss, whose broadcast overlapped the step.

        With a closure (its result is the loss, which the optimizer may read) the wait comes first."""
        pipeline = self._pipeline
        if pipeline is None:
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        if closure is not None:
            pipeline.wait_loss()
        try:
            return super().optimizer_step(optimizer, closure, model, **kwargs)
        finally:
            pipeline.wait_loss()

    def pipeline_step(self, module: nn.Module, batch: Any) -> Tensor:
        """Fleet's pipelined step: the schedule over ``batch``'s microbatches, forward and backward (under
        ``torch.no_grad()``: forward only); returns the mean microbatch loss, the same on every stage's rank.

        It replaces ``loss = loss_fn(model(x), y); fleet.backward(loss)``; ``optimizer.step()`` follows as usual.
        """
        pipeline = self._pipeline
        if pipeline is None or pipeline.module is not getattr(module, "module", module):
            raise ConfigurationError(
                "pipeline_step(model, batch) runs the pipeline of the model fleet.setup_module() split last, under "
                "ModelParallelStrategy(pipeline_parallel_size > 1); "
                + ("no model was split." if pipeline is None else "it was given another model.")
            )
        return pipeline.step(batch, torch.is_grad_enabled())

    def forward_method(self, module: nn.Module, name: str) -> Callable[..., Any]:
        """``name`` inside fully_shard's gather and reshard when the module is a fully_shard unit, else as it is."""
        _fsdp_hooks.register_forward_method(module, name)
        return getattr(module, name)

    @contextlib.contextmanager
    def no_backward_sync(self, module: nn.Module, enabled: bool = True) -> Iterator[None]:
        """No data-parallel gradient reduction in the block (gradient accumulation); tensor parallel is unchanged."""
        from torch.distributed.fsdp import FSDPModule

        units = [m for m in module.modules() if isinstance(m, FSDPModule)] if enabled else []
        for unit in units:
            unit.set_requires_gradient_sync(False, recurse=False)
        try:
            yield
        finally:
            for unit in units:
                unit.set_requires_gradient_sync(True, recurse=False)

    #: FSDP2 gathers parameters into buffers it reuses in training; inference tensors cannot be written to later
    supports_inference_mode = False
    #: a checkpoint's entries load into the parallelised module, so after ``setup``
    restore_checkpoint_after_setup = True

    def clip_gradients_norm(self, module: nn.Module | None, optimizer: Optimizer | None, max_norm: float,
                            norm_type: float = 2.0, error_if_nonfinite: bool = False) -> Tensor:
        """Clip to a total norm over every rank's DTensor gradients; returns that norm as a plain tensor.

        Parameters may live on different meshes (tensor-parallel layers on both dimensions, the rest on the
        data-parallel one), whose norms torch cannot stack: each mesh's norm is taken whole, then combined.
        """
        if optimizer is not None:
            self.precision.unscale_gradients(optimizer)
        params = self._gradient_params(module, optimizer)
        total = total_norm([p.grad for p in params], norm_type)
        if self._pipeline is not None:  # each stage holds other parameters
            total = _pipeline.combine_stage_norms(total.to(self.root_device), norm_type, self._pipeline.group)
        if error_if_nonfinite and not self.precision.skips_nonfinite_steps and not torch.isfinite(total):
            raise RuntimeError(f"The total norm of order {norm_type} of the gradients is non-finite ({total.item()}), "
                               "so they cannot be clipped (error_if_nonfinite=True).")
        coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0).item()
        if coefficient < 1.0:
            for p in params:
                p.grad.mul_(coefficient)
        return total.to(self.root_device)

    # ----------------------------------------------------------------- checkpoints (FSDPStrategy's helpers)
    @property
    def state_dict_type(self) -> str:
        """"sharded" (``save_distributed_checkpoint=True``) or "full", as FSDPStrategy names its layouts."""
        return "sharded" if self._save_distributed_checkpoint else "full"

    # FSDPStrategy's, as they are: torch's state dict helpers handle DTensors of any placement
    #: distributed: this rank's DTensors under the user's names; otherwise the whole state on rank 0, {} elsewhere
    module_state_dict = _fsdp_checkpoint.module_state

    def optimizer_state_dict(self, optimizer: Optimizer) -> dict[str, Any]:
        """Distributed: FQN-keyed DTensor state (its param_groups naming every stage's parameters); otherwise
        ``torch.optim``'s positional form, whole, on rank 0."""
        state = _fsdp_checkpoint.optimizer_state(self, optimizer)
        if self._pipeline is None:
            return state
        return _pipeline.all_stages_param_groups(state, self._pipeline.group, self._pipeline.stage_of)

    #: any layout; DCP entries stay on disk until ``load_into`` reads them straight into the DTensors
    load_checkpoint = FSDPStrategy.load_checkpoint

    def load_into(self, checkpoint: Any, state: Any, strict: bool = True, path: Any = None) -> None:
        """Into the parallelised modules and optimizers in ``state``, from DCP files or whole state dicts; under
        pipeline parallelism each stage loads its keys, the strict check being over the union of the stages'."""
        if self._pipeline is not None and strict:
            _pipeline.check_stages_cover(checkpoint, state, self._pipeline.group)
            strict = False
        _fsdp_checkpoint.load_into(self, checkpoint, state, strict=strict, path=path)

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: str | os.PathLike,
                        storage_options: Any | None = None) -> None:
        """Distributed: every rank writes its shards into the checkpoint directory ``filepath``; else rank 0, one file."""
        distributed = self._save_distributed_checkpoint
        if distributed and storage_options is not None:
            raise TypeError(
                f"ModelParallelStrategy(save_distributed_checkpoint=True) writes checkpoint directories itself and "
                f"takes no storage_options (got {storage_options!r}); use save_distributed_checkpoint=False."
            )
        if distributed:
            save_dcp_checkpoint(filepath, checkpoint, self)
        else:
            super().save_checkpoint(checkpoint, filepath, storage_options)

    # ----------------------------------------------------------------- planning
    configure_model_parallelizes = True

    def memory_model(self, module: nn.Module, world_size: int, num_nodes: int) -> MemoryModel:
        """One rank's share of a (data parallel x tensor parallel) mesh: ``configure_model``'s plan traced on a fake
        mesh (strategies/_tp_memory.py); with pipeline stages, every stage is counted as holding the whole model."""
        per_node = world_size // num_nodes
        if self._pipeline_size > 1:
            dp, tp = pipeline_mesh_sizes(self._pipeline_size, self._data_parallel_size, self._tensor_parallel_size,
                                         per_node, num_nodes)[1:]
        else:
            dp, tp = mesh_sizes(self._data_parallel_size, self._tensor_parallel_size, per_node, num_nodes)
        return tensor_parallel_model(module, dp, tp)

    # ----------------------------------------------------------------- teardown
    def teardown(self) -> None:
        """The parts' teardown; the module stays parallelised where it is (its DTensors belong to the mesh's devices)."""
        module, self._lightning_module = self._lightning_module, None  # Strategy.teardown would move it to the CPU
        try:
            super().teardown()
        finally:
            self._lightning_module = module

    def __repr__(self) -> str:
        sizes = self._sizes or (self._data_parallel_size, self._tensor_parallel_size)
        pp = f"pipeline_parallel_size={self._pipeline_size}, " if self._pipeline_size > 1 else ""
        return (f"ModelParallelStrategy({pp}data_parallel_size={sizes[0]!r}, tensor_parallel_size={sizes[1]!r}, "
                f"devices={self.num_processes}, num_nodes={self.num_nodes}, "
                f"save_distributed_checkpoint={self._save_distributed_checkpoint}, precision={self.precision!r})")
