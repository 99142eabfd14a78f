"""The module after a stage under fsdp and DeepSpeed: whole on every rank, equal to the final checkpoint (gloo, 2 ranks).

One launch serves the tests (tests/distributed/scripts/sharded_after_fit.py): its ranks run in turn ddp with
synchronised BatchNorm, fsdp, and DeepSpeed stages 2 and 3 (where DeepSpeed is installed). Each rank calls the
model after fit, alone and together; the expected outputs come from the checkpoint written after fit,
consolidated in this process into the plain model. A second launch has a ``@rank_zero_only`` callback call the
sharded model during fit, which must end in a desync report; a third, under torchrun, has a fit raise. The
ddp_spawn test trains from this process and checks the model it holds.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import torch
from torch.utils.data import DataLoader

import torchfleet as tf
from tests.distributed import sharded_helpers
from tests.distributed.scripts import sharded_after_fit as script
from tests.distributed.scripts.sharded_after_fit import (
    BATCH,
    REFIT_STEPS,
    BNNet,
    DeepSpeedNet,
    FSDPNet,
    inputs,
)
from tests.distributed.test_faults import _processes_mentioning
from torchfleet.checkpoint.consolidate import consolidate
from torchfleet.checkpoint.deepspeed import deepspeed_available

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "sharded_after_fit.py")
needs_deepspeed = pytest.mark.skipif(not deepspeed_available(), reason="deepspeed is not installed (the 'deepspeed' extra)")
#: the ranks run one thread and this process several: the same weights may round differently
ATOL = 1e-6


def launch(tmp_path, runs: list[dict], timeout: float = 400, torchrun: bool = False) -> list[dict]:
    """Run ``runs`` in one 2-rank launch (the script launcher, or torchrun); every rank's results."""
    cfg = {"out": str(tmp_path / "result"), "ckpt_dir": str(tmp_path), "runs": runs}
    if torchrun:
        from torchfleet.environments import find_free_port

        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
                   f"--master-port={find_free_port()}", SCRIPT, json.dumps(cfg)]
        proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                              env=sharded_helpers.child_env(), cwd=sharded_helpers.ROOT)
    else:
        proc = sharded_helpers.run_script(SCRIPT, cfg, timeout)
    assert proc.returncode == 0, proc.stderr[-6000:]
    return [torch.load(f"{cfg['out']}.{rank}.pt", weights_only=False) for rank in (0, 1)]


def plain_from(ckpt: str, net: type, tmp_path) -> torch.nn.Module:
    """The plain model holding the weights of ``ckpt`` (any layout), consolidated in this process."""
    out = tmp_path / f"{os.path.basename(ckpt)}.pt"
    consolidate(ckpt, out)
    model = net()
    model.load_state_dict(torch.load(out, weights_only=True)["state_dict"])
    return model.eval()


def close(got: torch.Tensor, want: torch.Tensor, atol: float = ATOL) -> None:
    assert got.shape == want.shape
    diff = (got - want).abs().max().item()
    assert diff <= atol, f"max |diff| {diff:.3g} > {atol}"


def mse_on_test_data(model: torch.nn.Module) -> float:
    x, y = script.fsdp_train.make_data()[:16]
    with torch.no_grad():
        return torch.nn.functional.mse_loss(model(x), y).item()


#: the runs of the shared launch, by family
FAMILY_RUNS = {
    "ddp": [{"name": "ddp", "case": "ddp_sync_batchnorm", "strategy": "ddp"}],
    "fsdp": [
        {"name": "stages", "case": "stages", "strategy": "fsdp", "checkpointing": True},
        {"name": "keep", "case": "keep_sharded", "strategy": "fsdp", "keep_sharded": True},
        {"name": "fleet", "case": "fleet", "strategy": "fsdp"},
        {"name": "fleet_teardown", "case": "fleet", "strategy": "fsdp", "teardown": True},
    ],
    "deepspeed": [
        {"name": "stage_3", "case": "stages", "strategy": "deepspeed_stage_3"},
        # in bf16: the module is given back in float32, with the optimizer's float32 master weights
        {"name": "stage_2", "case": "stages", "strategy": "deepspeed_stage_2", "precision": "bf16-mixed"},
        {"name": "keep_3", "case": "keep_sharded", "strategy": "deepspeed_stage_3", "keep_sharded": True},
        {"name": "fleet_3", "case": "fleet", "strategy": "deepspeed_stage_3", "teardown": True},
    ],
}


@pytest.fixture(scope="module")
def after_fit_runs(tmp_path_factory):
    """Every family's runs in one 2-rank launch (DeepSpeed's where it is installed): every rank's results, the folder."""
    tmp = tmp_path_factory.mktemp("after_fit")
    families = ["ddp", "fsdp", *(["deepspeed"] if deepspeed_available() else [])]
    ranks = launch(tmp, [run for family in families for run in FAMILY_RUNS[family]], timeout=600)
    return ranks, tmp


@pytest.fixture(scope="module")
def fsdp_runs(after_fit_runs):
    return after_fit_runs


@pytest.fixture(scope="module")
def deepspeed_runs(after_fit_runs):
    if not deepspeed_available():
        pytest.skip("deepspeed is not installed (the 'deepspeed' extra)")
    return after_fit_runs


def test_after_fit_under_ddp_the_module_is_unwrapped_with_its_own_batchnorm(after_fit_runs):
    """teardown at the end of fit: the DDP wrapper gone, SyncBatchNorm back to BatchNorm1d, the trained weights and
    running statistics of the final checkpoint on every rank (and on rank 0 alone)."""
    ranks, tmp = after_fit_runs
    final = plain_from(ranks[0]["ddp"]["fit_ckpt"], BNNet, tmp)
    with torch.no_grad():
        want = final(inputs())
    for rank, results in enumerate(ranks):
        result = results["ddp"]
        assert result["during"] == {"wrapped": True, "norm": "CPUSyncBatchNorm"}, f"rank {rank}"
        assert result["norm"] == "BatchNorm1d" and result["unwrapped"] and result["leftovers"] == [], f"rank {rank}"
        close(result["forward"], want)
    close(ranks[0]["ddp"]["rank_zero_forward"], want)
    assert final.norm.num_batches_tracked.item() > 0  # the statistics were trained (and synchronised)


def runs_for(request, family: str):
    return request.getfixturevalue("fsdp_runs" if family == "fsdp" else "deepspeed_runs")


CASES = [pytest.param("fsdp", "stages", FSDPNet, id="fsdp"),
         pytest.param("deepspeed", "stage_2", DeepSpeedNet, id="deepspeed_stage_2_bf16", marks=needs_deepspeed),
         pytest.param("deepspeed", "stage_3", DeepSpeedNet, id="deepspeed_stage_3", marks=needs_deepspeed)]


@pytest.mark.parametrize(("family", "name", "net"), CASES)
def test_after_fit_every_rank_holds_the_whole_model_of_the_final_checkpoint(request, family, name, net):
    ranks, tmp = runs_for(request, family)
    final = plain_from(ranks[0][name]["fit_ckpt"], net, tmp)
    shapes = {n: tuple(p.shape) for n, p in net().named_parameters()}
    x = inputs()
    with torch.no_grad():
        want, want_head = final(x), final.head(x)
    for rank, results in enumerate(ranks):
        result = results[name]
        assert {n: p["shape"] for n, p in result["params"].items()} == shapes, f"rank {rank}"
        assert all(p["plain"] and p["dtype"] == "torch.float32" for p in result["params"].values()), f"rank {rank}"
        assert result["leftovers"] == [], f"rank {rank}"
        close(result["forward"], want)
        close(result["head"], want_head)  # a layer of the root unit, called on its own
    close(ranks[0][name]["rank_zero_forward"], want)  # rank 0 alone, the other rank never joined
    assert ranks[0][name]["rank_zero_grads"]


@pytest.mark.parametrize(("family", "name", "net"), CASES)
def test_fit_then_test_then_fit_again_on_the_same_module(request, family, name, net):
    ranks, tmp = runs_for(request, family)
    bf16 = name == "stage_2"  # trained and evaluated in bfloat16: compared with float32 at bfloat16's precision
    first = plain_from(ranks[0][name]["fit_ckpt"], net, tmp)
    second = plain_from(ranks[0][name]["refit_ckpt"], net, tmp)
    # the reference: one process continues from the first fit's weights with the global batch
    tf.seed_everything(0)
    reference = net()
    reference.load_state_dict(first.state_dict())
    trainer = tf.Trainer(accelerator="cpu", devices=1, max_steps=REFIT_STEPS, logger=False, enable_checkpointing=False,
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(reference, DataLoader(script.fsdp_train.make_data(), batch_size=2 * BATCH, shuffle=False))
    x = inputs()
    with torch.no_grad():
        want_first, want_second, want_reference = first(x), second(x), reference(x)
    close(want_second, want_reference, atol=0.05 if bf16 else 1e-5)
    for results in ranks:
        result = results[name]
        assert result["test_loss"] == pytest.approx(mse_on_test_data(first), rel=0.05 if bf16 else 1e-5)
        # sharded (or cast to bfloat16) for test, then given back: the same weights
        close(result["forward_after_test"], want_first)
        assert result["refit_steps"] == REFIT_STEPS
        close(result["forward_after_refit"], want_second)
    assert (want_second - want_first).abs().max() > 1e-3  # the second fit trained


@pytest.mark.parametrize(("family", "name", "net"), [CASES[0], CASES[2]])
def test_the_checkpoint_saved_after_fit_resumes_with_its_optimizer_state(request, family, name, net):
    """Written after the module was made whole: the optimizer state (fsdp's shards, the kept engine's) is in it."""
    ranks, _ = runs_for(request, family)

    def two_epochs(ckpt_path: str | None) -> torch.nn.Module:
        tf.seed_everything(0)
        model = net()
        trainer = tf.Trainer(accelerator="cpu", devices=1, max_epochs=2, logger=False, enable_checkpointing=False,
                             enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
        trainer.fit(model, DataLoader(script.fsdp_train.make_data(), batch_size=2 * BATCH, shuffle=False),
                    ckpt_path=ckpt_path)
        return model

    resumed, uninterrupted = two_epochs(ranks[0][name]["fit_ckpt"]), two_epochs(None)
    assert resumed.batches_run == uninterrupted.batches_run // 2  # only the second epoch ran
    sharded_helpers.assert_close(resumed.state_dict(), uninterrupted.state_dict(), atol=1e-5)


@pytest.mark.parametrize(("family", "name", "net"), [pytest.param("fsdp", "keep", FSDPNet, id="fsdp"), pytest.param(
    "deepspeed", "keep_3", DeepSpeedNet, id="deepspeed_stage_3", marks=needs_deepspeed)])
def test_keep_sharded_leaves_the_module_sharded_and_test_reuses_it(request, family, name, net):
    ranks, tmp = runs_for(request, family)
    final = plain_from(ranks[0][name]["fit_ckpt"], net, tmp)
    with torch.no_grad():
        want = final(inputs())
    for results in ranks:
        result = results[name]
        assert not any(p["plain"] for p in result["params"].values())
        assert not any(p["plain"] for p in result["params_after_test"].values())
        close(result["forward"], want)  # called on every rank together
        assert result["test_loss"] == pytest.approx(mse_on_test_data(final), rel=1e-5)
        if family == "deepspeed":
            assert result["engine_reused"]


def test_a_fit_that_raises_leaves_the_module_sharded_and_a_later_stage_uses_it(tmp_path):
    # under torchrun, where the exception reaches the script in each rank (torchfleet's launchers stop the run)
    ranks = launch(tmp_path, [{"name": "raises", "case": "raises", "strategy": "fsdp"}], torchrun=True)
    for results in ranks:
        result = results["raises"]
        assert result["error"] == "ValueError: stop at step 2"
        # nothing was gathered at the failed stage's end: the shards are as the failure left them
        assert not any(p["plain"] for p in result["params"].values())
        assert result["test_loss"] > 0 and all(p["plain"] for p in result["params_after_test"].values())


@pytest.mark.parametrize(("family", "name"), [
    ("fsdp", "fleet"), ("fsdp", "fleet_teardown"),
    pytest.param("deepspeed", "fleet_3", id="deepspeed_stage_3-fleet_teardown", marks=needs_deepspeed)])
def test_a_fleet_module_made_whole_at_the_end_of_the_loop_answers_on_one_rank(request, family, name):
    """Fleet has no stage end: ``fleet.strategy.unshard_module(model)`` or ``fleet.strategy.teardown()`` does it."""
    ranks, _ = runs_for(request, family)
    for results in ranks:
        result = results[name]
        assert not any(p["plain"] for p in result["params_before"].values())
        assert all(p["plain"] for p in result["params"].values())
        close(result["forward"], result["forward_while_sharded"])
    close(ranks[0][name]["rank_zero_forward"], ranks[0][name]["forward"])


def _line(marker: str) -> int:
    with open(SCRIPT) as f:
        return next(n for n, text in enumerate(f, 1) if f"# {marker}" in text)


def test_a_forward_on_rank_zero_only_during_fit_is_a_desync_naming_the_rank_hook_and_line(tmp_path):
    out = str(tmp_path / "never-written")
    start = time.monotonic()
    proc = sharded_helpers.run_script(SCRIPT, {"out": out, "ckpt_dir": str(tmp_path), "runs": [
        {"name": "sample", "case": "rank_zero_forward", "strategy": "fsdp"}]}, timeout=120)
    elapsed = time.monotonic() - start
    assert proc.returncode == 76, proc.stderr[-4000:]  # the documented exit code of a hang or desync
    # one report, whichever rank's watchdog noticed first: not repeated, not wrapped in a traceback
    assert proc.stderr.count("Desync:") == 1 and "Traceback" not in proc.stderr, proc.stderr[-6000:]
    desync = next((line for line in proc.stderr.splitlines() if "Desync:" in line), None)
    assert desync is not None, proc.stderr[-4000:]
    site = f"{SCRIPT}:{_line('RANK-ZERO-FORWARD')} in on_train_batch_end"
    assert f"rank 0 all_gather(fsdp forward of FSDPNet) at {site}" in desync
    assert "training epoch 0 batch 1" in desync  # the step after which the callback ran
    assert elapsed < 90, f"took {elapsed:.0f}s"
    assert _processes_mentioning(out) == []  # every process ended
    assert not os.path.exists(f"{out}.0.pt")


@pytest.mark.parametrize("keep_sharded", [False, True])
def test_under_ddp_spawn_the_callers_module_is_the_whole_trained_model(tmp_path, keep_sharded):
    from torch import nn

    from torchfleet.callbacks import ModelCheckpoint
    from torchfleet.strategies import FSDPStrategy

    tf.seed_everything(0)
    model = FSDPNet()
    checkpoint = ModelCheckpoint(dirpath=str(tmp_path), save_last=True, save_top_k=0)
    # keep_sharded too: the spawned ranks (and their shards) end with fit, the caller's process takes rank 0's weights
    strategy = FSDPStrategy(auto_wrap_policy={nn.TransformerEncoderLayer}, start_method="spawn",
                            keep_sharded=keep_sharded)
    trainer = tf.Trainer(strategy=strategy,
                         accelerator="cpu", devices=2, max_epochs=1, logger=False, callbacks=[checkpoint],
                         enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, DataLoader(script.fsdp_train.make_data(), batch_size=BATCH, shuffle=False))
    final = plain_from(str(tmp_path / "last.ckpt"), FSDPNet, tmp_path)
    x = inputs()
    with torch.no_grad():
        close(model(x), final(x))
        close(model.head(x), final.head(x))
    assert trainer.global_step == 4
