"""DeepSpeed on real CPU processes over gloo: equivalence with one process, resume, world-size change, consolidation.

Three launches serve every test here (each DeepSpeed engine costs seconds, so they are shared):
2 ranks train ZeRO stages 1, 2 and 3, with CPU offload, with gradient accumulation and in bf16,
with AdamW, SGD with momentum, Adagrad and RMSprop, and write checkpoints mid-run and resume from
them; then 1 rank resumes those 2-rank checkpoints under DeepSpeed (another stage too),
single_device, ddp and fsdp, and writes a 1-rank checkpoint that 2 ranks resume last. The
reference is the same small transformer trained in this process with the global batch (shuffle
off, mean loss): ZeRO only partitions where the float32 state lives, so the weights must agree to
rounding.

No DeepSpeed C++ op is compiled: the optimizer is a torch one (no fused_adam or cpu_adam, also
with offload) and the shared-memory communication op, which only inference uses, is skipped.
"""

from __future__ import annotations

import json
import os

import pytest
import torch

import torchfleet as tf
from tests.distributed import sharded_helpers
from tests.distributed.scripts import deepspeed_train
from tests.distributed.scripts.deepspeed_train import BATCH, EPOCHS, TinyTransformer, build, make_data
from tests.distributed.sharded_helpers import load_results, train_reference
from torchfleet.checkpoint.deepspeed import consolidate_deepspeed, deepspeed_available

pytestmark = [
    pytest.mark.distributed,
    pytest.mark.slow,
    pytest.mark.skipif(not deepspeed_available(), reason="deepspeed is not installed (the 'deepspeed' extra)"),
]

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "deepspeed_train.py")
#: checkpoints are written after this optimizer step, of 12 (mid-epoch: 6 steps an epoch)
SAVE_AT, STEPS = deepspeed_train.SAVE_AT, 12
ATOL = 1e-5


def run_script(cfg: dict, timeout: float = 240) -> dict:
    return load_results(cfg, sharded_helpers.run_script(SCRIPT, cfg, timeout))


def reference(accumulate: int = 1) -> dict:
    """One process, the global batch: the weights every 2-rank DeepSpeed run must end with."""
    return train_reference(build, batch=2 * BATCH, accumulate=accumulate)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("deepspeed")
    ckpts = str(tmp)
    two = run_script({"out": str(tmp / "two.pt"), "devices": 2, "runs": [
        # as on a GPU host, DeepSpeed's CUDA accelerator is selected before the run: accelerator="cpu" must win
        {"name": "stage_1", "strategy": "deepspeed_stage_1", "ds_accelerator": "cuda"},
        {"name": "stage_2", "strategy": "deepspeed_stage_2", "save_at": SAVE_AT, "ckpt_dir": ckpts},
        {"name": "stage_2_resumed", "strategy": "deepspeed_stage_2", "resume": f"{ckpts}/stage_2.ckpt"},
        {"name": "stage_3", "strategy": "deepspeed_stage_3", "save_at": SAVE_AT, "ckpt_dir": ckpts},
        {"name": "stage_3_resumed", "strategy": "deepspeed_stage_3", "resume": f"{ckpts}/stage_3.ckpt"},
        {"name": "stage_2_offload", "strategy": "deepspeed_stage_2_offload"},
        {"name": "stage_3_offload", "strategy": "deepspeed_stage_3_offload"},
        {"name": "stage_2_accumulate", "strategy": "deepspeed_stage_2", "accumulate": 2},
        {"name": "stage_2_bf16", "strategy": "deepspeed_stage_2", "precision": "bf16-mixed"},
        {"name": "validate_stage_3", "strategy": "deepspeed_stage_3", "validate": f"{ckpts}/stage_2.ckpt"},
        {"name": "fleet_stage_3", "strategy": "deepspeed_stage_3", "fleet": True, "ckpt_dir": ckpts},
        # optimizers without Adam's exp_avg/exp_avg_sq: SGD trains on (the uninterrupted runs), the others stop
        # at the save, whose optimizer state the consolidation tests compare with plain torch
        {"name": "sgd_stage_2", "strategy": "deepspeed_stage_2", "optimizer": "sgd", "save_at": SAVE_AT,
         "ckpt_dir": ckpts},
        {"name": "sgd_stage_3", "strategy": "deepspeed_stage_3", "optimizer": "sgd", "save_at": SAVE_AT,
         "ckpt_dir": ckpts},
        {"name": "adagrad_stage_3", "strategy": "deepspeed_stage_3", "optimizer": "adagrad", "save_at": SAVE_AT,
         "ckpt_dir": ckpts, "max_steps": SAVE_AT},
        {"name": "rmsprop_stage_2", "strategy": "deepspeed_stage_2", "optimizer": "rmsprop", "save_at": SAVE_AT,
         "ckpt_dir": ckpts, "max_steps": SAVE_AT},
    ]})
    # 1 rank, twice the per-rank batch: the same global batch as the 2-rank runs
    one = run_script({"out": str(tmp / "one.pt"), "devices": 1, "batch": 2 * BATCH, "runs": [
        {"name": "stage_2_on_1", "strategy": "deepspeed_stage_2", "resume": f"{ckpts}/stage_2.ckpt",
         "ds_accelerator": "cuda"},
        {"name": "stage_3_on_1", "strategy": "deepspeed_stage_3_offload", "resume": f"{ckpts}/stage_3.ckpt"},
        {"name": "stage_3_as_2", "strategy": "deepspeed_stage_2", "resume": f"{ckpts}/stage_3.ckpt"},
        # another strategy: fsdp consolidates the ZeRO shards in each process, then keeps its own shards
        {"name": "fsdp_from_stage_2", "strategy": "fsdp", "resume": f"{ckpts}/stage_2.ckpt"},
        *[{"name": f"sgd_{target}_from_{stage}", "strategy": target, "optimizer": "sgd",
           "resume": f"{ckpts}/sgd_{stage}.ckpt"}
          for stage in ("stage_2", "stage_3")
          for target in ("deepspeed_stage_2", "deepspeed_stage_3", "single_device", "ddp", "fsdp")],
        # 1 rank writes a checkpoint that 2 ranks resume below
        {"name": "sgd_stage_2_ws1", "strategy": "deepspeed_stage_2", "optimizer": "sgd", "save_at": SAVE_AT,
         "ckpt_dir": ckpts},
    ]})
    # a copy of stage_2.ckpt with a pickled payload in an optimizer file, for the hostile-file test
    hostile = make_hostile(tmp / "stage_2.ckpt", tmp / "hostile.ckpt", tmp / "PAYLOAD_RAN")
    again = run_script({"out": str(tmp / "again.pt"), "devices": 2, "runs": [
        *[{"name": f"sgd_{target}_from_ws1", "strategy": target, "optimizer": "sgd",
           "resume": f"{ckpts}/sgd_stage_2_ws1.ckpt"}
          for target in ("deepspeed_stage_2", "deepspeed_stage_3", "ddp")],
        # last: the engine's own load (same stage and world size) and torchfleet's reader of ZeRO files (another
        # stage) must refuse the hostile copy
        {"name": "hostile_engine", "strategy": "deepspeed_stage_2", "resume": str(hostile), "expect_error": True},
        {"name": "hostile_reader", "strategy": "deepspeed_stage_3", "resume": str(hostile), "expect_error": True},
    ]})
    return {**two, **one, **again, "dir": tmp}


@pytest.fixture(scope="module")
def ref() -> dict:
    return reference()


@pytest.fixture(scope="module")
def sgd_ref() -> dict:
    return train_reference(build, batch=2 * BATCH, optimizer="sgd")


def assert_close(got: dict, want: dict, atol: float = ATOL) -> None:
    sharded_helpers.assert_close(got, want, atol)


@pytest.mark.parametrize("name", ["stage_1", "stage_2", "stage_3", "stage_2_offload", "stage_3_offload"])
def test_zero_stages_and_offload_match_one_process(runs, ref, name):
    result = runs[name]
    assert result["world_size"] == 2
    assert result["stage"] == int(name.split("_")[1])
    offload = result["config"]["zero_optimization"].get("offload_optimizer", {}).get("device")
    assert offload == ("cpu" if name.endswith("offload") else None)
    # the dict handed to DeepSpeed: "auto" filled from the Trainer
    assert result["config"]["train_micro_batch_size_per_gpu"] == BATCH
    assert result["config"]["gradient_accumulation_steps"] == 1
    assert "auto" not in json.dumps(result["config"])
    assert result["global_step"] == ref["global_step"] == STEPS
    assert_close(result["weights"], ref["weights"])
    assert result["val_loss"] == pytest.approx(ref["val_loss"], rel=1e-5)


def test_gradient_accumulation_matches_one_process(runs):
    want = reference(accumulate=2)
    result = runs["stage_2_accumulate"]
    assert result["config"]["gradient_accumulation_steps"] == 2
    assert result["global_step"] == want["global_step"] == STEPS // 2
    assert_close(result["weights"], want["weights"])


def test_bf16_runs_in_deepspeed_bf16(runs, ref):
    result = runs["stage_2_bf16"]
    assert result["config"]["bf16"]["enabled"] is True and result["config"]["fp16"]["enabled"] is False
    assert result["param_dtype"] == "torch.bfloat16"  # DeepSpeed trains the module in bf16 (inputs cast to match)
    # bfloat16 forward/backward with float32 master weights: close to, not equal to, the float32 run
    assert result["val_loss"] == pytest.approx(ref["val_loss"], rel=0.05)
    assert_close(result["weights"], ref["weights"], atol=0.1)


@pytest.mark.parametrize("name", ["stage_2", "stage_3"])
def test_resume_mid_run_ends_where_the_uninterrupted_run_ends(runs, ref, name):
    resumed = runs[f"{name}_resumed"]
    # it resumed: only the batches after the checkpoint were trained
    assert resumed["batches_run"] == STEPS - SAVE_AT
    assert resumed["global_step"] == STEPS
    assert_close(resumed["weights"], runs[name]["weights"])
    assert_close(resumed["weights"], ref["weights"])
    ckpt = runs["dir"] / f"{name}.ckpt"
    assert (ckpt / "torchfleet.pt").is_file() and (ckpt / "deepspeed").is_dir()
    meta = torch.load(ckpt / "torchfleet.pt", weights_only=False)
    assert meta["torchfleet"]["layout"] == "deepspeed" and meta["global_step"] == SAVE_AT
    assert "state_dict" not in meta and "optimizer_states" not in meta


@pytest.mark.parametrize("name", ["stage_2_on_1", "stage_3_on_1", "stage_3_as_2", "fsdp_from_stage_2"])
def test_resume_at_another_world_size(runs, ref, name):
    result = runs[name]
    assert result["world_size"] == 1
    assert result["batches_run"] == STEPS - SAVE_AT
    assert_close(result["weights"], ref["weights"])
    # nothing is converted on disk next to the checkpoint
    assert sorted(p.name for p in runs["dir"].iterdir() if p.name.startswith(".")) == []


SGD_MOVES = [(f"sgd_{target}_from_{stage}", 1) for stage in ("stage_2", "stage_3")
             for target in ("deepspeed_stage_2", "deepspeed_stage_3", "single_device", "ddp", "fsdp")]
SGD_MOVES += [(f"sgd_{target}_from_ws1", 2) for target in ("deepspeed_stage_2", "deepspeed_stage_3", "ddp")]


@pytest.mark.parametrize(("name", "world_size"), SGD_MOVES)
def test_sgd_momentum_checkpoint_resumes_anywhere_and_ends_where_the_uninterrupted_run_ends(
        runs, sgd_ref, name, world_size):
    """SGD's momentum_buffer (no exp_avg) moves between ZeRO stages, world sizes 2 <-> 1 and out of DeepSpeed."""
    for uninterrupted in ("sgd_stage_2", "sgd_stage_3", "sgd_stage_2_ws1"):
        assert_close(runs[uninterrupted]["weights"], sgd_ref["weights"])
    result = runs[name]
    assert result["world_size"] == world_size
    assert result["batches_run"] == STEPS - SAVE_AT
    assert result["global_step"] == STEPS
    assert_close(result["weights"], sgd_ref["weights"])


@pytest.mark.parametrize("name", ["stage_2", "stage_3"])
def test_consolidated_checkpoint_loads_into_the_plain_module_and_resumes_elsewhere(runs, ref, name, tmp_path):
    ckpt = runs["dir"] / f"{name}.ckpt"
    weights_only = consolidate_deepspeed(ckpt)
    assert "optimizer_states" not in weights_only and weights_only["global_step"] == SAVE_AT
    plain = TinyTransformer()
    plain.load_state_dict(weights_only["state_dict"])  # strict: the user's names, nothing added
    assert_close(plain.state_dict(), runs[name]["saved_weights"], atol=0.0)

    full = consolidate_deepspeed(ckpt, with_optimizer=True)
    assert full["torchfleet"]["format"] == 1 and "layout" not in full["torchfleet"]
    path = tmp_path / "consolidated.ckpt"
    torch.save(full, path)
    tf.seed_everything(0)
    model, trainer, train, val = build("single_device", 1, 2 * BATCH)
    trainer.fit(model, train, val, ckpt_path=str(path))
    assert model.batches_run == STEPS - SAVE_AT
    assert_close(model.state_dict(), ref["weights"])


def test_validate_loads_checkpoint_weights_into_a_partitioned_model(runs):
    """A stage-2 checkpoint's weights go into a stage-3 (partitioned) model: consolidated, then gathered per module."""
    result = runs["validate_stage_3"]
    saved = runs["stage_2"]["saved_weights"]
    assert_close(result["weights"], saved, atol=0.0)
    plain = TinyTransformer()
    plain.load_state_dict(saved)
    x, y = make_data()[:16]
    with torch.no_grad():
        want = torch.nn.functional.mse_loss(plain(x), y).item()
    assert result["val_loss"] == pytest.approx(want, rel=1e-5)


def test_fleet_loop_under_stage_3_matches_one_process_and_resumes(runs):
    from torch.utils.data import DataLoader

    torch.manual_seed(0)
    net = TinyTransformer()
    opt = torch.optim.AdamW(net.parameters(), lr=0.02, weight_decay=0.01)
    for _ in range(EPOCHS):
        for x, y in DataLoader(make_data(), batch_size=2 * BATCH):
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
    result = runs["fleet_stage_3"]
    assert result["world_size"] == 2 and result["extra"]["step"] == SAVE_AT
    assert_close(result["weights"], net.state_dict())
    # a fresh engine loaded the step-3 checkpoint through fleet.load and finished the same way
    assert_close(result["resumed_weights"], net.state_dict())


def test_consolidate_command_reads_zero_3_shards_without_the_processes(runs, tmp_path, capsys):
    from torchfleet.cli import main

    out = tmp_path / "weights.pt"
    assert main(["consolidate", str(runs["dir"] / "stage_3.ckpt"), str(out)]) == 0
    assert "Wrote" in capsys.readouterr().out
    plain = TinyTransformer()
    plain.load_state_dict(torch.load(out, weights_only=False)["state_dict"])
    assert_close(plain.state_dict(), runs["stage_3"]["saved_weights"], atol=0.0)


def optimizer_state_after_save(optimizer: str) -> tuple[TinyTransformer, dict]:
    """Plain torch, one process, the global batch: the optimizer's state_dict after SAVE_AT steps."""
    from torch.utils.data import DataLoader

    net = TinyTransformer(optimizer)
    opt = deepspeed_train.OPTIMIZERS[optimizer](net.parameters())
    for step, (x, y) in enumerate(DataLoader(make_data(), batch_size=2 * BATCH), start=1):
        opt.zero_grad()
        torch.nn.functional.mse_loss(net(x), y).backward()
        opt.step()
        if step == SAVE_AT:
            return net, opt.state_dict()
    raise AssertionError("unreachable")


@pytest.mark.parametrize(("name", "optimizer"), [("sgd_stage_2", "sgd"), ("sgd_stage_3", "sgd"),
                                                 ("adagrad_stage_3", "adagrad"), ("rmsprop_stage_2", "rmsprop"),
                                                 ("stage_2", "adamw"), ("stage_3", "adamw")])
def test_consolidate_with_optimizer_gives_every_state_key_of_any_optimizer(runs, tmp_path, name, optimizer):
    from torchfleet.cli import main

    net, want = optimizer_state_after_save(optimizer)
    out = tmp_path / "full.pt"
    assert main(["consolidate", str(runs["dir"] / f"{name}.ckpt"), str(out), "--with-optimizer"]) == 0
    got = torch.load(out, weights_only=False)["optimizer_states"][0]
    # numbered as the user's optimizer holds the parameters, one state per parameter
    assert [g["params"] for g in got["param_groups"]] == [g["params"] for g in want["param_groups"]]
    assert got["state"].keys() == want["state"].keys() == set(range(len(list(net.parameters()))))
    for index, param in enumerate(net.parameters()):
        assert got["state"][index].keys() == want["state"][index].keys(), index
        for key, value in want["state"][index].items():
            have = got["state"][index][key]
            if key == "step":
                assert float(have) == float(value) == SAVE_AT
            else:
                assert have.shape == param.shape, (index, key)
                # relative too: RMSprop divides by sqrt(square_avg - grad_avg**2), which magnifies the rounding
                # difference between summing the batch on 1 rank and averaging halves over 2
                torch.testing.assert_close(have, value, rtol=1e-4, atol=ATOL, msg=f"parameter {index} {key}")
    for key in deepspeed_train.OPTIMIZERS[optimizer]([torch.zeros(1)]).defaults:
        assert got["param_groups"][0][key] == want["param_groups"][0][key], key


@pytest.mark.parametrize("name", ["stage_1", "stage_2_on_1"])
def test_accelerator_cpu_trains_on_the_cpu_when_deepspeed_had_chosen_cuda(runs, ref, name):
    """DeepSpeed's CUDA accelerator was selected before setup (what DeepSpeed does by itself on a GPU host).

    Without torchfleet selecting DeepSpeed's CPU accelerator, setup fails in CUDA_Accelerator.set_device.
    """
    result = runs[name]
    assert result["ds_accelerator_before"] == "cuda"
    assert result["ds_accelerator"] == "cpu" and result["engine_device"] == "cpu"
    assert result["param_devices"] == ["cpu"]
    assert_close(result["weights"], ref["weights"])


class _Payload:
    """Unpickled, it runs ``touch marker``."""

    def __init__(self, marker) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        import shlex

        return (os.system, (f"touch {shlex.quote(self.marker)}",))


def make_hostile(src, hostile, marker):
    """A copy of the checkpoint ``src`` whose rank-1 optimizer file also holds a pickle that touches ``marker``."""
    import shutil

    shutil.copytree(src, hostile)
    optim = next((hostile / "deepspeed" / "checkpoint").glob("*rank_1_*optim_states.pt"))
    state = torch.load(optim, weights_only=False)  # written by the test run above: trusted
    torch.save({**state, "extra": _Payload(marker)}, optim)
    return hostile


def test_deepspeed_files_load_safely_and_a_hostile_one_is_refused_on_every_path(runs, tmp_path):
    from torchfleet.checkpoint.consolidate import consolidate
    from torchfleet.checkpoint.zero import ENGINE_GLOBALS, check_engine_files
    from torchfleet.errors import CheckpointError

    src = runs["dir"] / "stage_2.ckpt"
    tag_dir = src / "deepspeed" / "checkpoint"
    # DeepSpeed pickles classes of its own into its optimizer files: a bare weights-only load refuses them,
    # and exactly the ones torchfleet allows by name are what it asks for
    asked = {g for f in tag_dir.glob("*.pt") for g in torch.serialization.get_unsafe_globals_in_checkpoint(f)}
    assert asked and asked <= {f"{m}.{n}" for m, n in ENGINE_GLOBALS}
    check_engine_files(str(tag_dir))
    # the hostile copy (made by the runs fixture, whose last launch tried to resume it): the payload never ran
    marker, hostile = runs["dir"] / "PAYLOAD_RAN", runs["dir"] / "hostile.ckpt"
    assert not marker.exists()
    with pytest.raises(CheckpointError, match=r"system"):
        consolidate(hostile, tmp_path / "out.ckpt")
    # the engine's own load (same stage and world size) and torchfleet's reader of ZeRO files (another stage)
    for name in ("hostile_engine", "hostile_reader"):
        error = runs[name]["error"]
        assert error and "CheckpointError" in error and "system" in error, runs[name]
    assert not marker.exists()
