"""Trainer(profiler=...): the reports of SimpleProfiler, AdvancedProfiler, PyTorchProfiler, per stage and per rank."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time

import pytest

import torchfleet as tf
from tests.helpers import Regressor, loader
from torchfleet.callbacks import Callback
from torchfleet.errors import ConfigurationError
from torchfleet.profilers import AdvancedProfiler, PassThroughProfiler, PyTorchProfiler, SimpleProfiler

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
N, BATCH, EPOCHS = 64, 8, 2
BATCHES = N // BATCH * EPOCHS  # training batches of the whole fit
SLEEP = 0.004


class Slow(Regressor):
    """training_step sleeps SLEEP seconds (a lower bound the report's mean must respect); overrides a Module hook
    and times a block of its own through trainer.profiler."""

    def __init__(self):
        super().__init__()
        self.epoch_ends = 0

    def training_step(self, batch, batch_idx):
        time.sleep(SLEEP)
        with self.trainer.profiler.profile("my_block"):
            pass
        return super().training_step(batch, batch_idx)

    def on_train_epoch_end(self):
        self.epoch_ends += 1


class Counting(Callback):
    def __init__(self):
        self.wrapped_during_run: dict[str, bool] = {}

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        # with no profiler nothing on the strategy is shadowed: the per-batch path is the plain one (the backward
        # the Trainer calls is run_backward, Lightning's backward hook only when a strategy class overrides it)
        self.wrapped_during_run = {n: n in vars(trainer.strategy) for n in ("run_backward", "optimizer_step")}


def fit(tmp_path, profiler, accumulate: int = 1, **kw):
    model, cb = Slow(), Counting()
    trainer = tf.Trainer(accelerator="cpu", max_epochs=EPOCHS, profiler=profiler, default_root_dir=tmp_path,
                         callbacks=[cb], enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0, accumulate_grad_batches=accumulate, **kw)
    trainer.fit(model, loader(N, BATCH), loader(16, BATCH))
    return trainer, model, cb


def parse_simple(text: str) -> dict[str, tuple[float, int, float, float]]:
    rows = {}
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 5 and cells[0] not in ("Action", "Total"):
            rows[cells[0]] = (float(cells[1]), int(cells[2]), float(cells[3]), float(cells[4]))
    return rows


def test_simple_profiler_reports_every_hook_and_step(tmp_path):
    trainer, model, cb = fit(tmp_path, "simple", accumulate=2)
    path = os.path.join(trainer.log_dir, "fit-profile.txt")
    assert trainer.profiler.report_path == path
    rows = parse_simple(open(path).read())
    step = "[Strategy]SingleDeviceStrategy."
    assert rows[step + "training_step"][1] == BATCHES
    assert rows[step + "backward"][1] == BATCHES
    assert rows[step + "optimizer_step"][1] == BATCHES // 2  # accumulate_grad_batches=2
    assert rows[step + "validation_step"][1] == EPOCHS * 2  # 16 samples in batches of 8, after each epoch
    assert rows[step + "batch_to_device"][1] == BATCHES + EPOCHS * 2
    assert rows["[Module]Slow.on_train_epoch_end"][1] == model.epoch_ends == EPOCHS
    assert rows["[Callback]Counting.on_train_batch_end"][1] == BATCHES
    assert rows["my_block"][1] == BATCHES
    mean, calls, total, percent = rows[step + "training_step"]
    assert mean >= SLEEP and total == pytest.approx(mean * calls, rel=1e-3)
    assert 0 < percent < 100
    # a hook the run does not override is not timed (and costs nothing)
    assert not any("on_validation_batch_start" in a for a in rows)
    # the stage's end took every wrapper off the strategy again
    assert not {"run_backward", "optimizer_step", "batch_to_device", "step_function"} & set(vars(trainer.strategy))
    assert cb.wrapped_during_run == {"run_backward": True, "optimizer_step": True}


def test_without_a_profiler_nothing_is_wrapped(tmp_path):
    trainer, _, cb = fit(tmp_path, None)
    assert isinstance(trainer.profiler, PassThroughProfiler)
    assert cb.wrapped_during_run == {"run_backward": False, "optimizer_step": False}
    assert not [f for f in os.listdir(trainer.log_dir) if "profile" in f]


def test_each_stage_writes_its_own_report(tmp_path):
    trainer, _, _ = fit(tmp_path, SimpleProfiler(filename="perf"))
    trainer.test(trainer.module, loader(16, BATCH))
    fit_rows = parse_simple(open(os.path.join(trainer.log_dir, "fit-perf.txt")).read())
    test_rows = parse_simple(open(os.path.join(trainer.log_dir, "test-perf.txt")).read())
    assert "[Strategy]SingleDeviceStrategy.test_step" in test_rows
    assert test_rows["[Strategy]SingleDeviceStrategy.test_step"][1] == 2
    assert "[Strategy]SingleDeviceStrategy.training_step" not in test_rows
    assert "[Strategy]SingleDeviceStrategy.test_step" not in fit_rows


def test_dirpath_and_the_summary_on_rank_zero(tmp_path, caplog):
    import logging

    logger = logging.getLogger("torchfleet")
    logger.addHandler(caplog.handler)
    try:
        with caplog.at_level(logging.INFO, logger="torchfleet"):
            fit(tmp_path / "run", SimpleProfiler(dirpath=tmp_path / "prof"))
    finally:
        logger.removeHandler(caplog.handler)
    assert (tmp_path / "prof" / "fit-profile.txt").is_file()
    assert "FIT Profiler Report" in caplog.text and "training_step" in caplog.text


def test_advanced_profiler_has_a_cprofile_per_action(tmp_path):
    trainer, _, _ = fit(tmp_path, AdvancedProfiler(dump_stats=True))
    prof = trainer.profiler
    text = open(os.path.join(trainer.log_dir, "fit-profile.txt")).read()
    action = "[Strategy]SingleDeviceStrategy.training_step"
    assert f"Profile stats for: {action}" in text
    # the user's training_step ran BATCHES times inside that action, per cProfile's own count
    calls = {fn: v[1] for (file, _, fn), v in prof.stats(action).stats.items() if file.endswith("test_profilers.py")}
    assert calls["training_step"] == BATCHES
    # time.sleep ran inside training_step: cProfile counts it there, at least SLEEP each time
    sleeps = [v for (_, _, fn), v in prof.stats(action).stats.items() if "sleep" in fn]
    assert sleeps and sleeps[0][1] == BATCHES and sleeps[0][3] >= BATCHES * SLEEP
    dumped = [f for f in os.listdir(trainer.log_dir) if f.endswith(".prof")]
    assert "fit-profile-_Strategy_SingleDeviceStrategy.training_step.prof" in dumped


def test_pytorch_profiler_writes_a_trace_with_the_actions(tmp_path):
    trainer, _, _ = fit(tmp_path, "pytorch")
    assert isinstance(trainer.profiler, PyTorchProfiler)
    text = open(os.path.join(trainer.log_dir, "fit-profile.txt")).read()
    assert "FIT Profiler Report" in text and "aten::" in text
    trace = json.load(open(os.path.join(trainer.log_dir, "fit-profile.pt.trace.json")))
    names = [e.get("name") for e in trace["traceEvents"]]
    assert names.count("[Strategy]SingleDeviceStrategy.training_step") == BATCHES
    assert names.count("[Strategy]SingleDeviceStrategy.backward") == BATCHES


@pytest.mark.parametrize(("given", "match"), [
    ("simpel", r"Unknown profiler 'simpel'\. Did you mean 'simple'\?"),
    (SimpleProfiler, r"is a class; pass an instance"),
    (3, r"profiler=3 is not valid"),
])
def test_bad_profiler_argument(given, match):
    with pytest.raises(ConfigurationError, match=match):
        tf.Trainer(accelerator="cpu", profiler=given)


KINDS = ("simple", "advanced", "pytorch")


@pytest.fixture(scope="module")
def ddp_profiled(tmp_path_factory):
    """One 2-rank ddp launch fitting once per profiler kind (each in its own folder): stderr, and per kind the
    log dir rank 0 printed."""
    root = tmp_path_factory.mktemp("ddp-profilers")
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK",
                                                            "WORLD_SIZE", "RANK")}
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=os.pathsep.join([ROOT, os.path.join(ROOT, "src")]))
    proc = subprocess.run([sys.executable, os.path.join(ROOT, "tests", "distributed", "scripts", "profile_train.py"),
                           str(root), *KINDS], capture_output=True, text=True, timeout=240, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-4000:]
    log_dirs = dict(re.findall(r"^LOG_DIR (\S+) (\S+)$", proc.stdout, flags=re.M))
    assert sorted(log_dirs) == sorted(KINDS), proc.stdout
    # rank 0 alone prints a summary: one for each fit, none from rank 1
    assert proc.stderr.count("FIT Profiler Report") == len(KINDS), proc.stderr[-4000:]
    return proc.stderr, log_dirs


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("kind", KINDS)
def test_ddp_every_rank_writes_its_report(ddp_profiled, kind):
    stderr, log_dirs = ddp_profiled
    log_dir = log_dirs[kind]
    reports = {r: open(os.path.join(log_dir, f"fit-profile-{r}.txt")).read() for r in (0, 1)}
    # 32 samples, batch 4, 2 ranks: 4 batches per rank per epoch, 2 epochs
    for rank, text in reports.items():
        if kind == "simple":
            assert parse_simple(text)["[Strategy]DDPStrategy.training_step"][1] == 8
            assert f"(rank {rank})" in text
        elif kind == "advanced":
            assert f"Profile stats for: [Strategy]DDPStrategy.backward rank: {rank}" in text
        else:  # each rank's own table and Chrome trace, the rank in both file names
            assert f"(rank {rank})" in text and "aten::" in text
            trace = json.load(open(os.path.join(log_dir, f"fit-profile-{rank}.pt.trace.json")))
            names = [e.get("name") for e in trace["traceEvents"]]
            assert names.count("[Strategy]DDPStrategy.training_step") == 8
    # rank 0 alone prints its summary (one per fit, counted in the fixture): this fit's is rank 0's, naming its file
    assert stderr.count(f"Report written to {os.path.join(log_dir, 'fit-profile-0.txt')}") == 1
    assert "FIT Profiler Report (rank 0)" in stderr and "FIT Profiler Report (rank 1)" not in stderr
