"""Every rank runs the same loop shape, whatever its shard: no deadlock, and metrics equal to one process's.

Real ranks under ddp_spawn over gloo. Before, a 1-sample validation set (or a limit_val_batches that left a
rank no batch) deadlocked: each rank decided "validate this epoch" from its own shard, and the rank with
batches waited in validation's reductions for one that had gone on training. Uneven training data waited in
a gradient all-reduce nobody joined. Each run has a hang_timeout well under the test's timeout, so a
regression fails with the watchdog's report instead of stalling the suite.
"""

from __future__ import annotations

import os
import time

import pytest
import torch
from torch.utils.data import DataLoader

import torchfleet as tf
from tests.distributed.scripts.loop_shape_model import (
    Evaluated,
    Gathering,
    LocalMetric,
    RankSized,
    RankStream,
)
from tests.distributed.sharded_helpers import ROOT, load_results, run_script
from tests.helpers import loader, quiet
from torchfleet.callbacks import EarlyStopping, ModelCheckpoint
from torchfleet.checkpoint.deepspeed import deepspeed_available
from torchfleet.launchers import ProcessFailedError

pytestmark = [pytest.mark.distributed, pytest.mark.slow, pytest.mark.timeout(300)]

HANG_TIMEOUT = 30


def _spawned(**kw) -> tf.Trainer:
    return tf.Trainer(**quiet(strategy="ddp_spawn", devices=2, hang_timeout=HANG_TIMEOUT, **kw))


def _one_process(stage: str, model: tf.Module, data: DataLoader) -> dict[str, float]:
    """The reference: the same stage in this process, on one device."""
    trainer = tf.Trainer(**quiet(devices=1))
    getattr(trainer, stage)(model, data, verbose=False)
    return {k: float(v) for k, v in trainer.callback_metrics.items()}


def _squared_error(model: tf.Module, data: torch.utils.data.TensorDataset, idx: list[int]) -> float:
    x, y = data[idx]
    with torch.no_grad():
        return float(((model(x) - y) ** 2).mean())


def test_one_sample_validation_set_fits_and_logs_the_one_process_value(tmp_path):
    torch.manual_seed(0)
    model = Evaluated()
    best = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", mode="min")
    trainer = _spawned(max_epochs=2, num_sanity_val_steps=2, callbacks=[best, EarlyStopping("val_loss", patience=5)],
                       enable_checkpointing=True)
    # 10 training samples: 5 per rank (the sampler pads nothing here), 2 batches of 4 and 1; 1 validation sample
    trainer.fit(model, loader(10, 4), loader(1, 8))
    assert trainer.state.status == "finished"
    assert trainer.global_step == 4  # 2 batches an epoch on every rank, 2 epochs
    got = {k: float(v) for k, v in trainer.callback_metrics.items() if k.startswith("val_")}
    assert got["val_count"] == 1.0  # the one sample, seen by rank 0 only, and rank 1 joined the reduction
    # the trained weights came back; one process validating them on the same sample gives the same numbers
    ref = _one_process("validate", model, loader(1, 8))
    assert got["val_loss"] == pytest.approx(ref["val_loss"], abs=1e-6)
    assert got["val_mse"] == pytest.approx(ref["val_mse"], abs=1e-6)
    # ModelCheckpoint decided on every rank alike from the one-sample value (the best of the two epochs)
    assert best.best_model_path.endswith(".ckpt") and float(best.best_model_score) <= got["val_loss"] + 1e-6


def test_a_limit_that_leaves_one_rank_no_batch_validates_on_every_rank():
    # 3 samples, batch 1: rank 0 holds samples 0 and 2, rank 1 sample 1; half of each shard is 1 batch and 0
    torch.manual_seed(0)
    model = Evaluated()
    data = loader(3, 1)
    trainer = _spawned(limit_val_batches=0.5)
    trainer.validate(model, data, verbose=False)
    got = {k: float(v) for k, v in trainer.callback_metrics.items()}
    # every rank runs the largest count any rank has: rank 0 its sample 0, rank 1 its sample 1
    assert got["val_count"] == 2.0
    assert got["val_loss"] == pytest.approx(_squared_error(model, data.dataset, [0, 1]), abs=1e-6)
    assert got["val_mse"] == pytest.approx(got["val_loss"], abs=1e-6)


def test_test_and_predict_with_fewer_samples_than_ranks_match_one_process():
    torch.manual_seed(0)
    model = Evaluated()
    data = loader(1, 8)
    trainer = _spawned()
    trainer.test(model, data, verbose=False)
    got = {k: float(v) for k, v in trainer.callback_metrics.items()}
    ref = _one_process("test", model, data)
    assert got["test_count"] == 1.0
    assert got["test_loss"] == pytest.approx(ref["test_loss"], abs=1e-6)
    assert got["test_mse"] == pytest.approx(ref["test_mse"], abs=1e-6)
    predictions = _spawned().predict(model, data)
    with torch.no_grad():
        expected = model(data.dataset.tensors[0])
    assert len(predictions) == 1 and torch.allclose(predictions[0], expected, atol=1e-6)


def test_a_metric_a_rank_cannot_find_stops_every_rank_with_one_explanation():
    trainer = _spawned()
    start = time.monotonic()
    with pytest.raises(ProcessFailedError, match="not an attribute of the Module"):
        trainer.validate(LocalMetric(), loader(1, 8), verbose=False)
    # every rank raised the same error at once: nobody waited for hang_timeout
    assert time.monotonic() - start < HANG_TIMEOUT


def test_training_streams_of_different_lengths_stop_together_and_validate(capfd):
    torch.manual_seed(0)
    model = Evaluated()
    trainer = _spawned(max_epochs=2)
    trainer.fit(model, DataLoader(RankStream(), batch_size=None), loader(1, 8))
    # rank 0's 3 samples end each epoch for both ranks (rank 1 has 5); the epoch-end validation runs
    assert trainer.global_step == 6 and trainer.current_epoch == 2
    assert float(trainer.callback_metrics["val_count"]) == 1.0
    assert "ran out at different batches" in capfd.readouterr().err


def test_training_shards_of_different_sizes_train_the_smallest_count(capfd):
    trainer = _spawned(max_epochs=2, use_distributed_sampler=False)
    # the user shards: 6 samples on rank 0 (3 batches), 4 on rank 1 (2 batches)
    trainer.fit(Evaluated(), DataLoader(RankSized(), batch_size=2))
    assert trainer.global_step == 4
    assert "different numbers of batches per epoch (rank 0: 3, rank 1: 2)" in capfd.readouterr().err


def test_a_collective_in_validation_step_on_uneven_shards_is_reported_as_a_control_flow_divergence():
    trainer = _spawned()
    with pytest.raises(ProcessFailedError) as info:
        # 3 samples: rank 0 runs 2 validation batches, rank 1 one; the user's all_gather at batch 1 has no partner
        trainer.validate(Gathering(), loader(3, 1), verbose=False)
    report = info.value.collectives
    assert info.value.diagnosis == "desync"
    assert "control-flow divergence inside the run" in report and "not a network problem" in report
    assert "the collective itself does not complete" not in report
    assert "Loop positions: rank 0 validate batch 1" in report and "rank 1 validate, epoch end" in report
    # real call sites under spawn: the user's line for rank 0, the Trainer's own code for rank 1
    assert "loop_shape_model.py:" in report.split("rank 1")[0]
    assert "torchfleet/trainer/eval_loop.py:" in report and "<string>" not in report


@pytest.mark.skipif(not deepspeed_available(), reason="deepspeed is not installed (the 'deepspeed' extra)")
def test_deepspeed_stage_3_evaluates_uneven_data_with_equal_shards(tmp_path):
    # every forward gathers the parameters from all ranks: 3 samples are padded to 2 per rank, not 2 and 1
    cfg = {"out": str(tmp_path / "metrics.pt")}
    proc = run_script(os.path.join(ROOT, "tests", "distributed", "scripts", "loop_shape_deepspeed.py"), cfg)
    metrics = load_results(cfg, proc)
    assert metrics["val_count"] == 4.0  # the 3 samples and the one repeated on the last rank
    assert "so 1 of them are evaluated twice" in proc.stderr
