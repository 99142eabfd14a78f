"""DDP on 2 real CPU processes over gloo: numerical equivalence with one process, every launch style.

The reference is one process with the global batch (2 x the per-rank batch) over the same data, in the
order the ranks read it (the Trainer shuffles a distributed training loader, as Lightning's does:
tests/distributed/trainer_order.py), and a mean loss: DDP averages the ranks' gradients, so the weights
must agree to fp32 rounding. Validation uses 63 samples, which 2 ranks cannot split evenly; exact evaluation
must still count each sample once.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import torchfleet as tf
from tests.distributed.scripts import ddp_train
from tests.distributed.scripts.ddp_train import N_VAL, build

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "ddp_train.py")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def pythonpath() -> str:
    """PYTHONPATH for a script this test starts: the repository (for ``tests``) before the caller's (which may name the
    checkout's ``src``: the scripts must import the torchfleet under test, not an installed one)."""
    return os.pathsep.join(filter(None, [ROOT, os.environ.get("PYTHONPATH")]))


def run_script(cfg: dict, timeout: float = 120, env: dict | None = None,
               module: bool = False) -> subprocess.CompletedProcess:
    """Run the training script as a user would (``python script.py``, or ``python -m tests.distributed.scripts.ddp_train``
    with ``module``); ddp re-runs it for rank 1."""
    full_env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=pythonpath(), **(env or {}))
    for var in ("MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "NODE_RANK", "WORLD_SIZE", "RANK"):
        if env is None or var not in env:
            full_env.pop(var, None)
    command = ["-m", "tests.distributed.scripts.ddp_train"] if module else [SCRIPT]
    return subprocess.run([sys.executable, *command, json.dumps(cfg)], capture_output=True, text=True,
                          timeout=timeout, env=full_env, cwd=ROOT)


def reference(batch: int, epochs: int = 2, accumulate: int = 1) -> dict:
    """One process, the global batch: what every DDP variant must reproduce."""
    tf.seed_everything(0)
    model, trainer, train, val = build({"devices": 1, "batch": batch, "epochs": epochs, "accumulate": accumulate,
                                        "reference_of": 2}, strategy="single_device")
    trainer.fit(model, train, val)
    return {"weights": model.state_dict(), "global_step": trainer.global_step,
            "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()}}


@pytest.fixture(scope="module")
def ref16() -> dict:
    return reference(batch=16)


def assert_same_weights(got: dict, want: dict, atol: float = 1e-6) -> None:
    assert got.keys() == want.keys()
    for k in want:
        diff = (got[k].float() - want[k].float()).abs().max().item()
        assert diff <= atol, f"{k}: max |diff| {diff:.3g} > {atol}"


def check_run(result: dict, ref: dict) -> None:
    assert_same_weights(result["weights"], ref["weights"])
    assert result["global_step"] == ref["global_step"]
    # the synced epoch metrics are the one-process ones: every validation sample counted once
    assert result["metrics"]["val_seen"] == N_VAL
    assert result["metrics"]["val_loss"] == pytest.approx(ref["metrics"]["val_loss"], rel=1e-5)
    assert result["metrics"]["train_loss"] == pytest.approx(ref["metrics"]["train_loss"], rel=1e-5)


@pytest.fixture(scope="module")
def ddp_launch(tmp_path_factory) -> dict:
    """One ``python -m tests.distributed.scripts.ddp_train`` launch on 2 ranks (rank 1 a re-run of the module; the
    scripts of the other tests are started as ``python script.py``) fitting, in turn: two Trainers of batch 8 (the
    second trains from scratch again), batch 4 with 2 accumulated micro-batches and a counting all-reduce hook,
    batch 8 shuffled. Each run writes its own file; the three share the ranks and their start."""
    folder = tmp_path_factory.mktemp("ddp-launch")
    outs = {name: str(folder / f"{name}.pt") for name in ("twice", "accumulate", "shuffle")}
    proc = run_script({"strategy": "ddp", "devices": 2, "batch": 8, "out": outs["twice"], "twice": True,
                       "verbose": True, "also": [
                           {"batch": 4, "accumulate": 2, "comm_count": True, "out": outs["accumulate"]},
                           {"batch": 8, "shuffle": True, "out": outs["shuffle"]}]}, timeout=240, module=True)
    assert proc.returncode == 0, proc.stderr
    return {"proc": proc, **{name: torch.load(out) for name, out in outs.items()}}


def test_ddp_script_relaunch_matches_one_process(ddp_launch, ref16):
    # two Trainers in one script: the second trains from scratch again and must match as well
    assert ddp_launch["proc"].stderr.count("Started local ranks 1..1") == 1  # the children were started once
    result = ddp_launch["twice"]
    assert result["world_size"] == 2 and result["ranks"] == [0, 1]
    check_run(result, ref16)


@pytest.mark.parametrize("strategy", ["ddp_spawn", pytest.param("ddp_fork", marks=pytest.mark.forks)])
def test_spawn_and_fork_match_one_process_and_fill_the_parent(strategy):
    tf.seed_everything(0)
    model, trainer, train, val = build({"strategy": strategy, "devices": 2, "batch": 8})
    before = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.fit(model, train, val)
    # unlike Lightning, the parent's objects hold the result of the run
    result = {"weights": {k: v.clone() for k, v in model.state_dict().items()}, "global_step": trainer.global_step,
              "metrics": {k: float(v) for k, v in trainer.callback_metrics.items()}}
    epoch = trainer.current_epoch
    # a second fit starts new processes (new port) from the trained weights
    trained = {k: v.clone() for k, v in model.state_dict().items()}
    trainer.fit(model, train, val)
    # the reference trains in this process: after the forks, which a backward here would forbid on a GPU machine
    ref16 = reference(batch=16)
    check_run(result, ref16)
    assert epoch == 2
    assert trainer.global_step == ref16["global_step"]
    moved = max((model.state_dict()[k] - trained[k]).abs().max().item() for k in trained)
    assert moved > 1e-4
    assert any((before[k] != trained[k]).any() for k in before)


def test_gradient_accumulation_skips_allreduce_on_non_final_micro_batches(ddp_launch):
    result = ddp_launch["accumulate"]
    ref = reference(batch=8, accumulate=2)
    assert_same_weights(result["weights"], ref["weights"])
    # 64 samples / 2 ranks / batch 4 = 8 micro-batches per epoch -> 4 optimizer steps; 2 epochs; the
    # tiny model fits in one DDP bucket: one all-reduce per optimizer step, none for the other micro-batches
    assert result["global_step"] == 8
    assert result["comm_calls"] == 8


def test_ddp_with_one_device_runs_and_says_it_is_pointless(tmp_path):
    out = tmp_path / "result.pt"
    proc = run_script({"strategy": "ddp", "devices": 1, "batch": 16, "out": str(out)})
    assert proc.returncode == 0, proc.stderr
    assert "nothing to synchronise" in proc.stderr
    assert torch.load(out)["world_size"] == 1


def test_model_checkpoint_after_spawn_names_the_best_file(tmp_path):
    from torchfleet.callbacks import ModelCheckpoint

    tf.seed_everything(0)
    model, _, train, val = build({})
    ckpt = ModelCheckpoint(dirpath=tmp_path, monitor="val_loss", save_top_k=1)
    trainer = tf.Trainer(strategy="ddp_spawn", accelerator="cpu", devices=2, max_epochs=2, callbacks=[ckpt],
                         logger=False, enable_progress_bar=False, enable_model_summary=False,
                         num_sanity_val_steps=0)
    trainer.fit(model, train, val)
    assert ckpt.best_model_path and os.path.exists(ckpt.best_model_path)
    assert trainer.checkpoint_callback.best_model_score is not None
    # only rank 0 wrote: one checkpoint file, and it loads into a fresh model
    assert [p.name for p in tmp_path.iterdir() if p.suffix == ".ckpt"] == [os.path.basename(ckpt.best_model_path)]
    saved = torch.load(ckpt.best_model_path, weights_only=False)
    assert saved["global_step"] in (4, 8)  # the end of epoch 0 or 1, whichever validated better


def test_sampler_set_epoch_reshuffles_each_epoch_alike_on_every_rank(ddp_launch):
    # with shuffling the DDP run matches no fixed reference, but it must train and agree across ranks
    result = ddp_launch["shuffle"]
    assert result["global_step"] == 8
    assert result["metrics"]["val_seen"] == N_VAL


def test_script_is_importable_for_spawn():
    # ddp_spawn pickles the model by reference to its class: the class must live in an importable module
    assert ddp_train.Net.__module__ == "tests.distributed.scripts.ddp_train"


def test_ddp_relaunches_python_dash_m(ddp_launch):
    # the shared launch is started as `python -m tests.distributed.scripts.ddp_train` (its fixture checks it exited 0)
    assert ddp_launch["proc"].args[1:3] == ["-m", "tests.distributed.scripts.ddp_train"]
    assert ddp_launch["twice"]["ranks"] == [0, 1]


def test_ddp_relaunches_the_torchfleet_command(tmp_path):
    import shutil

    exe = shutil.which("torchfleet") or pytest.skip("the torchfleet command is not on PATH (package not installed)")
    proc = subprocess.run(
        [exe, "fit", "--trainer.strategy=ddp", "--trainer.devices=2", "--trainer.accelerator=cpu",
         "--trainer.max_steps=2", "--trainer.limit_val_batches=1", f"--trainer.default_root_dir={tmp_path}",
         "--trainer.enable_progress_bar=false", "--data.num_train=512", "--data.num_val=64"],
        capture_output=True, text=True, timeout=120, env=dict(os.environ, OMP_NUM_THREADS="1"), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "local ranks 1..1" in proc.stderr
    # one run folder, written by rank 0 alone
    assert sorted(p.name for p in (tmp_path / "logs").iterdir()) == ["version_0"]
    assert list((tmp_path / "logs" / "version_0" / "checkpoints").glob("*.ckpt"))


_INLINE = """
import torch, torchfleet as tf
from tests.distributed.scripts.ddp_train import build
tf.seed_everything(0)
model, trainer, train, val = build({{"strategy": {strategy!r}, "devices": 2, "batch": 8, "epochs": 1}})
trainer.fit(model, train, val)
print("STRATEGY", type(trainer.strategy).__name__, trainer.strategy.start_method, "STEPS", trainer.global_step)
"""


@pytest.mark.parametrize("how", ["python -c", "stdin"])
def test_fork_works_where_the_script_cannot_be_rerun(how):
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONPATH=pythonpath())
    if how == "python -c":
        # ddp_notebook as named: fork from a command string
        proc = subprocess.run([sys.executable, "-c", _INLINE.format(strategy="ddp_notebook")], capture_output=True,
                              text=True, timeout=120, env=env, cwd=ROOT)
    else:
        # `python - < script`, like an interactive session: strategy='auto' must choose fork by itself
        proc = subprocess.run([sys.executable, "-"], input=_INLINE.format(strategy="auto"), capture_output=True,
                              text=True, timeout=120, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert "STRATEGY DDPStrategy fork STEPS 4" in proc.stdout


def test_early_stopping_under_spawn_counts_the_stopped_epoch(tmp_path):
    # any val_loss is below the threshold, so the first check (epoch index 0) stops the run: as when max_epochs
    # ends it, the stopped epoch counts, in the ranks (no rank fails) and in the launching process
    from torchfleet.callbacks import EarlyStopping

    tf.seed_everything(0)
    model, _, train, val = build({})
    early = EarlyStopping(monitor="val_loss", stopping_threshold=1e9)
    trainer = tf.Trainer(strategy="ddp_spawn", accelerator="cpu", devices=2, max_epochs=5, callbacks=[early],
                         logger=False, enable_checkpointing=False, enable_progress_bar=False,
                         enable_model_summary=False, num_sanity_val_steps=0)
    trainer.fit(model, train, val)
    assert early.stopped_epoch == 0
    assert trainer.current_epoch == 1
    assert trainer.global_step == 4  # one whole epoch: 64 samples / (2 ranks x 8)
