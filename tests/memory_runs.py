"""Real training runs measured for estimate_memory's accuracy (tests/test_memory_estimate.py, bench/memory.py).

The measurement is torch's MemTracker (live tensor storages, the CPU's equivalent of max_memory_allocated), entered
for the third training step inside the Trainer's run, with the parameters, gradients, optimizer states and batch
that exist before it given to ``track_external``. Under DeepSpeed the tensors its engine holds are given too (the
ZeRO optimizer's flat parameter buffers and partitions, its fp32 master partition and its gradients, the inner
torch optimizer's states, the reduce buckets: ``engine_tensors``), and every figure counts a storage once however
many tensors view it. Nothing here comes from torchfleet's planner.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from torch.utils.data import DataLoader

from torchfleet import Callback, Module, Trainer


class Blocks(Module):
    """``blocks`` residual MLP blocks of ``width`` (4x hidden), with the optimizer and checkpointing chosen by name."""

    def __init__(self, width: int = 256, blocks: int = 4, optimizer: str = "adamw", checkpointing: bool = False):
        super().__init__()
        self.layers = nn.ModuleList(Block(width) for _ in range(blocks))
        self.optimizer_name, self.checkpointing = optimizer, checkpointing

    def forward(self, x):
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False) if self.checkpointing else layer(x)
        return x

    def training_step(self, batch, batch_idx):
        return self(batch).float().pow(2).mean()

    def configure_optimizers(self):
        if self.optimizer_name == "sgd":
            return torch.optim.SGD(self.parameters(), lr=0.01, momentum=0.9)
        if self.optimizer_name == "adam":
            return torch.optim.Adam(self.parameters(), lr=1e-3)
        return torch.optim.AdamW(self.parameters(), lr=1e-3)


class TPBlocks(Blocks):
    """Blocks whose ``configure_model`` parallelises each block Megatron's way over the mesh's "tensor_parallel"
    dimension (``up`` column-wise, ``down`` row-wise), then shards over "data_parallel" when it has several ranks."""

    def configure_model(self):
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

        mesh = self.device_mesh
        for layer in self.layers:
            parallelize_module(layer, mesh["tensor_parallel"], {"up": ColwiseParallel(), "down": RowwiseParallel()})
        if mesh["data_parallel"].size() > 1:
            for layer in self.layers:
                fully_shard(layer, mesh=mesh["data_parallel"])
            fully_shard(self, mesh=mesh["data_parallel"])


class Block(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)

    def forward(self, x):
        return x + self.down(nn.functional.gelu(self.up(x)))


class StepPeak(Callback):
    """Measures the live tensor storages of training step ``step`` (0-based) with torch's MemTracker.

    ``params``: the bytes of the storages holding this rank's parameters (a DTensor's local shard, ZeRO-3's partition
    ``ds_tensor``, ZeRO-1/2's flat buffer once); ``states``: the optimizer's states plus, under DeepSpeed, the fp32
    master partition the inner torch optimizer updates (what the planner's ``optimizer_states`` holds)."""

    def __init__(self, step: int = 2):
        self.step, self.tracker, self.peak, self.states, self.params = step, None, None, None, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step != self.step:
            return
        from torch.distributed._tools.mem_tracker import MemTracker

        engine = getattr(trainer.strategy, "engine", None)
        optimizers = _torch_optimizers(engine.optimizer) if engine is not None else trainer.optimizers
        self.tracker = MemTracker()
        self.tracker.track_external(pl_module, *optimizers, batch)
        if engine is not None:
            self.tracker.track_external(*engine_tensors(engine))
        # DeepSpeed's fp32 master partition: stages 1-2 keep it in the inner optimizer's param groups, stage 3 puts
        # it there only during its step
        zero = engine.optimizer if engine is not None else None
        masters = [*getattr(zero, "single_partition_of_fp32_groups", ()), *getattr(zero, "fp32_partitioned_groups_flat", ())]
        self.states = _unique_bytes([t for opt in optimizers for s in opt.state.values() for t in s.values()] + masters)
        self.params = _unique_bytes([getattr(p, "ds_tensor", p) for p in pl_module.parameters()])
        self.tracker.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.tracker is not None and self.peak is None:
            self.tracker.__exit__(None, None, None)
            peaks = self.tracker.get_tracker_snapshot("peak").values()
            #: the bytes by MemTracker's kind (Parameter, Gradient, Optstate, Activation, Temp, Other) at the peak
            self.at_peak = max(peaks, key=lambda v: v["Total"])
            self.peak = self.at_peak["Total"]


def measure(module: Module, batch: torch.Tensor, precision: str = "32-true", **trainer_kwargs) -> dict[str, int]:
    """Train ``module`` for 3 steps on copies of ``batch``; the third step's peak, parameter and state bytes."""
    probe = StepPeak()
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=3, precision=precision, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[probe], **trainer_kwargs)
    trainer.fit(module, DataLoader([batch.clone() for _ in range(3)], batch_size=None))
    return {"peak": probe.peak, "parameters": probe.params, "optimizer_states": probe.states}


def _unique_bytes(tensors) -> int:
    """Bytes of the storages behind ``tensors`` on this rank (a DTensor's local shard), each storage once."""
    storages = {}
    for tensor in tensors:
        if isinstance(tensor, torch.Tensor):
            storage = getattr(tensor, "_local_tensor", tensor).untyped_storage()
            storages[storage.data_ptr(), storage.nbytes()] = storage.nbytes()
    return sum(storages.values())


def _torch_optimizers(zero) -> list[torch.optim.Optimizer]:
    """The torch optimizer(s) inside DeepSpeed's ZeRO optimizer (its ``optimizer``; the ZeRO one when it is one)."""
    found = [o for o in (zero, getattr(zero, "optimizer", None)) if isinstance(o, torch.optim.Optimizer)]
    return found[-1:]


def engine_tensors(engine) -> list[torch.Tensor]:
    """Every tensor DeepSpeed's engine keeps in its ZeRO optimizer: found by walking its attributes (lists, dicts and
    DeepSpeed's or torch's own objects within, the inner torch optimizer's states and partitions included), so the
    flat parameter buffers, the fp32 master partition, the gradient partitions and the reduce buckets all count."""
    found, seen, todo = [], set(), [engine.optimizer]
    while todo:
        obj = todo.pop()
        if id(obj) in seen or obj is None:
            continue
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            found.append(obj)
            if obj.grad is not None:
                todo.append(obj.grad)
        elif isinstance(obj, dict):
            todo.extend(obj.keys())
            todo.extend(obj.values())
        elif isinstance(obj, (list, tuple, set)):
            todo.extend(obj)
        elif isinstance(obj, nn.Module):
            continue  # the module's parameters are tracked as the module's
        elif type(obj).__module__.startswith(("deepspeed", "torch.optim")) and hasattr(obj, "__dict__"):
            todo.extend(vars(obj).values())
    return found


def deepspeed_strategy(stage: int, bucket: int, persistence: int | None = None):
    """DeepSpeed at ZeRO ``stage`` with reduce and all-gather (stage 3: prefetch) buckets of ``bucket`` elements, so
    that the buckets do not dwarf a small model; ``persistence``: stage 3's ``stage3_param_persistence_threshold``
    (parameters smaller than this many elements stay whole on every rank; DeepSpeed's default when None)."""
    from torchfleet.strategies import DeepSpeedStrategy

    strategy = DeepSpeedStrategy(stage=stage, reduce_bucket_size=bucket, allgather_bucket_size=bucket)
    if stage == 3:
        strategy.config["zero_optimization"]["stage3_prefetch_bucket_size"] = bucket
        if persistence is not None:
            strategy.config["zero_optimization"]["stage3_param_persistence_threshold"] = persistence
    return strategy


#: the measured DeepSpeed runs (tests/distributed/test_memory_estimate.py, bench/memory.py): ZeRO 2 and 3 x
#: checkpointing x fp32 / bf16-mixed, AdamW; buckets of 20,000 elements (DeepSpeed's default 200M-element buckets would
#: be 800 MB beside a 2 MB model); stage 3 partitions every parameter (persistence threshold 0)
DEEPSPEED_RUNS = [{"name": f"ds{stage}{'_ac' * ac}{'_bf16' * bf16}", "strategy": "deepspeed", "stage": stage, "ac": ac,
                   "bucket": 20_000, "persistence": 0 if stage == 3 else None,
                   "precision": "bf16-mixed" if bf16 else "32-true"}
                  for bf16 in (False, True) for ac in (False, True) for stage in (2, 3)]


def predict_deepspeed(run: dict, width: int, blocks: int, rows: int):
    """estimate_memory for one of ``DEEPSPEED_RUNS`` on the Blocks model (which checkpoints its own blocks)."""
    from torchfleet import estimate_memory

    return estimate_memory(Blocks(width, blocks, checkpointing=run["ac"]), torch.randn(rows, width),
                           strategy=deepspeed_strategy(run["stage"], run["bucket"], run["persistence"]),
                           devices=2, precision=run["precision"])
