"""Real training runs measured for estimate_memory's accuracy (tests/test_memory_estimate.py, bench/memory.py).

The measurement is torch's MemTracker (live tensor storages, the CPU's equivalent of max_memory_allocated), entered
for the third training step inside the Trainer's run, with the parameters, gradients, optimizer states and batch
that exist before it given to ``track_external``. Nothing here comes from torchfleet's planner.
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
    """Measures the live tensor storages of training step ``step`` (0-based) with torch's MemTracker."""

    def __init__(self, step: int = 2):
        self.step, self.tracker, self.peak, self.states, self.params = step, None, None, None, None

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if trainer.global_step != self.step:
            return
        from torch.distributed._tools.mem_tracker import MemTracker

        self.tracker = MemTracker()
        self.tracker.track_external(pl_module, *trainer.optimizers, batch)
        self.states = sum(_local_bytes(t) for opt in trainer.optimizers for s in opt.state.values()
                          for t in s.values() if isinstance(t, torch.Tensor))
        self.params = sum(_local_bytes(p) for p in pl_module.parameters())
        self.tracker.__enter__()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if self.tracker is not None and self.peak is None:
            self.tracker.__exit__(None, None, None)
            self.peak = max(v["Total"] for v in self.tracker.get_tracker_snapshot("peak").values())


def measure(module: Module, batch: torch.Tensor, precision: str = "32-true", **trainer_kwargs) -> dict[str, int]:
    """Train ``module`` for 3 steps on copies of ``batch``; the third step's peak, parameter and state bytes."""
    probe = StepPeak()
    trainer = Trainer(accelerator="cpu", devices=1, max_steps=3, precision=precision, logger=False,
                      enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[probe], **trainer_kwargs)
    trainer.fit(module, DataLoader([batch.clone() for _ in range(3)], batch_size=None))
    return {"peak": probe.peak, "parameters": probe.params, "optimizer_states": probe.states}


def _local_bytes(tensor: torch.Tensor) -> int:
    """Bytes of the storage behind ``tensor`` on this rank (a DTensor's local shard)."""
    return getattr(tensor, "_local_tensor", tensor).untyped_storage().nbytes()
