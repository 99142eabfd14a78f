"""Ported-Lightning patterns under ddp and fsdp on 2 real CPU processes over gloo (issue 13, issue 11).

One launch runs them all (tests/distributed/scripts/porting_train.py). Each reference is a plain torch loop in
this process over the global batch (what one process would compute), never a Trainer run.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

import torchfleet as tf
from tests.distributed import sharded_helpers
from tests.distributed.scripts.porting_train import (
    GAN,
    GLOBAL_BATCH,
    BatchNormModel,
    Regressor,
    gan_data,
    regression_data,
)
from tests.distributed.trainer_order import trainer_batches
from torchfleet.checkpoint.deepspeed import deepspeed_available

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "porting_train.py")
ATOL = 1e-5
DEEPSPEED = ["deepspeed", "deepspeed_stage_3"] if deepspeed_available() else []
needs_deepspeed = pytest.mark.skipif(not DEEPSPEED, reason="deepspeed is not installed (the 'deepspeed' extra)")
try:
    import torchmetrics  # noqa: F401
    METRICS = True
except ImportError:
    METRICS = False


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    out = str(tmp_path_factory.mktemp("porting") / "out.pt")
    cfg = {"out": out, "devices": 2, "runs": [
        {"name": "fsdp_fit_test", "kind": "fit_test", "strategy": "fsdp"},
        {"name": "ddp_fit_test", "kind": "fit_test", "strategy": "ddp"},
        {"name": "gan_ddp", "kind": "gan", "strategy": "ddp"},
        {"name": "gan_ddp_unused", "kind": "gan", "strategy": "ddp", "ddp": {"find_unused_parameters": True}},
        {"name": "gan_fsdp", "kind": "gan", "strategy": "fsdp"},
        {"name": "bn_ddp", "kind": "sync_bn", "strategy": "ddp", "sync": True},
        {"name": "bn_ddp_off", "kind": "sync_bn", "strategy": "ddp", "sync": False},
        {"name": "bn_fsdp", "kind": "sync_bn", "strategy": "fsdp", "sync": True},
        {"name": "configured_fsdp", "kind": "configure_model", "strategy": "fsdp"},
    ] + [{"name": f"{s}_fit_test", "kind": "fit_test", "strategy": s} for s in DEEPSPEED]
      + [{"name": f"metric_{s}", "kind": "metric", "strategy": s} for s in (["ddp", "fsdp"] if METRICS else [])]}
    proc = sharded_helpers.run_script(SCRIPT, cfg, timeout=300)
    return sharded_helpers.load_results(cfg, proc)


def batches(data, size: int = GLOBAL_BATCH, epoch: int = 0):
    """Each step's global batch as 2 Trainer ranks read it: shuffled (seed 0), as Lightning's Trainer does."""
    return [tuple(t[idx] for t in data.tensors) for idx in trainer_batches(len(data), 2, size // 2, epoch=epoch)]


def train_regressor(model: nn.Module, epochs: int) -> None:
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    for epoch in range(epochs):
        for x, y in batches(regression_data(), epoch=epoch):
            nn.functional.mse_loss(model.net(x), y).backward()
            opt.step()
            opt.zero_grad()


def eval_reference(model: nn.Module) -> tuple[float, torch.Tensor]:
    x, y = regression_data(16, seed=1).tensors
    with torch.no_grad():
        preds = model.net(x)
    return nn.functional.mse_loss(preds, y).item(), preds


@pytest.mark.parametrize("strategy", ["fsdp", "ddp", pytest.param("deepspeed", marks=needs_deepspeed),
                                      pytest.param("deepspeed_stage_3", marks=needs_deepspeed)])
def test_fit_then_test_validate_predict_with_the_same_module(runs, strategy):
    """Evaluation after fit sees the trained weights: the module, made whole when fit ended, is sharded again."""
    result = runs[f"{strategy}_fit_test"]
    model = Regressor()
    train_regressor(model, epochs=2)
    # after fit the module holds the whole trained weights, under every strategy (ZeRO-3 too)
    sharded_helpers.assert_close(result["weights"], model.state_dict(), ATOL)
    # evaluation changed nothing and saw the trained weights
    sharded_helpers.assert_close(result["weights_after_eval"], result["weights"], 0.0)
    loss, preds = eval_reference(model)
    assert result["test_loss"] == pytest.approx(loss, rel=1e-5)
    assert result["val_loss"] == pytest.approx(loss, rel=1e-5)
    got = result["preds"].flatten().sort().values
    torch.testing.assert_close(got, preds.flatten().sort().values, rtol=0, atol=ATOL)
    assert result["global_step"] == 8
    # during fit trainer.model is the strategy's model: the DDP wrapper under ddp, the engine under DeepSpeed, the
    # module itself under fsdp (fully_shard's FSDPRegressor class); the stage's teardown releases them (as
    # Lightning's), so after fit it is the plain Module
    wrapper = {"ddp": "DistributedDataParallel", "fsdp": "FSDPRegressor"}.get(strategy, "DeepSpeedEngine")
    assert result["model_type"] == {"during_fit": wrapper, "after_fit": "Regressor"}


@pytest.mark.parametrize("name", ["gan_ddp", "gan_ddp_unused", "gan_fsdp"])
def test_gan_with_two_manual_backwards_per_step_matches_one_process(runs, name):
    """Under fsdp manual optimisation shards each child as its own unit: a backward inside training_step reduces
    the gradients (with only the root sharded, the shards never changed, silently)."""
    model = GAN()
    gen, disc = model.generator, model.discriminator
    opt_g = torch.optim.SGD(gen.parameters(), lr=0.2)
    opt_d = torch.optim.SGD(disc.parameters(), lr=0.2)
    bce = nn.functional.binary_cross_entropy_with_logits
    for epoch in range(2):
        for real, z in batches(gan_data(), epoch=epoch):
            ones, zeros = torch.ones(len(z), 1), torch.zeros(len(z), 1)
            opt_g.zero_grad()
            bce(disc(gen(z)), ones).backward()
            opt_g.step()
            opt_d.zero_grad()
            fake = gen(z).detach()
            ((bce(disc(real), ones) + bce(disc(fake), zeros)) / 2).backward()
            opt_d.step()
    result = runs[name]
    sharded_helpers.assert_close(result["weights"], model.state_dict(), ATOL)
    assert result["global_step"] == 16  # 2 epochs x 4 batches x 2 optimizers


def batchnorm_reference() -> tuple[nn.Module, nn.BatchNorm1d]:
    """One optimizer step of the BatchNorm model on the first global batch, in one process."""
    model = BatchNormModel()
    x, y = batches(regression_data())[0]
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    nn.functional.mse_loss(model.net(x), y).backward()
    opt.step()
    return model, model.net[1]


@pytest.mark.parametrize("name", ["bn_ddp", "bn_fsdp"])
def test_sync_batchnorm_uses_the_whole_batch_statistics(runs, name):
    model, bn = batchnorm_reference()
    result = runs[name]
    assert result["bn_type"] == "CPUSyncBatchNorm"  # in training (torch's SyncBatchNorm refuses the CPU)
    assert result["bn_type_after_fit"] == "BatchNorm1d"  # the strategy's teardown gave the user's layer back
    torch.testing.assert_close(result["running_mean"], bn.running_mean, rtol=0, atol=1e-6)
    torch.testing.assert_close(result["running_var"], bn.running_var, rtol=0, atol=1e-6)
    torch.testing.assert_close(result["gathered_mean"][1], result["gathered_mean"][0], rtol=0, atol=0)
    # gradients flow through the synchronised statistics: the step is the whole batch's step
    sharded_helpers.assert_close(result["weights"], model.state_dict(), ATOL)


def test_without_sync_batchnorm_each_rank_keeps_its_own_statistics(runs):
    _, bn = batchnorm_reference()
    gathered = runs["bn_ddp_off"]["gathered_mean"]
    assert runs["bn_ddp_off"]["bn_type"] == "BatchNorm1d"
    assert (gathered[0] - gathered[1]).abs().max() > 1e-3
    assert (gathered[0] - bn.running_mean).abs().max() > 1e-3


def test_configure_model_under_fsdp_creates_the_layers_once_on_meta_then_shards(runs):
    result = runs["configured_fsdp"]
    assert result["created_on"] == ["meta"]
    assert result["calls_after_fit"] == 1 and result["calls"] == 1  # the later trainer.test did not call it
    assert result["sharded"] and result["local_numel"] == 16 * 6 // 2
    start = result["start_weights"]
    assert all(torch.isfinite(w).all() and w.abs().sum() > 0 for w in start.values())
    # from the weights the shards were initialised with, training is the one-process training
    model = Regressor()
    model.load_state_dict(start)
    train_regressor(model, epochs=1)
    sharded_helpers.assert_close(result["weights"], model.state_dict(), ATOL)
    assert result["test_loss"] == pytest.approx(eval_reference(model)[0], rel=1e-5)


def test_configure_model_under_ddp_spawn_fills_the_launching_process_model():
    from tests.distributed.scripts.porting_train import ConfiguredModel, trainer_for

    tf.seed_everything(0)  # the seed of the ranks' shuffle (the reference's), whatever an earlier test set
    torch.manual_seed(0)
    model = ConfiguredModel()
    trainer = trainer_for("ddp_spawn", 2, max_epochs=1)
    trainer.fit(model, torch.utils.data.DataLoader(regression_data(), batch_size=GLOBAL_BATCH // 2))
    # the ranks created the layers; this process made its own (once) and holds rank 0's trained weights
    assert model.configure_calls == 1 and model.created_on == ["cpu"]
    assert trainer.global_step == 4
    reference = Regressor()
    train_regressor(reference, epochs=1)
    sharded_helpers.assert_close(full(model), reference.state_dict(), ATOL)


def full(model: nn.Module) -> dict:
    return {k: v.detach().float() for k, v in model.state_dict().items()}


@pytest.mark.skipif(not METRICS, reason="torchmetrics is not installed (a test extra)")
@pytest.mark.parametrize("strategy", ["ddp", "fsdp"])
def test_a_logged_metric_object_computes_over_every_ranks_samples(runs, strategy):
    from tests.distributed.scripts.porting_train import MetricClassifier, classes

    result = runs[f"metric_{strategy}"]
    model = MetricClassifier()
    x, y = classes().tensors
    with torch.no_grad():
        want = (model.net(x).argmax(1) == y).float().mean().item()
    # 42 samples: 21 a rank, batches of 4, 4, 4, 4, 4, 1 (a mean of the ranks' or the batches' values differs)
    assert result["val_acc"] == pytest.approx(want, abs=1e-6)
