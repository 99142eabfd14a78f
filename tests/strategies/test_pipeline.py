"""Pipeline parallelism under ModelParallelStrategy: sizes, schedule names and stage specs and their refusals (no
processes), then PP2xDP2 and PP2 on real CPU processes over gloo, equal to one process, and checkpoints moving
between a pipeline mesh and no pipeline, both ways.

Three launches serve the multi-process tests (shared with the other model-parallel test files,
tests/distributed/model_parallel_launches.py): 4 ranks train PP2xDP2 with 1F1B (validating through the pipeline,
saving a checkpoint mid-epoch), with GPipe, with gradient clipping, a Fleet loop PP2xDP2 (fleet.save mid-epoch),
PP2xTP2, PP2xDP2 with two stages per rank under Interleaved1F1B (validating, saving mid-epoch) and LoopedBFS, then
microbatches that do not divide the batch (refused); 1 rank resumes the PP2xDP2 checkpoint without pipeline
parallelism and writes a 1x1-mesh checkpoint, a Fleet loop without pipeline saves its own and resumes the Fleet
PP2xDP2 one, and the interleaved checkpoint resumes; 2 ranks resume the 1x1 one as PP2 and the Fleet one in a Fleet
PP2 loop, train PP2 interleaved with clipping, then shard the whole Module under interleaved (refused). The reference is the same
Module trained in this process with the global batch.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from tests.distributed.scripts import model_parallel_train as mp_script
from tests.distributed.scripts import pipeline_train as script
from tests.distributed.sharded_helpers import assert_close
from torchfleet.connector import resolve
from torchfleet.errors import ConfigurationError, MisconfiguredModuleError
from torchfleet.strategies import ModelParallelStrategy, PipelineSpec
from torchfleet.strategies._pipeline import stage_children
from torchfleet.strategies.model_parallel import pipeline_mesh_sizes

ATOL = 1e-5
MSE = nn.functional.mse_loss
#: two stages on each of 2 ranks: [layers.0], [layers.1 (Tanh, no parameters)], [layers.2-3], [layers.4]


def build(devices=4, **kwargs):
    return resolve(accelerator="cpu", devices=devices, strategy=ModelParallelStrategy(**kwargs))


# ----------------------------------------------------------------------------------------- without processes
@pytest.mark.parametrize(("pp", "dp", "tp", "per_node", "nodes", "sizes"), [
    (2, "auto", "auto", 4, 1, (2, 1, 2)),
    (2, 2, 1, 4, 1, (2, 2, 1)),
    (2, "auto", 1, 4, 1, (2, 2, 1)),
    (4, "auto", "auto", 4, 1, (4, 1, 1)),
    (2, "auto", "auto", 2, 2, (2, 1, 2)),  # stages across the nodes, tensor parallel within each
])
def test_pipeline_mesh_sizes(pp, dp, tp, per_node, nodes, sizes):
    assert pipeline_mesh_sizes(pp, dp, tp, per_node, nodes) == sizes


@pytest.mark.parametrize(("pp", "dp", "tp", "per_node", "nodes", "words"), [
    (3, "auto", "auto", 4, 1, "pipeline x data x tensor parallel must equal the world size"),
    (2, 2, 2, 4, 1, "pipeline x data x tensor parallel must equal the world size"),
    (6, "auto", "auto", 2, 3, "divides neither the 3 node"),
])
def test_impossible_pipeline_meshes_are_refused(pp, dp, tp, per_node, nodes, words):
    with pytest.raises(ConfigurationError, match=words):
        pipeline_mesh_sizes(pp, dp, tp, per_node, nodes)


def test_a_pipeline_strategy_reads_its_sizes_and_the_replicas_shards(monkeypatch):
    strategy = build(devices=4, pipeline_parallel_size=2, tensor_parallel_size=1)
    assert (strategy.pipeline_parallel_size, strategy.data_parallel_size, strategy.tensor_parallel_size) == (2, 2, 1)
    assert strategy.step_backpropagates and not build(devices=4).step_backpropagates
    assert "pipeline_parallel_size=2" in repr(strategy)
    ranks = []
    for rank in range(4):
        monkeypatch.setattr(strategy.cluster_environment, "global_rank", lambda r=rank: r)
        ranks.append(strategy.distributed_sampler_kwargs)
    # ranks 0-1 are stage 0, 2-3 stage 1; ranks 0 and 2 (one replica's two stages) read the same shard
    assert ranks == [{"num_replicas": 2, "rank": r} for r in (0, 1, 0, 1)]
    assert not torch.distributed.is_initialized()


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"pipeline_schedule": "1f1b"}, r"Unknown pipeline_schedule '1f1b'\. Did you mean '1F1B'\?.*'1F1B', 'GPipe'"),
    ({"pipeline_parallel_size": 0}, r"pipeline_parallel_size=0\) is not valid: give a whole number >= 1"),
    ({"pipeline_parallel_size": "auto"}, r"pipeline_parallel_size='auto'\) is not valid"),
    ({"microbatches": 0}, r"microbatches=0\) is not valid"),
    ({"pipeline_parallel_size": 2, "save_distributed_checkpoint": False}, "saves distributed checkpoints only"),
])
def test_bad_pipeline_arguments_say_what_is_accepted(kwargs, words):
    with pytest.raises(ConfigurationError, match=words):
        ModelParallelStrategy(**kwargs)


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"pipeline_parallel_size": 2, "stages_per_rank": 2},
     r"pipeline_schedule='1F1B'\) runs one stage per rank, but stages_per_rank=2: give pipeline_schedule="),
    ({"pipeline_parallel_size": 2, "pipeline_schedule": "GPipe", "stages_per_rank": 2}, "runs one stage per rank"),
    ({"stages_per_rank": 0}, r"stages_per_rank=0\) is not valid"),
    # torch's interleaved schedule: max(1, 5 // 2) = 2 rounds, which 5 microbatches do not fill evenly
    ({"pipeline_parallel_size": 2, "pipeline_schedule": "Interleaved1F1B", "stages_per_rank": 2, "microbatches": 5},
     r"= 2 rounds of equal size, which 5 microbatches do not make\. Give a multiple of pipeline_parallel_size"),
    ({"pipeline_parallel_size": 4, "microbatches": 3}, r"Schedule1F1B needs at least as many microbatches as stages"),
])
def test_impossible_schedules_are_refused_before_any_process(kwargs, words):
    with pytest.raises(ConfigurationError, match=words):
        ModelParallelStrategy(**kwargs)


@pytest.mark.parametrize(("schedule", "microbatches"), [("Interleaved1F1B", 1), ("Interleaved1F1B", 6),
                                                        ("Interleaved1F1B", 10), ("LoopedBFS", 5)])
def test_microbatches_the_multi_stage_schedules_take(schedule, microbatches):
    strategy = ModelParallelStrategy(pipeline_parallel_size=4, pipeline_schedule=schedule, stages_per_rank=2,
                                     microbatches=microbatches)
    assert strategy.pipeline_stages is None  # the stages exist once a Module is split
    assert script.Stack().pipeline_stages is None  # outside a run


def test_stage_children_split_the_sequential_at_the_points():
    model = script.Stack()
    assert stage_children(model, model.configure_pipeline(), 2) == ("layers", [["0", "1"], ["2", "3", "4"]])
    spec = PipelineSpec(["layers.1", "layers.4"], MSE)
    assert stage_children(model, spec, 3) == ("layers", [["0"], ["1", "2", "3"], ["4"]])


class WithHead(script.Stack):
    def __init__(self):
        super().__init__()
        self.head = nn.Linear(1, 1)


@pytest.mark.parametrize(("model", "spec", "stages", "words"), [
    (script.Stack(), None, 2, "returned NoneType, but pipeline_parallel_size=2 needs"),
    (script.Stack(), PipelineSpec(["layers.2"], MSE), 3, "needs 2 of them"),
    (script.Stack(), PipelineSpec(["layers.2"], MSE), (4, 2), r"pipeline_parallel_size=2 x stages_per_rank=2 needs 3"),
    (script.Stack(), PipelineSpec(["layers.2", "layers.0.weight"], MSE), 3, "a child of the same nn.Sequential"),
    (script.Stack(), PipelineSpec(["layers.3", "layers.2"], MSE), 3, "in increasing order"),
    (script.Stack(), PipelineSpec(["layers.0"], MSE), 2, "other than the first"),
    (WithHead(), PipelineSpec(["layers.2"], MSE), 2, r"parameters outside layers \(head.weight, head.bias\)"),
])
def test_bad_stage_specs_are_refused(model, spec, stages, words):
    with pytest.raises(MisconfiguredModuleError, match=words):
        stage_children(model, spec, *(stages if isinstance(stages, tuple) else (stages,)))


# ----------------------------------------------------------------------------------------- on 4, 1 and 2 processes
@pytest.fixture(scope="module")
def runs(four_process_runs, one_process_runs, two_process_runs) -> dict:
    """This file's runs (tests/distributed/model_parallel_launches.py), from the launches the session shares."""
    part = "pipeline"
    return {**four_process_runs[part], **one_process_runs[part], **two_process_runs[part]}


def reference(clip: float | None = None) -> dict:
    import torchfleet as tf

    tf.seed_everything(0)
    losses = script.Losses()
    model, trainer, train, val = script.build({"strategy": "single_device", "clip": clip, "validate": True}, 1,
                                              [losses])
    trainer.fit(model, train, val)
    x, y = script.make_data()[:script.EVAL_SAMPLES]
    with torch.no_grad():
        eval_loss = float(MSE(model(x), y))  # the final weights' loss on the Fleet runs' evaluation samples
    metrics = trainer.callback_metrics
    return {"weights": {k: v.detach().clone() for k, v in model.state_dict().items()}, "losses": losses.losses,
            "global_step": trainer.global_step, "train_loss": float(metrics["train_loss"]),
            "val_loss": float(metrics["val_loss"]), "eval_loss": eval_loss}


@pytest.fixture(scope="module")
def ref() -> dict:
    return reference()


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("name", ["pp2dp2", "pp2dp2_gpipe"])
def test_pp2_dp2_equals_one_process(runs, ref, name):
    got = runs[name]
    assert_close(got["weights"], ref["weights"], ATOL)
    assert got["global_step"] == ref["global_step"] == mp_script.STEPS
    assert got["mesh"] == (("pipeline_parallel", "data_parallel", "tensor_parallel"), (2, 2, 1))
    # each stage holds its own layers, under the names they have without pipeline parallelism
    stage0, stage1 = ["layers.0.bias", "layers.0.weight"], ["layers.2.bias", "layers.2.weight", "layers.4.bias",
                                                           "layers.4.weight"]
    assert got["names"] == [stage0, stage0, stage1, stage1]
    # the loss callbacks see is the replica's (sent from its last stage): the same on both stages of a replica
    # (ranks 0 and 2), the two replicas' mean the global batch's; the logged one is synchronised
    losses = got["losses"]
    assert losses[0] == losses[2] and losses[1] == losses[3] and losses[0] != losses[1]
    assert [(a + b) / 2 for a, b in zip(losses[0], losses[1])] == pytest.approx(ref["losses"], abs=ATOL)
    assert got["train_loss"] == pytest.approx(ref["train_loss"], abs=ATOL)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("name", ["pp2dp2_interleaved", "pp2dp2_bfs"])
def test_two_stages_per_rank_equal_one_process(runs, ref, name):
    got = runs[name]
    assert_close(got["weights"], ref["weights"], ATOL)
    assert got["global_step"] == ref["global_step"] == mp_script.STEPS
    # rank r of a replica holds stages r and r + 2: layers 0 and 2 (stages 0, 2), layer 4 (stage 3; stage 1 is a Tanh)
    first, last = ["layers.0.bias", "layers.0.weight", "layers.2.bias", "layers.2.weight"], ["layers.4.bias",
                                                                                             "layers.4.weight"]
    assert got["names"] == [first, first, last, last]
    losses = got["losses"]
    # the last stage (3) is on pipeline rank 1 (global ranks 2, 3), which sends the loss to its replica's rank 0 or 1
    assert losses[0] == losses[2] and losses[1] == losses[3] and losses[0] != losses[1]
    assert [(a + b) / 2 for a, b in zip(losses[0], losses[1])] == pytest.approx(ref["losses"], abs=ATOL)
    # LoopedBFS's Module logs no training loss: its broadcast overlapped the optimizer step, and the callbacks still
    # saw each step's loss on every rank (above); interleaved logs it (synchronised), so it waited at once
    assert got["loss_deferred"] is (name == "pp2dp2_bfs")


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("name", ["pp2dp2", "pp2_from_1x1", "pp2dp2_interleaved"])
def test_validation_runs_through_the_pipeline(runs, ref, name):
    # the schedule's forward-only step, its loss sent from the last stage and logged with sync_dist on every rank
    assert ref["val_loss"] > 0
    assert runs[name]["val_loss"] == pytest.approx(ref["val_loss"], abs=ATOL)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("name", ["fleet_pp2dp2", "fleet_single", "fleet_pp2_from_single"])
def test_fleet_pipelines_and_its_checkpoints_move_to_and_from_pipeline_stages(runs, ref, name):
    # fleet_pp2dp2 saves mid-epoch and resumes its own checkpoint in a fresh model; fleet_single (no pipeline)
    # resumes fleet_pp2dp2's, fleet_pp2_from_single (PP2) fleet_single's
    got = runs[name]
    assert_close(got["weights"], ref["weights"], ATOL)
    assert got["global_step"] == mp_script.STEPS
    losses = got["losses"]
    replicas = [losses[0], losses[1]] if name == "fleet_pp2dp2" else [losses[0]]
    assert [sum(step) / len(step) for step in zip(*replicas)] == pytest.approx(ref["losses"], abs=ATOL)
    if name != "fleet_single":  # pipeline_step's loss is the same on each stage's rank
        assert losses[-1] == replicas[-1]
        assert got["names"][0] != got["names"][-1]  # and each stage holds its own layers
    # the forward-only step under torch.no_grad(): the final weights' loss
    assert got["val_loss"] == pytest.approx(ref["eval_loss"], abs=ATOL)


@pytest.mark.distributed
@pytest.mark.slow
def test_pp2_tp2_equals_one_process(runs, ref):
    got = runs["pp2tp2"]
    assert got["mesh"] == (("pipeline_parallel", "data_parallel", "tensor_parallel"), (2, 1, 2))
    assert_close(got["weights"], ref["weights"], ATOL)
    # one replica: its global batch's loss on every rank (both stages, both tensor-parallel ranks of each)
    assert got["losses"][0] == got["losses"][3]
    assert got["losses"][0] == pytest.approx(ref["losses"], abs=ATOL)


@pytest.mark.distributed
@pytest.mark.slow
def test_gradient_clipping_takes_the_norm_over_every_stage(runs, ref):
    clipped = reference(clip=0.05)
    assert max((clipped["weights"][k] - ref["weights"][k]).abs().max().item() for k in ref["weights"]) > 1e-3
    assert_close(runs["pp2dp2_clip"]["weights"], clipped["weights"], ATOL)
    # two stages on each of 2 ranks (PP2, no data parallel): the norm over all four stages
    assert_close(runs["pp2_interleaved_clip"]["weights"], clipped["weights"], ATOL)


@pytest.mark.distributed
@pytest.mark.slow
@pytest.mark.parametrize("name", ["single_from_pp2dp2", "pp2_from_1x1", "single_from_interleaved"])
def test_a_pipeline_checkpoint_resumes_without_pipeline_and_the_reverse(runs, ref, name):
    got = runs[name]
    assert_close(got["weights"], ref["weights"], ATOL)
    assert got["global_step"] == mp_script.STEPS
    assert len(got["losses"][0]) == mp_script.STEPS - mp_script.SAVE_AT  # resumed mid-epoch, not restarted
    assert_close(runs["mesh_1x1"]["weights"], ref["weights"], ATOL)


@pytest.mark.distributed
@pytest.mark.slow
def test_refusals_of_a_running_pipeline(runs):
    assert "A training batch of 4 samples does not split into microbatches=3" in runs["uneven_microbatches"]["error"]
    assert "fully_shard must shard each stage whole" in runs["interleaved_whole_module_sharded"]["error"]


def test_predict_and_a_pipeline_step_without_a_pipeline_are_refused():
    strategy = build(devices=4, pipeline_parallel_size=2, tensor_parallel_size=1)
    with pytest.raises(ConfigurationError, match="pipeline_step.*no model was split"):
        strategy.pipeline_step(script.Stack(), (torch.zeros(4, 8), torch.zeros(4, 1)))
    strategy._pipeline = script.Stack()  # any object: the refusal comes before the pipeline is used
    with pytest.raises(ConfigurationError, match="runs training, validation and test steps only: predict_step"):
        strategy.step_function(script.Stack(), "predict_step")
