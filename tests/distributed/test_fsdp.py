"""fsdp (FSDP2) on real CPU processes over gloo: equivalence with one process, resume, checkpoints that move.

Five launches serve every test here (starting ranks costs seconds, so they are shared): 2 ranks
train with each sharding strategy, CPU offload, accumulation, bf16, meta-device init and a Fleet
loop, write checkpoints (sharded and full, fsdp and ddp) mid-run and resume them across
strategies; 3 ranks and 1 rank resume the 2-rank sharded checkpoint; 4 ranks on two "nodes"
started by hand train with HYBRID_SHARD; and a 2-rank run whose rank 1 is killed in the middle of
a sharded save. The reference is the same small transformer trained in this process with the
global batch (shuffle off, mean loss): sharding only changes where float32 values live, so the
weights must agree to rounding.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

import torchfleet as tf
from tests.distributed import sharded_helpers
from tests.distributed.scripts import fsdp_train
from tests.distributed.scripts.fsdp_train import (
    GLOBAL_BATCH,
    SAVE_AT,
    STEPS,
    TinyTransformer,
    build,
    make_data,
)
from tests.distributed.sharded_helpers import ROOT, child_env, load_results, train_reference
from torchfleet.environments import find_free_port

pytestmark = [pytest.mark.distributed, pytest.mark.slow]

SCRIPT = os.path.join(os.path.dirname(__file__), "scripts", "fsdp_train.py")
ATOL = 1e-5
#: a fit(max_steps=STOP_AT) that returns inside the second epoch
STOP_AT = 5
WRAP = {"auto_wrap": True}


def run_script(cfg: dict, timeout: float = 240) -> tuple[dict, subprocess.CompletedProcess]:
    proc = sharded_helpers.run_script(SCRIPT, cfg, timeout)
    return load_results(cfg, proc), proc


def run_two_nodes(cfg: dict, timeout: float = 240) -> dict:
    """Two "nodes" on this machine, each started by hand with NODE_RANK (each starts its own local rank 1)."""
    port = str(find_free_port())
    procs = [subprocess.Popen([sys.executable, SCRIPT, json.dumps(cfg)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT,
                              env=child_env(MASTER_ADDR="127.0.0.1", MASTER_PORT=port, NODE_RANK=str(k)))
             for k in range(2)]
    outs = []
    try:
        for p in procs:
            outs.append(p.communicate(timeout=timeout))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err[-6000:]
    return torch.load(cfg["out"], weights_only=False)


def reference(accumulate: int = 1) -> dict:
    """One process, the global batch: the weights every fsdp run must end with."""
    return train_reference(build, accumulate=accumulate)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict:
    tmp = tmp_path_factory.mktemp("fsdp")
    d = str(tmp)
    fsdp = lambda **kw: {"strategy": "fsdp", "fsdp": {**WRAP, **kw}}  # noqa: E731
    two, two_proc = run_script({"out": f"{d}/two.pt", "devices": 2, "runs": [
        {"name": "ddp", "strategy": "ddp", "save_at": SAVE_AT, "ckpt_dir": d},
        {"name": "full_shard", **fsdp(), "save_at": SAVE_AT, "ckpt_dir": d},
        {"name": "full_shard_resumed", **fsdp(), "resume": f"{d}/full_shard.ckpt"},
        {"name": "stopped", **fsdp(), "stop_at": STOP_AT, "ckpt_dir": d},
        {"name": "stopped_resumed", **fsdp(), "resume": f"{d}/stopped.ckpt"},
        {"name": "shard_grad_op", **fsdp(sharding_strategy="SHARD_GRAD_OP")},
        {"name": "no_shard", **fsdp(sharding_strategy="NO_SHARD")},
        {"name": "root_only", "strategy": "fsdp"},
        {"name": "no_match", "strategy": "fsdp", "fsdp": {"auto_wrap_policy_conv": True}},
        {"name": "cpu_offload", "strategy": "fsdp_cpu_offload", "fsdp": WRAP, "save_at": SAVE_AT, "ckpt_dir": d},
        {"name": "cpu_offload_resumed", "strategy": "fsdp_cpu_offload", "fsdp": WRAP,
         "resume": f"{d}/cpu_offload.ckpt"},
        {"name": "accumulate", **fsdp(), "accumulate": 2},
        {"name": "bf16", **fsdp(), "precision": "bf16-mixed"},
        {"name": "full_file", **fsdp(state_dict_type="full"), "save_at": SAVE_AT, "ckpt_dir": d},
        {"name": "full_file_resumed", **fsdp(), "resume": f"{d}/full_file.ckpt"},
        {"name": "fsdp_from_ddp", **fsdp(), "resume": f"{d}/ddp.ckpt"},
        {"name": "ddp_from_fsdp", "strategy": "ddp", "resume": f"{d}/full_shard.ckpt"},
        {"name": "empty_init", **fsdp(), "empty_init": True, "save_at": SAVE_AT, "ckpt_dir": d},
        {"name": "checkpointing", **fsdp(activation_checkpointing_policy=True)},
        {"name": "validate", **fsdp(), "validate": f"{d}/ddp.ckpt"},
        {"name": "top_k", **fsdp(), "model_checkpoint": True, "ckpt_dir": d},
        {"name": "fleet", **fsdp(), "fleet": True, "ckpt_dir": d},
    ]})
    three, _ = run_script({"out": f"{d}/three.pt", "devices": 3, "runs": [
        {"name": "full_shard_on_3", **fsdp(), "resume": f"{d}/full_shard.ckpt"},
    ]})
    one, _ = run_script({"out": f"{d}/one.pt", "devices": 1, "runs": [
        {"name": "full_shard_on_1", **fsdp(), "resume": f"{d}/full_shard.ckpt"},
        {"name": "single_device_from_fsdp", "strategy": "single_device", "resume": f"{d}/full_shard.ckpt"},
        # on one rank: under the script launcher an error in every rank ends the run (tested in test_faults)
        {"name": "wrong_shapes", **fsdp(), "wrong_model": True, "resume": f"{d}/full_shard.ckpt",
         "expect_error": True},
    ]})
    return {**two, **three, **one, "dir": tmp, "two_stderr": two_proc.stderr}


@pytest.fixture(scope="module")
def ref() -> dict:
    return reference()


def assert_close(got: dict, want: dict, atol: float = ATOL) -> None:
    sharded_helpers.assert_close(got, want, atol)


@pytest.mark.parametrize("name", ["full_shard", "shard_grad_op", "no_shard", "root_only", "cpu_offload",
                                  "checkpointing", "ddp"])
def test_sharding_strategies_match_one_process(runs, ref, name):
    result = runs[name]
    assert result["world_size"] == 2
    assert result["global_step"] == ref["global_step"] == STEPS
    assert_close(result["weights"], ref["weights"])
    assert result["val_loss"] == pytest.approx(ref["val_loss"], rel=1e-5)


@pytest.mark.parametrize(("name", "placements", "local"), [
    ("full_shard", ["S(0)"], 0.5), ("shard_grad_op", ["S(0)"], 0.5), ("cpu_offload", ["S(0)"], 0.5),
    # a 2 x 1 mesh: replicated over both ranks, "sharded" over one
    ("no_shard", ["R", "S(0)"], 1.0)])
def test_parameters_are_sharded_as_asked(runs, name, placements, local):
    params = runs[name]["params"]
    weight = params["encoder.0.linear1.weight"]  # 16 x 8: splits evenly over 2 ranks
    assert weight["dtensor"] and weight["placements"] == placements
    assert weight["local_numel"] == int(weight["numel"] * local)
    if name == "cpu_offload":
        assert weight["device"] == "cpu"


def test_a_policy_that_matches_nothing_warns_and_still_trains(runs, ref):
    assert "matched no submodule" in runs["two_stderr"]
    assert_close(runs["no_match"]["weights"], ref["weights"])


def test_gradient_accumulation_matches_one_process(runs):
    want = reference(accumulate=2)
    result = runs["accumulate"]
    assert result["global_step"] == want["global_step"] == STEPS // 2
    assert_close(result["weights"], want["weights"])


def test_bf16_mixed_computes_in_bf16_and_keeps_fp32_shards(runs, ref):
    result = runs["bf16"]
    assert all(w.dtype == torch.float32 for w in result["weights"].values())
    assert result["val_loss"] == pytest.approx(ref["val_loss"], rel=0.05)
    assert_close(result["weights"], ref["weights"], atol=0.2)
    # not the float32 run: the forward really ran in bfloat16
    assert max((result["weights"][k] - ref["weights"][k]).abs().max().item() for k in ref["weights"]) > 1e-6


@pytest.mark.parametrize(("name", "source"), [
    ("full_shard_resumed", "full_shard"), ("cpu_offload_resumed", "cpu_offload"),
    ("full_file_resumed", "full_file"), ("fsdp_from_ddp", "ddp"), ("ddp_from_fsdp", "full_shard"),
    ("full_shard_on_3", "full_shard"), ("full_shard_on_1", "full_shard"), ("single_device_from_fsdp", "full_shard"),
])
def test_resume_mid_run_ends_where_the_uninterrupted_run_ends(runs, ref, name, source):
    result = runs[name]
    world = {"_on_3": 3, "_on_1": 1, "single_device": 1}
    assert result["world_size"] == next((w for k, w in world.items() if k in name), 2)
    # it resumed: only the steps after the checkpoint were trained (each rank runs one batch a step)
    assert result["batches_run"] == STEPS - SAVE_AT
    assert result["global_step"] == STEPS
    assert_close(result["weights"], ref["weights"])


def test_a_checkpoint_saved_after_fit_stopped_inside_an_epoch_resumes_there(runs, ref):
    stopped, resumed = runs["stopped"], runs["stopped_resumed"]
    assert stopped["global_step"] == STOP_AT
    assert resumed["batches_run"] == STEPS - STOP_AT and resumed["global_step"] == STEPS
    assert_close(resumed["weights"], ref["weights"])
    meta = torch.load(runs["dir"] / "stopped.ckpt" / "torchfleet.pt", weights_only=True)
    assert meta["loops"]["fit"]["stopped_mid_epoch"] is True


def test_sharded_checkpoint_layout(runs):
    ckpt = runs["dir"] / "full_shard.ckpt"
    files = sorted(p.name for p in ckpt.iterdir())
    assert files == [".metadata", "__0_0.distcp", "__1_0.distcp", "torchfleet.pt"]
    meta = torch.load(ckpt / "torchfleet.pt", weights_only=True)  # plain values and tensors only
    assert meta["torchfleet"]["layout"] == "dcp" and meta["global_step"] == SAVE_AT
    assert "state_dict" not in meta and "optimizer_states" not in meta
    assert meta["lr_schedulers"] and meta["loops"]
    # state_dict_type="full": one ordinary file that torch.load reads without torchfleet's help
    full = torch.load(runs["dir"] / "full_file.ckpt", weights_only=False)
    plain = TinyTransformer()
    plain.load_state_dict(full["state_dict"])
    assert_close(plain.state_dict(), runs["full_file"]["saved_weights"], atol=0.0)
    assert len(full["optimizer_states"][0]["state"]) == len(list(plain.parameters()))


def test_meta_device_init_materialises_only_shards(runs, tmp_path):
    result = runs["empty_init"]
    assert result["was_meta"]
    weight = result["params"]["encoder.0.linear1.weight"]
    assert weight["local_numel"] == weight["numel"] // 2
    # initialised by reset_parameters (not zeros, not uninitialised memory) and trained to a finite loss
    assert all(torch.isfinite(w).all() for w in result["weights"].values())
    assert result["weights"]["encoder.0.norm1.weight"].ne(0).all()
    assert result["val_loss"] < 1.0
    # its checkpoint holds the whole model: consolidated, it loads into the plain module
    from torchfleet.checkpoint.consolidate import consolidate

    consolidate(runs["dir"] / "empty_init.ckpt", tmp_path / "c.pt")
    plain = TinyTransformer()
    plain.load_state_dict(torch.load(tmp_path / "c.pt", weights_only=False)["state_dict"])
    assert_close(plain.state_dict(), result["saved_weights"], atol=0.0)


def test_validate_loads_a_ddp_checkpoint_into_the_sharded_model(runs):
    saved = runs["ddp"]["saved_weights"]
    assert_close(runs["validate"]["weights"], saved, atol=0.0)
    plain = TinyTransformer()
    plain.load_state_dict(saved)
    x, y = make_data()[:16]
    with torch.no_grad():
        want = torch.nn.functional.mse_loss(plain(x), y).item()
    assert runs["validate"]["val_loss"] == pytest.approx(want, rel=1e-5)


def test_loading_into_a_model_of_other_shapes_names_the_keys(runs):
    error = runs["wrong_shapes"]["error"]
    assert error is not None and error.startswith("CheckpointError")
    assert "encoder.0.linear1.weight" in error and "(16, 8)" in error and "(32, 8)" in error


def test_model_checkpoint_keeps_top_k_and_last_as_directories(runs):
    folder = runs["dir"] / "top_k"
    names = sorted(p.name for p in folder.iterdir() if not p.name.startswith("."))
    assert "last.ckpt" in names and len(names) == 2, names
    for name in names:
        assert (folder / name / "torchfleet.pt").is_file()
    assert runs["top_k"]["best_model_path"].endswith(next(n for n in names if n != "last.ckpt"))


def test_fleet_loop_matches_one_process_and_resumes(runs):
    from torch.utils.data import DataLoader

    net = TinyTransformer()
    opt = torch.optim.AdamW(net.parameters(), lr=0.02, weight_decay=0.01)
    for _ in range(fsdp_train.EPOCHS):
        for x, y in DataLoader(make_data(), batch_size=GLOBAL_BATCH):
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
    result = runs["fleet"]
    assert result["world_size"] == 2 and result["extra"]["step"] == SAVE_AT
    assert result["params"]["encoder.0.linear1.weight"]["dtensor"]
    assert_close(result["weights"], net.state_dict())
    assert_close(result["resumed_weights"], net.state_dict())


def test_consolidate_command_writes_one_loadable_file(runs, ref, tmp_path):
    out = tmp_path / "model.pt"
    proc = subprocess.run([sys.executable, "-m", "torchfleet", "consolidate", str(runs["dir"] / "full_shard.ckpt"),
                           str(out), "--with-optimizer"], capture_output=True, text=True, env=child_env(), cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    checkpoint = torch.load(out, weights_only=False)
    plain = TinyTransformer()
    plain.load_state_dict(checkpoint["state_dict"])
    assert_close(plain.state_dict(), runs["full_shard"]["saved_weights"], atol=0.0)
    # with the optimizer, it resumes under single_device like any single-file checkpoint
    tf.seed_everything(0)
    model, trainer, train, val = build("single_device", 1)
    trainer.fit(model, train, val, ckpt_path=str(out))
    assert model.batches_run == STEPS - SAVE_AT
    assert_close(model.state_dict(), ref["weights"])


def test_hybrid_shard_on_two_nodes_matches_one_process(ref, tmp_path):
    """2 nodes x 2 processes: sharded within a node, replicated across nodes."""
    result = run_two_nodes({"out": str(tmp_path / "hybrid.pt"), "devices": 2, "num_nodes": 2, "runs": [
        {"name": "hybrid", "strategy": "fsdp", "fsdp": {**WRAP, "sharding_strategy": "HYBRID_SHARD"}},
    ]})["hybrid"]
    assert result["world_size"] == 4
    weight = result["params"]["encoder.0.linear1.weight"]
    assert weight["placements"] == ["R", "S(0)"]
    assert weight["local_numel"] == weight["numel"] // 2
    assert_close(result["weights"], ref["weights"])


def test_a_rank_killed_during_a_sharded_save_leaves_the_previous_checkpoint(ref, tmp_path):
    d = str(tmp_path)
    proc = sharded_helpers.run_script(SCRIPT, {"out": f"{d}/killed.pt", "devices": 2, "runs": [
        {"name": "killed", "strategy": "fsdp", "fsdp": WRAP, "save_at": SAVE_AT, "ckpt_dir": d,
         "kill_in_second_save": True},
    ]})
    assert proc.returncode != 0
    assert "rank 1" in proc.stderr.lower() or "local rank 1" in proc.stderr.lower(), proc.stderr[-3000:]
    ckpt = tmp_path / "killed.ckpt"
    meta = torch.load(ckpt / "torchfleet.pt", weights_only=False)
    assert meta["global_step"] == SAVE_AT  # the first save, untouched by the second
    # and it still resumes to the end, here in this process
    tf.seed_everything(0)
    model, trainer, train, val = build("single_device", 1)
    trainer.fit(model, train, val, ckpt_path=str(ckpt))
    assert model.batches_run == STEPS - SAVE_AT
    assert_close(model.state_dict(), ref["weights"])
