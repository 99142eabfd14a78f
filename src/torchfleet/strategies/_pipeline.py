"""Pipeline parallelism for ModelParallelStrategy: how a Module declares its stages, and one pipelined step.

A Module declares its stages with ``configure_pipeline(self) -> PipelineSpec``: the split points are names of
children of one ``nn.Sequential`` of the Module (``"layers.2"``: stage 1 begins at ``layers[2]``), and the
Module's ``forward`` runs that Sequential on its input (``return self.layers(x)``), so the same Module trains
unchanged without pipeline parallelism, where the hook is never called. Under ``pipeline_parallel_size > 1``
each rank keeps its stage's children only (the others are deleted, the kept ones keep their names, so the
state dict of a stage holds the whole model's keys for that stage: the union of the stages' distributed
checkpoints is the whole model). This happens before ``configure_model``, which then parallelises the stage
(FSDP2 over ``device_mesh["data_parallel"]``, tensor parallel over ``["tensor_parallel"]``).

A training step under PP runs one schedule of ``torch.distributed.pipelining`` over the batch's microbatches
(forward and backward together, the gradients of the mean microbatch loss); the Module's ``training_step`` is
not called. The loss it returns is the mean of the microbatch losses, sent from the last stage to every stage's
rank, so the Trainer, callbacks and (``PipelineSpec.log_loss_as``) ``self.log`` see it on every rank. A
validation or test step runs the schedule's ``eval()`` (forward only, the same microbatches, ``loss_fn`` on the
last stage) and returns and logs (``log_val_loss_as`` / ``log_test_loss_as``) its mean loss the same way; the
Module's ``validation_step`` is not called either.

Under Fleet the spec is ``ModelParallelStrategy(pipeline=PipelineSpec(...))`` (else the module's
``configure_pipeline()``): ``fleet.setup_module`` prunes the module to the rank's stage before ``parallelize_fn``,
and ``fleet.strategy.pipeline_step(model, batch)`` replaces ``loss = loss_fn(model(x), y); fleet.backward(loss)``
(under ``torch.no_grad()``: forward only, for evaluation).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from torchfleet.errors import ConfigurationError, MisconfiguredModuleError, unknown_name

if TYPE_CHECKING:
    from torch.distributed.device_mesh import DeviceMesh

#: the schedules running several stages on each rank (``stages_per_rank``), rank r holding stages r, r + pp, ...
MULTI_STAGE = ("Interleaved1F1B", "LoopedBFS")
#: the schedules ``ModelParallelStrategy(pipeline_schedule=...)`` accepts, by name (torch's class names)
SCHEDULES = ("GPipe", "1F1B", *MULTI_STAGE)
#: the 3-D mesh's dimension names when pipeline_parallel_size > 1, outermost first
PIPELINE_MESH_DIMS = ("pipeline_parallel", "data_parallel", "tensor_parallel")


def _inputs_and_target(batch: Any) -> tuple[Any, Tensor]:
    inputs, target = batch[0], batch[1]
    return inputs, target


@dataclass(frozen=True)
class PipelineSpec:
    """How a Module splits into pipeline stages; what its ``configure_pipeline()`` returns.

    ``split_points``: the names (``named_modules``) of the children of one ``nn.Sequential`` where stage 1, 2, ...
    begin (one fewer than the number of stages). ``loss_fn(output, target)``: the loss of one microbatch (the
    Module's ``training_step`` loss, computed on the last stage). ``split_batch(batch) -> (inputs, target)``:
    default ``batch[0], batch[1]``. ``log_loss_as``, ``log_val_loss_as``, ``log_test_loss_as``: names to
    ``self.log`` the training, validation and test steps' losses under (``sync_dist``; under the Trainer).
    """

    split_points: Sequence[str]
    loss_fn: Callable[[Tensor, Tensor], Tensor]
    split_batch: Callable[[Any], tuple[Any, Tensor]] = _inputs_and_target
    log_loss_as: str | None = None
    log_val_loss_as: str | None = None
    log_test_loss_as: str | None = None


def check_schedule(name: Any, stages_per_rank: int = 1, microbatches: int | None = None, size: int = 1) -> str:
    """``name`` when torch's schedule of that name takes ``stages_per_rank`` and ``microbatches`` over ``size`` ranks."""
    if name not in SCHEDULES:
        raise unknown_name("pipeline_schedule", name, SCHEDULES,
                           hint="They are torch.distributed.pipelining's ScheduleGPipe, Schedule1F1B, "
                                "ScheduleInterleaved1F1B and ScheduleLoopedBFS.")
    if stages_per_rank > 1 and name not in MULTI_STAGE:
        raise ConfigurationError(
            f"ModelParallelStrategy(pipeline_schedule={name!r}) runs one stage per rank, but stages_per_rank="
            f"{stages_per_rank}: give pipeline_schedule='Interleaved1F1B' or 'LoopedBFS', or stages_per_rank=1."
        )
    if microbatches is None or size == 1:
        return name
    if name == "1F1B" and microbatches < size:
        raise ConfigurationError(
            f"ModelParallelStrategy(pipeline_schedule='1F1B', microbatches={microbatches}): torch's Schedule1F1B "
            f"needs at least as many microbatches as stages ({size}). Raise microbatches, or use 'GPipe'."
        )
    rounds = max(1, microbatches // size)  # torch's ScheduleInterleaved1F1B's rounds of microbatches
    if name == "Interleaved1F1B" and microbatches % rounds:
        raise ConfigurationError(
            f"ModelParallelStrategy(pipeline_schedule='Interleaved1F1B', microbatches={microbatches}, "
            f"pipeline_parallel_size={size}): torch's interleaved schedule runs max(1, microbatches // "
            f"pipeline_parallel_size) = {rounds} rounds of equal size, which {microbatches} microbatches do not "
            f"make. Give a multiple of pipeline_parallel_size ({size}, e.g. {size * rounds}), or fewer than {size}."
        )
    return name


def _schedule_class(name: str) -> Any:
    from torch.distributed import pipelining

    return {"GPipe": pipelining.ScheduleGPipe, "1F1B": pipelining.Schedule1F1B,
            "Interleaved1F1B": pipelining.ScheduleInterleaved1F1B, "LoopedBFS": pipelining.ScheduleLoopedBFS}[name]


def stage_children(module: nn.Module, spec: Any, num_stages: int, per_rank: int = 1) -> tuple[str, list[list[str]]]:
    """The Sequential's name and, per stage, the names of its children that stage keeps; refuses a bad spec."""
    owner = type(module).__name__
    sizes = f"pipeline_parallel_size={num_stages // per_rank}" + (
        f" x stages_per_rank={per_rank}" if per_rank > 1 else "")
    if not isinstance(spec, PipelineSpec):
        raise MisconfiguredModuleError(
            f"{owner}.configure_pipeline() returned {type(spec).__name__}, but {sizes} "
            "needs a torchfleet.strategies.PipelineSpec(split_points=[...], loss_fn=...) naming where each stage "
            "after the first begins."
        )
    points = list(spec.split_points)
    parents = {p.rpartition(".")[0] for p in points}
    modules = dict(module.named_modules())
    parent = parents.pop() if len(parents) == 1 else None
    sequential = modules.get(parent) if parent is not None else None
    if len(points) != num_stages - 1 or not isinstance(sequential, nn.Sequential):
        raise MisconfiguredModuleError(
            f"{owner}.configure_pipeline() gave split points {points}; {sizes} needs "
            f"{num_stages - 1} of them, each the name of a child of the same nn.Sequential of the Module (e.g. "
            "'layers.2' for stage 1 to begin at self.layers[2]), whose forward runs that Sequential."
        )
    names = list(sequential._modules)
    local = [p.rpartition(".")[2] for p in points]
    starts = [names.index(n) if n in names else -1 for n in local]
    if min(starts) <= 0 or starts != sorted(set(starts)):
        raise MisconfiguredModuleError(
            f"{owner}.configure_pipeline(): the split points {points} must be children of {parent} other than the "
            f"first, in increasing order, each stage keeping at least one child ({parent} has {names})."
        )
    bounds = [0, *starts, len(names)]
    inside = {id(p) for p in sequential.parameters()}
    outside = [n for n, p in module.named_parameters() if id(p) not in inside]
    if outside:
        raise MisconfiguredModuleError(
            f"{owner} has parameters outside {parent} ({', '.join(outside[:3])}), which no pipeline stage would "
            f"own: put every layer of the model into the nn.Sequential {parent} that configure_pipeline() splits."
        )
    return parent, [names[a:b] for a, b in zip(bounds, bounds[1:])]


class Pipeline:
    """One rank's pipeline stages: the pruned Module, its ``PipelineStage`` objects and schedule, and the pipelined step.

    With ``stages_per_rank`` > 1 (a multi-stage schedule) the split points make ``pp * stages_per_rank`` stages,
    rank r keeping stages r, r + pp, ... (torch's round-robin); ``modules`` holds one ``nn.Sequential`` per local
    stage over the kept children (the same modules, still registered under their names in the Module), which
    the schedule runs and ``configure_model`` shards one by one.
    """

    def __init__(self, module: nn.Module, mesh: DeviceMesh, schedule: str, microbatches: int | None,
                 spec: PipelineSpec | None = None, stages_per_rank: int = 1) -> None:
        if not getattr(module, "automatic_optimization", True):
            raise ConfigurationError(
                f"{type(module).__name__} uses manual optimisation, which pipeline parallelism does not support: "
                "the schedule runs forward and backward of every microbatch itself. Use automatic optimisation, "
                "or pipeline_parallel_size=1."
            )
        configure = getattr(module, "configure_pipeline", None) if spec is None else lambda: spec
        if configure is None:
            raise ConfigurationError(
                f"{type(module).__name__} does not define configure_pipeline(), which pipeline_parallel_size > 1 "
                "needs: return a torchfleet.strategies.PipelineSpec(split_points=['layers.2'], loss_fn=...) naming "
                "where each stage after the first begins in an nn.Sequential that the Module's forward runs (or, "
                "under Fleet, pass it as ModelParallelStrategy(..., pipeline=PipelineSpec(...)))."
            )
        spec = configure()
        self.group = mesh.get_group("pipeline_parallel")
        self.size = mesh.size(0)
        self.num_stages = self.size * stages_per_rank
        rank = mesh.get_local_rank("pipeline_parallel")
        #: this rank's stages, in order: rank, rank + pp, ... (the stage-to-rank mapping torch's schedules assume)
        self.stage_indices = list(range(rank, self.num_stages, self.size))
        parent, stages = stage_children(module, spec, self.num_stages, stages_per_rank)
        sequential = module.get_submodule(parent)
        for name in [n for i, kept in enumerate(stages) if i not in self.stage_indices for n in kept]:
            delattr(sequential, name)  # not ``del seq[i]``, which renumbers the rest: the names stay the model's
        self.spec, self.module, self.schedule_name = spec, module, schedule
        self._child_stage = {f"{parent}.{n}": i for i, kept in enumerate(stages) for n in kept}
        self.multi_stage = schedule in MULTI_STAGE
        #: one Sequential per local stage (multi-stage schedules; not registered in the Module: no second names)
        self.modules: list[nn.Module] | None = None
        if self.multi_stage:
            from collections import OrderedDict

            self.modules = [nn.Sequential(OrderedDict((n, sequential.get_submodule(n)) for n in stages[i]))
                            for i in self.stage_indices]
        self.microbatches = microbatches if microbatches is not None else self.size
        self.schedule: Any = None
        #: the Trainer's training step broadcasts the loss asynchronously and the strategy waits for it after the
        #: optimizer step (``wait_loss``): the last stage steps its optimizer while the first finishes its backward.
        #: Set only where nothing can read the loss before that (the Module keeps the default optimizer_step).
        self.defer_loss = False
        self._pending: Any = None

    def stage_of(self, name: str) -> int:
        """The index of the stage holding the parameter ``name`` (a fully qualified name; 0 when none matches)."""
        parts = name.split(".")
        return next((self._child_stage[".".join(parts[:k])] for k in range(len(parts), 0, -1)
                     if ".".join(parts[:k]) in self._child_stage), 0)

    @property
    def is_first(self) -> bool:
        return self.stage_indices[0] == 0

    @property
    def is_last(self) -> bool:
        return self.stage_indices[-1] == self.num_stages - 1

    def build(self, module: nn.Module, device: torch.device) -> None:
        """The stages and schedule, once the Module is parallelised (``configure_model`` ran)."""
        from torch.distributed.fsdp import FSDPModule
        from torch.distributed.pipelining import PipelineStage

        if self.modules is None:
            stage = PipelineStage(module, self.stage_indices[0], self.num_stages, device, group=self.group)
            self.schedule = _schedule_class(self.schedule_name)(stage, self.microbatches, loss_fn=self.spec.loss_fn)
            return
        sharded = any(isinstance(m, FSDPModule) for m in module.modules())
        if sharded and not all(isinstance(m, FSDPModule) for m in self.modules):
            raise ConfigurationError(
                f"pipeline_schedule={self.schedule_name!r} runs each of this rank's stages by itself, so fully_shard "
                "must shard each stage whole: apply it to the stages (`for stage in self.pipeline_stages: "
                "fully_shard(stage, mesh=self.device_mesh['data_parallel'])`; under Fleet "
                "strategy.pipeline_stages), not to the Module or its layers, whose gather hooks the schedule "
                "would never run."
            )
        stages = [PipelineStage(m, i, self.num_stages, device, group=self.group)
                  for m, i in zip(self.modules, self.stage_indices)]
        self.schedule = _schedule_class(self.schedule_name)(stages, self.microbatches, loss_fn=self.spec.loss_fn)

    def training_step(self, batch: Any, batch_idx: int | None = None) -> Tensor:
        """The schedule over ``batch`` (forward and backward); the mean microbatch loss, the same on every stage
        (once ``wait_loss`` returned, when ``defer_loss``: the strategy's optimizer_step waits for it)."""
        log_as = self.spec.log_loss_as
        return self.step(batch, True, log_as, defer=self.defer_loss and log_as is None)

    def validation_step(self, batch: Any, batch_idx: int | None = None) -> Tensor:
        """The schedule's forward only over ``batch``; the mean microbatch loss, the same on every stage."""
        return self.step(batch, False, self.spec.log_val_loss_as)

    def test_step(self, batch: Any, batch_idx: int | None = None) -> Tensor:
        return self.step(batch, False, self.spec.log_test_loss_as)

    def wait_loss(self) -> None:
        """Wait for a deferred broadcast of the last training step's loss (nothing to do when none is pending)."""
        work, self._pending = self._pending, None
        if work is not None:
            work.wait()

    def step(self, batch: Any, train: bool, log_as: str | None = None, defer: bool = False) -> Tensor:
        """One schedule over ``batch``'s microbatches, with backward when ``train``; logs the loss as ``log_as``.

        ``defer``: the loss's broadcast from the last stage is started, not waited for (``wait_loss``)."""
        self.wait_loss()
        inputs, target = self.spec.split_batch(batch)
        size = len(target)
        if size % self.microbatches:
            raise ConfigurationError(
                f"A {'training' if train else 'evaluation'} batch of {size} samples does not split into "
                f"microbatches={self.microbatches} equal microbatches, so the pipeline's mean microbatch loss would "
                "not be the batch's mean loss. Make each rank's batch size (the global batch / data_parallel_size) "
                f"a multiple of {self.microbatches}, or pass a microbatches that divides it "
                "(ModelParallelStrategy(microbatches=...))."
            )
        if train and any(p.grad is not None for p in self.module.parameters()):
            raise ConfigurationError(
                "Pipeline parallelism found gradients left from an earlier batch (accumulate_grad_batches > 1, or "
                "no optimizer.zero_grad()?): the schedule scales the gradients it holds by 1/microbatches, so it "
                "cannot accumulate across batches. Raise microbatches and the batch size instead."
            )
        losses: list[Tensor] = []
        args = (inputs,) if self.is_first else ()
        run = self.schedule.step if train else self.schedule.eval
        run(*args, target=target if self.is_last else None, losses=losses if self.is_last else None)
        device = target.device
        loss = torch.stack([x.detach().float() for x in losses]).mean() if self.is_last else torch.zeros((), device=device)
        work = torch.distributed.broadcast(loss, group=self.group, group_src=(self.num_stages - 1) % self.size,
                                           async_op=defer)
        if defer:
            self._pending = work
        if log_as:
            self.module.log(log_as, loss, sync_dist=True)  # type: ignore[operator]
        return loss


def all_stages_param_groups(state: Any, group: Any, stage_of: Callable[[str], int] = lambda name: 0) -> Any:
    """An FQN-keyed optimizer state whose ``param_groups`` name every stage's parameters, in stage order
    (``stage_of(name)``: its stage; ranks hold several, not consecutive, under a multi-stage schedule).

    A distributed checkpoint keeps one copy of an entry that is not a tensor (rank 0's): without this, its
    param_groups would name stage 0's parameters only, and a run without pipeline stages could not load it.
    """
    import torch.distributed as dist

    groups = state["param_groups"]
    gathered: list[Any] = [None] * dist.get_world_size(group)
    dist.all_gather_object(gathered, [g["params"] for g in groups], group=group)
    for i, g in enumerate(groups):
        g["params"] = sorted((name for rank in gathered for name in rank[i]), key=stage_of)  # stable
    return state


def check_stages_cover(checkpoint: Any, state: Any, group: Any) -> None:
    """Refuse a distributed checkpoint whose model keys differ from the union of the stages' (strict loading).

    Each stage loads its own keys only, so torch's strict check per rank would call the other stages' extra.
    """
    import torch.distributed as dist

    from torchfleet.checkpoint.dcp import DCPEntry, saved_keys
    from torchfleet.errors import CheckpointError

    for key, target in state.items():
        entry = checkpoint.get(key)
        if not isinstance(entry, DCPEntry) or not isinstance(target, nn.Module):
            continue
        gathered: list[Any] = [None] * dist.get_world_size(group)
        dist.all_gather_object(gathered, [f"{key}.{k}" for k in target.state_dict()], group=group)
        union = {k for stage in gathered for k in stage}
        saved = {k for k in saved_keys(entry.path, entry.weights_only) if k.startswith(f"{key}.")}
        if union != saved:
            raise CheckpointError(
                f"The checkpoint {entry.path!r} does not fit the pipeline's stages: missing from it: "
                f"{sorted(union - saved)[:5]}; in it but in no stage: {sorted(saved - union)[:5]}. Build the model "
                "with the same arguments as the run that wrote it, or load with strict=False."
            )


def combine_stage_norms(norm: Tensor, norm_type: float, group: Any) -> Tensor:
    """The norm over every stage's gradients from this stage's ``norm`` (each stage holds different parameters)."""
    import math

    import torch.distributed as dist

    if math.isinf(norm_type):
        dist.all_reduce(norm, op=dist.ReduceOp.MAX, group=group)
        return norm
    total = norm.pow(norm_type)
    dist.all_reduce(total, group=group)
    return total.pow(1.0 / norm_type)
