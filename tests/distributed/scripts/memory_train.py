"""2 ranks on gloo train the Blocks model of tests/memory_runs.py under each configuration of ``cfg["runs"]``; each
rank writes its third step's peak (torch's MemTracker, plus DDP's C++ gradient buckets, which Python cannot see)
and its parameter and optimizer-state bytes to ``cfg["out"]``.<rank>."""

from __future__ import annotations

import json
import sys
import time

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from tests.memory_runs import Block, Blocks, StepPeak, TPBlocks, deepspeed_strategy
from torchfleet import Trainer
from torchfleet.strategies import DDPStrategy, FSDPStrategy, ModelParallelStrategy


def strategy_for(run: dict):
    if run["strategy"] == "deepspeed":
        return deepspeed_strategy(run["stage"], run["bucket"], run.get("persistence"))
    if run["strategy"] == "ddp":
        return DDPStrategy()
    if run["strategy"] == "model_parallel":
        return ModelParallelStrategy(tensor_parallel_size=run["tp"])
    return FSDPStrategy(auto_wrap_policy={Block}, activation_checkpointing_policy={Block} if run.get("ac") else None)


def bucket_bytes(wrapped) -> int:
    """Bytes of DDP's gradient buckets (held by its C++ reducer), from DDP's logging data; 0 without DDP."""
    ddp = [m for m in wrapped.modules() if isinstance(m, DistributedDataParallel)] if wrapped is not None else []
    data = ddp[0]._get_ddp_logging_data() if ddp else {}
    return sum(int(s) for s in str(data.get("bucket_sizes", "")).split(",") if s.strip())


class Probe(StepPeak):
    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        if trainer.global_step == self.step + 1:
            self.buckets = bucket_bytes(trainer.strategy.model)


def main(cfg: dict) -> None:
    results = {}
    for run in cfg["runs"]:
        started = time.perf_counter()
        probe = Probe()
        trainer = Trainer(accelerator="cpu", devices=2, strategy=strategy_for(run), max_steps=3,
                          precision=run.get("precision", "32-true"), logger=False, enable_checkpointing=False,
                          enable_progress_bar=False, enable_model_summary=False, callbacks=[probe])
        batch = torch.randn(cfg["rows"], cfg["width"], generator=torch.Generator().manual_seed(0))
        model = TPBlocks if run["strategy"] == "model_parallel" else Blocks
        # fsdp checkpoints by its policy; under DeepSpeed the module checkpoints its blocks itself
        module = model(cfg["width"], cfg["blocks"], run.get("optimizer", "adamw"),
                       checkpointing=run.get("ac", False) and run["strategy"] == "deepspeed")
        trainer.fit(module, DataLoader([batch] * 6, batch_size=None))
        results[run["name"]] = {"peak": probe.peak + probe.buckets, "buckets": probe.buckets,
                                "parameters": probe.params, "optimizer_states": probe.states,
                                "at_peak": {str(k): v for k, v in probe.at_peak.items()},
                                "seconds": time.perf_counter() - started}
    torch.save(results, f"{cfg['out']}.{trainer.global_rank}")


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
