"""ModelParallelStrategy: mesh sizes and their refusals (no processes), then tensor parallel + FSDP2 on real CPU
processes over gloo, equal to one process, and checkpoints that move between meshes and strategies.

Three launches serve the multi-process tests (starting ranks costs seconds; they are shared with the other
model-parallel test files, tests/distributed/model_parallel_launches.py): 4 ranks train TP2xDP2 (saving a
distributed and a one-file checkpoint mid-epoch), TP2xDP2 with gradient clipping and with gradient accumulation,
the "auto" mesh 1x4 resuming the
distributed checkpoint, DP4 resuming the file; 2 ranks run a Fleet loop (TP2) and resume the 2x2 checkpoint under
fsdp and ddp; 1 rank resumes it under single_device and a 1x1 mesh, and a consolidated copy of it. The reference is
the same Module trained in this process with the global batch: tensor parallelism and sharding only change where
float32 values live and in which order they are summed, so the weights must agree to rounding.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from tests.distributed.scripts import model_parallel_train as script
from tests.distributed.sharded_helpers import assert_close
from torchfleet.connector import resolve
from torchfleet.errors import ConfigurationError
from torchfleet.strategies import ModelParallelStrategy, StrategyRegistry
from torchfleet.strategies.model_parallel import mesh_sizes, total_norm

ATOL = 1e-5


def build(devices=4, num_nodes=1, **kwargs):
    return resolve(accelerator="cpu", devices=devices, num_nodes=num_nodes, strategy=ModelParallelStrategy(**kwargs))


@pytest.fixture
def two_nodes(monkeypatch):
    # num_nodes > 1 by hand needs the rendezvous address; nothing connects to it here
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29555")
    monkeypatch.setenv("NODE_RANK", "0")


# ----------------------------------------------------------------------------------------- without processes
def test_registered_name_builds_the_auto_mesh():
    assert StrategyRegistry.entry("model_parallel").cls is ModelParallelStrategy
    strategy = resolve(accelerator="cpu", devices=4, strategy="model_parallel")
    assert isinstance(strategy, ModelParallelStrategy) and strategy.world_size == 4
    assert (strategy.data_parallel_size, strategy.tensor_parallel_size) == (1, 4)  # one node: all tensor parallel
    assert strategy.launcher is not None and strategy.state_dict_type == "sharded"
    assert not torch.distributed.is_initialized()  # nothing joined a process group yet


@pytest.mark.parametrize(("dp", "tp", "per_node", "nodes", "sizes"), [
    ("auto", "auto", 4, 1, (1, 4)),
    ("auto", "auto", 2, 3, (3, 2)),
    (2, "auto", 4, 1, (2, 2)),
    ("auto", 2, 4, 1, (2, 2)),
    ("auto", 1, 4, 1, (4, 1)),
    (4, 1, 4, 1, (4, 1)),
    (1, 4, 4, 1, (1, 4)),
    ("auto", 2, 4, 2, (4, 2)),
])
def test_mesh_sizes(dp, tp, per_node, nodes, sizes):
    assert mesh_sizes(dp, tp, per_node, nodes) == sizes


@pytest.mark.parametrize(("dp", "tp", "per_node", "nodes", "words"), [
    (3, "auto", 4, 1, "data_parallel_size=3 does not divide the run's 4 processes"),
    ("auto", 3, 4, 1, "tensor_parallel_size=3 does not divide the run's 4 processes"),
    (2, 3, 4, 1, "makes a mesh of 6 processes, but the run has 4"),
    (1, 4, 2, 2, "tensor_parallel_size=4 is larger than a node"),
    (3, 2, 3, 2, "does not divide a node's 3 processes, so some groups would span two nodes"),
])
def test_impossible_meshes_are_refused(dp, tp, per_node, nodes, words):
    with pytest.raises(ConfigurationError, match=words):
        mesh_sizes(dp, tp, per_node, nodes)


def test_an_impossible_mesh_is_refused_before_any_process_starts(two_nodes):
    with pytest.raises(ConfigurationError, match="must multiply to the world size"):
        build(devices=4, data_parallel_size=2, tensor_parallel_size=3)
    with pytest.raises(ConfigurationError, match="larger than a node"):
        build(devices=2, num_nodes=2, tensor_parallel_size=4)
    assert (build(devices=2, num_nodes=2).data_parallel_size, build(devices=2, num_nodes=2).tensor_parallel_size) \
        == (2, 2)  # "auto": data parallel across the nodes, tensor parallel within each
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"data_parallel_size": 0}, r"data_parallel_size=0\) is not valid"),
    ({"tensor_parallel_size": "two"}, r"tensor_parallel_size='two'\) is not valid"),
    ({"data_parallel_size": True}, r"data_parallel_size=True\) is not valid"),
    ({"save_distributed_checkpoint": "yes"}, "save_distributed_checkpoint='yes'"),
    ({"parallelize_fn": 2}, "Give the sizes by name"),
    ({"timeout": -1}, "timeout=-1 is not valid"),
])
def test_bad_arguments_say_what_is_accepted(kwargs, words):
    with pytest.raises(ConfigurationError, match=words):
        ModelParallelStrategy(**kwargs)


def test_data_is_split_over_the_data_parallel_dimension_only(monkeypatch):
    strategy = build(devices=4, tensor_parallel_size=2)
    ranks = []
    for rank in range(4):
        monkeypatch.setattr(strategy.cluster_environment, "global_rank", lambda r=rank: r)
        ranks.append(strategy.distributed_sampler_kwargs)
    # ranks 0-1 and 2-3 are the tensor-parallel groups: each reads one data-parallel shard of two
    assert ranks == [{"num_replicas": 2, "rank": r} for r in (0, 0, 1, 1)]


def test_module_device_mesh_is_the_strategys_and_none_elsewhere():
    import torchfleet as tf

    model = script.Block()
    assert model.device_mesh is None  # outside a run
    model.trainer = tf.Trainer(accelerator="cpu", devices=2, strategy="ddp", logger=False)
    assert model.device_mesh is None
    trainer = tf.Trainer(accelerator="cpu", devices=2, strategy=ModelParallelStrategy(), logger=False)
    model.trainer = trainer
    assert model.device_mesh is None  # built when the processes are joined
    with pytest.raises(RuntimeError, match="once the processes are joined"):
        trainer.strategy.device_mesh  # noqa: B018 - Lightning's property raises before then
    mesh = object()
    trainer.strategy.module_device_mesh = mesh
    assert model.device_mesh is mesh and trainer.strategy.device_mesh is mesh


def test_max_restarts_reaches_the_launcher():
    strategy = resolve(accelerator="cpu", devices=2, strategy=ModelParallelStrategy(), max_restarts=2)
    assert strategy.max_restarts == 2 and strategy.launcher.max_restarts == 2
    assert ModelParallelStrategy(max_restarts=1).max_restarts == 1


def test_optimizers_set_up_with_the_module_are_refused():
    net = nn.Linear(2, 2)
    with pytest.raises(ConfigurationError, match="Set up the model first"):
        build(devices=2).setup_module_and_optimizers(net, [torch.optim.SGD(net.parameters(), lr=0.1)])


def test_storage_options_are_refused_for_distributed_checkpoints(tmp_path):
    with pytest.raises(TypeError, match="takes no storage_options"):
        build(devices=2).save_checkpoint({}, tmp_path / "x.ckpt", storage_options={"a": 1})


@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_total_norm_of_plain_tensors_is_torchs(norm_type):
    grads = [torch.randn(3, 4), torch.randn(5), torch.randn(2, 2).double()]
    want = torch.nn.utils.get_total_norm([g.float() for g in grads], norm_type)
    assert torch.allclose(total_norm(grads, norm_type), want)
    assert total_norm([], norm_type).item() == 0.0


# ----------------------------------------------------------------------------------------- on 4, 2 and 1 processes
@pytest.fixture(scope="module")
def runs(four_process_runs, one_process_runs, two_process_runs, model_parallel_dirs) -> dict:
    """This file's runs (tests/distributed/model_parallel_launches.py), from the launches the session shares."""
    part = "model_parallel"
    return {**four_process_runs[part], **two_process_runs[part], **one_process_runs[part],
            "dir": model_parallel_dirs[part]}


def reference(clip: float | None = None, accumulate: int = 1) -> dict:
    import torchfleet as tf

    tf.seed_everything(0)
    model, trainer, train, val = script.build({"strategy": "single_device", "clip": clip, "accumulate": accumulate}, 1)
    trainer.fit(model, train, val)
    return {"weights": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "global_step": trainer.global_step, "val_loss": float(trainer.callback_metrics["val_loss"])}


@pytest.fixture(scope="module")
def ref() -> dict:
    return reference()


@pytest.mark.distributed
@pytest.mark.slow
def test_tp2_dp2_equals_one_process(runs, ref):
    got = runs["tp2dp2"]
    assert_close(got["weights"], ref["weights"], ATOL)
    assert got["global_step"] == ref["global_step"] == script.STEPS
    assert got["val_loss"] == pytest.approx(ref["val_loss"], abs=ATOL)  # self.log(sync_dist=True)
    assert got["mesh"] == (("data_parallel", "tensor_parallel"), (2, 2))
    assert got["gathered_shape"] == (4,)  # self.all_gather: one value per rank
    params = got["params"]
    assert params["ff_in.weight"][0] == ("data_parallel", "tensor_parallel")  # tensor parallel, then sharded
    assert params["ff_out.weight"][1][1] == "S(1)"  # row-wise over the tensor-parallel dimension
    assert params["norm.weight"] == (("data_parallel",), ("S(0)",))  # sharded only


@pytest.mark.distributed
@pytest.mark.slow
def test_the_ranks_of_a_tensor_parallel_group_read_the_same_batches(runs):
    seen = runs["tp2dp2"]["seen"]
    assert len(seen) == 4 and len(seen[0]) == script.STEPS
    assert seen[0] == seen[1] and seen[2] == seen[3]  # ranks 0-1, 2-3: one tensor-parallel group each
    assert seen[0] != seen[2]  # the two data-parallel replicas read different halves of each global batch


@pytest.mark.distributed
@pytest.mark.slow
def test_gradient_clipping_combines_the_norms_of_both_meshes(runs, ref):
    clipped = reference(clip=0.05)
    assert max((clipped["weights"][k] - ref["weights"][k]).abs().max().item() for k in ref["weights"]) > 1e-3
    assert_close(runs["clip"]["weights"], clipped["weights"], ATOL)


@pytest.mark.distributed
@pytest.mark.slow
def test_gradient_accumulation_skips_the_data_parallel_sync_and_still_equals_one_process(runs, ref):
    accumulated = reference(accumulate=2)
    assert accumulated["global_step"] == script.STEPS // 2
    assert max((accumulated["weights"][k] - ref["weights"][k]).abs().max().item() for k in ref["weights"]) > 1e-3
    assert_close(runs["accumulate"]["weights"], accumulated["weights"], ATOL)
    assert runs["accumulate"]["global_step"] == script.STEPS // 2


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("name", ["auto_from_2x2", "dp4_from_file", "fsdp_from_2x2", "ddp_from_2x2",
                                  "single_from_2x2", "mesh_1x1_from_file", "single_from_consolidated"])
def test_a_mid_epoch_checkpoint_resumes_on_other_meshes_and_strategies(runs, ref, name):
    got = runs[name]
    assert_close(got["weights"], ref["weights"], ATOL)
    assert got["global_step"] == script.STEPS


@pytest.mark.distributed
@pytest.mark.slow
def test_the_resumed_runs_ran_on_the_meshes_asked_for(runs):
    assert runs["auto_from_2x2"]["mesh"] == (("data_parallel", "tensor_parallel"), (1, 4))
    assert runs["dp4_from_file"]["mesh"] == (("data_parallel", "tensor_parallel"), (4, 1))
    assert runs["mesh_1x1_from_file"]["mesh"] == (("data_parallel", "tensor_parallel"), (1, 1))
    assert runs["fsdp_from_2x2"]["mesh"] is None and runs["fsdp_from_2x2"]["params"]["ff_in.weight"][0] == ("shard",)
    assert os.path.isdir(os.path.join(runs["dir"], "tp2dp2.ckpt"))
    assert os.path.isfile(os.path.join(runs["dir"], "tp2dp2_file.ckpt"))


@pytest.mark.distributed
@pytest.mark.slow
def test_fleet_tensor_parallel_with_save_and_load(runs, ref):
    got = runs["fleet_tp2"]
    assert_close({k.removeprefix("_forward_module."): v for k, v in got["weights"].items()}, ref["weights"], ATOL)
    assert got["global_step"] == script.STEPS
    assert got["seen"][0] == got["seen"][1]  # one tensor-parallel group: both ranks read every batch
    assert got["params"]["_forward_module.ff_in.weight"][0] == ("data_parallel", "tensor_parallel")


@pytest.mark.distributed
@pytest.mark.slow
def test_refusals_at_fit_start(runs):
    assert "ff_in.weight has size 6 in dimension 0" in runs["uneven"]["error"]
    assert "tensor_parallel_size=4" in runs["uneven"]["error"]
    assert runs["unconfigured"]["error"].startswith("ConfigurationError: Unconfigured does not define "
                                                    "configure_model(), which ModelParallelStrategy needs")
