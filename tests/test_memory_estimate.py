"""torchfleet.estimate_memory against real runs (issue 23 items 1-2): the single-device prediction against torch's
MemTracker inside a Trainer run (tests/memory_runs.py), the strategies' division of the model states, and a
2-billion-parameter model estimated at fsdp x 64 without allocating it."""

from __future__ import annotations

import resource
import time

import pytest
import torch
from torch import nn

import torchfleet
from tests.memory_runs import Block, Blocks, TPBlocks, measure
from torchfleet import MemoryEstimate, Trainer, estimate_memory
from torchfleet.strategies import FSDPStrategy, ModelParallelStrategy

PEAK_TOLERANCE, STATE_TOLERANCE = 0.15, 0.05
#: width 128, 4 blocks, 1024 rows: the activations (~24 MiB) outweigh the model states (~8 MiB), so checkpointing
#: changes the peak
WIDTH, BLOCKS, ROWS = 128, 4, 1024


def _batch() -> torch.Tensor:
    return torch.randn(ROWS, WIDTH, generator=torch.Generator().manual_seed(0))


@pytest.mark.parametrize(("precision", "optimizer", "checkpointing"), [
    ("32-true", "adamw", False), ("32-true", "sgd", True), ("bf16-true", "adam", False), ("bf16-true", "sgd", True),
    ("bf16-mixed", "adamw", True), ("bf16-mixed", "sgd", False), ("16-mixed", "adamw", False), ("16-mixed", "sgd", True),
])
def test_single_device_prediction_matches_a_measured_run(precision, optimizer, checkpointing):
    def model():
        return Blocks(WIDTH, BLOCKS, optimizer, checkpointing)

    predicted = estimate_memory(model(), _batch(), precision=precision)
    measured = measure(model(), _batch(), precision)
    assert abs(predicted.peak - measured["peak"]) <= PEAK_TOLERANCE * measured["peak"], (predicted, measured)
    assert abs(predicted.parameters - measured["parameters"]) <= STATE_TOLERANCE * measured["parameters"]
    assert abs(predicted.optimizer_states - measured["optimizer_states"]) <= STATE_TOLERANCE * measured["optimizer_states"]


def test_checkpointing_lowers_the_predicted_activations_as_it_lowers_the_measured_peak():
    plain, recomputed = (estimate_memory(Blocks(WIDTH, BLOCKS, "sgd", c), _batch()) for c in (False, True))
    measured = [measure(Blocks(WIDTH, BLOCKS, "sgd", c), _batch())["peak"] for c in (False, True)]
    assert measured[1] < 0.8 * measured[0]  # the case is one where checkpointing matters
    assert recomputed.activations < 0.8 * plain.activations
    assert plain.parameters == recomputed.parameters


def test_the_strategies_divide_the_model_states():
    single = estimate_memory(Blocks(WIDTH, BLOCKS), _batch())
    ddp = estimate_memory(Blocks(WIDTH, BLOCKS), _batch(), strategy="ddp", devices=4)
    fsdp = estimate_memory(Blocks(WIDTH, BLOCKS), _batch(), strategy=FSDPStrategy(auto_wrap_policy={Block}), devices=4)
    params = sum(p.numel() * 4 for p in Blocks(WIDTH, BLOCKS).parameters())
    assert single.parameters == params and single.gradients == params and single.optimizer_states >= 2 * params
    # ddp: everything on every rank, plus the reducer's bucket copy of the gradients
    assert (ddp.parameters, ddp.optimizer_states) == (single.parameters, single.optimizer_states)
    assert ddp.buffers == single.gradients and ddp.peak >= single.peak + single.gradients
    # fsdp x 4: a quarter of the model states, plus whole blocks while they run
    assert fsdp.parameters == params // 4 and fsdp.gradients == params // 4
    assert abs(fsdp.optimizer_states - single.optimizer_states / 4) <= 64
    block = sum(p.numel() * 4 for p in Block(WIDTH).parameters())
    assert fsdp.phases["forward"]["gathered"] == 2 * block  # the root holds no parameters of its own
    assert fsdp.peak < single.peak
    text = str(fsdp)
    assert "peak" in text and "optimizer_states" in text and "4 rank(s)" in text


def test_trainer_estimate_memory_uses_the_trainers_settings():
    trainer = Trainer(accelerator="cpu", devices=2, strategy="ddp", precision="bf16-true", logger=False,
                      enable_progress_bar=False, enable_model_summary=False, enable_checkpointing=False)
    loader = torch.utils.data.DataLoader([_batch()] * 2, batch_size=None)
    by_trainer = trainer.estimate_memory(Blocks(WIDTH, BLOCKS), loader)
    direct = estimate_memory(Blocks(WIDTH, BLOCKS), _batch(), strategy="ddp", devices=2, precision="bf16-true")
    assert isinstance(by_trainer, MemoryEstimate) and torchfleet.estimate_memory is estimate_memory
    assert (by_trainer.peak, by_trainer.parameters, by_trainer.world_size) == (direct.peak, direct.parameters, 2)
    assert by_trainer.parameters == sum(p.numel() * 2 for p in Blocks(WIDTH, BLOCKS).parameters())


class _Stack(torchfleet.Module):
    def __init__(self, width: int, layers: int):
        super().__init__()
        self.layers = nn.Sequential(*(nn.Linear(width, width) for _ in range(layers)))

    def training_step(self, batch, batch_idx):
        return self.layers(batch).float().pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters())


def _rss() -> int:
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS"))


def test_a_2b_parameter_model_estimates_at_fsdp_x_64_without_allocating_it():
    with torch.device("meta"):
        model = _Stack(7168, 40)  # 40 x (7168^2 + 7168) = 2.06e9 parameters, 8.2 GB in fp32
    count = sum(p.numel() for p in model.parameters())
    assert count > 2e9
    before, start = _rss(), time.perf_counter()
    estimate = estimate_memory(model, torch.empty(8, 7168), strategy=FSDPStrategy(auto_wrap_policy={nn.Linear}),
                               devices=8, num_nodes=8, precision="bf16-mixed")
    took, grew = time.perf_counter() - start, _rss() - before
    assert took < 60 and grew < 512 * 2**20, (took, grew)
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 < 4 * 2**30
    assert estimate.world_size == 64
    assert abs(estimate.parameters - count * 4 / 64) <= 64 and abs(estimate.optimizer_states - count * 8 / 64) <= 1024
    layer = 7168 * 7168 + 7168
    assert estimate.phases["forward"]["gathered"] == 2 * layer * 2  # two layers gathered in bf16


def test_offload_and_deepspeed_config_models():
    from torchfleet.strategies._deepspeed_config import memory_model

    stage2 = memory_model({"zero_optimization": {"stage": 2, "reduce_bucket_size": 200_000_000,
                                                 "allgather_bucket_size": 200_000_000}}, 8)
    assert (stage2.param_shards, stage2.grad_shards, stage2.state_shards) == (1, 8, 8)
    # one reduce bucket; overlap_comm double-buffers it (measured, tests/distributed); the all-gather bucket is a limit
    assert stage2.buffer_elements == 200_000_000 and stage2.master_copy and not stage2.offload
    assert stage2.gradients_held_in_backward and stage2.gathered_elements == 0
    overlapped = memory_model({"zero_optimization": {"stage": 2, "reduce_bucket_size": 1000, "overlap_comm": True}}, 8)
    assert overlapped.buffer_elements == 2000
    stage3 = memory_model({"zero_optimization": {"stage": 3, "offload_optimizer": {"device": "cpu"},
                                                 "offload_param": {"device": "cpu"}}}, 4)
    assert stage3.param_shards == 4 and stage3.offload == {"params", "grads", "states"}
    # ZeRO-3 holds whole: parameters under the persistence threshold, and the others up to max live parameters
    module = Blocks(WIDTH, BLOCKS)
    small = sum(p.numel() for p in module.parameters() if p.numel() < 1000)
    live = memory_model({"zero_optimization": {"stage": 3, "stage3_param_persistence_threshold": 1000,
                                               "stage3_max_live_parameters": 5000}}, 4, module=module)
    assert live.gathered_elements == small + 5000 and live.buffer_elements == 500_000_000
    offloaded = estimate_memory(Blocks(WIDTH, BLOCKS), _batch(), strategy=FSDPStrategy(cpu_offload=True), devices=2)
    assert offloaded.parameters == offloaded.optimizer_states == offloaded.gradients == 0 and offloaded.offloaded > 0
    # per rank: this rank's half of params 4 + grads 4 + AdamW 8 bytes per parameter (bench/memory.py measured the same)
    count = sum(p.numel() for p in Blocks(WIDTH, BLOCKS).parameters())
    assert abs(offloaded.offloaded - count * 16 / 2) <= 64


def test_model_parallel_divides_what_configure_model_splits():
    # 2 x 2 mesh: up (column-wise) and down (row-wise) weights and up's bias split over tensor parallel, down's bias
    # whole; every block and the root fully_shard-ed over data parallel (2)
    estimate = estimate_memory(TPBlocks(WIDTH, BLOCKS), _batch(), strategy=ModelParallelStrategy(
        data_parallel_size=2, tensor_parallel_size=2), devices=4)
    hidden = 4 * WIDTH
    per_block = (WIDTH * hidden // 2 + hidden // 2) + (hidden * WIDTH // 2 + WIDTH)
    assert estimate.parameters == BLOCKS * per_block * 4 // 2 == estimate.gradients
    assert abs(estimate.optimizer_states - 2 * estimate.parameters) <= 64
    assert "traced on a fake 2 x 2 mesh" in estimate.note
    assert estimate.phases["forward"]["gathered"] == 2 * per_block * 4  # two blocks' tensor-parallel shards whole
    # tensor parallel narrows the hidden activations: less than one device holds
    assert estimate.activations < 0.8 * estimate_memory(Blocks(WIDTH, BLOCKS), _batch()).activations


class _NeedsMore(TPBlocks):
    def configure_model(self):
        raise RuntimeError("needs the real run")


def test_model_parallel_without_a_traceable_configure_model_splits_the_linear_layers():
    estimate = estimate_memory(_NeedsMore(WIDTH, BLOCKS), _batch(), strategy=ModelParallelStrategy(
        tensor_parallel_size=2), devices=2)
    params = sum(p.numel() * 4 for p in Blocks(WIDTH, BLOCKS).parameters())  # every parameter is a Linear's
    assert estimate.parameters == params // 2 and "could not run" in estimate.note


@pytest.mark.parametrize("precision", ["bf16-mixed", "16-mixed"])
def test_deepspeed_in_half_precision_holds_half_parameters_and_an_fp32_master_partition(precision):
    from torchfleet.strategies import DeepSpeedStrategy

    config = {"zero_optimization": {"stage": 2, "reduce_bucket_size": 1000, "allgather_bucket_size": 1000}}
    estimate = estimate_memory(Blocks(WIDTH, BLOCKS), _batch(), strategy=DeepSpeedStrategy(config=config), devices=2,
                               precision=precision)
    count = sum(p.numel() for p in Blocks(WIDTH, BLOCKS).parameters())
    # by hand: 2-byte parameters whole, 2-byte gradients halved, AdamW's 8 bytes and the 4-byte master halved
    assert estimate.parameters == 2 * count and estimate.gradients == count
    assert abs(estimate.optimizer_states - (8 + 4) * count // 2) <= 64
    assert estimate.buffers == 1000 * 2  # the reduce bucket's elements, 2 bytes each (no overlap_comm: one buffer)
