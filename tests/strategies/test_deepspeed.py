"""DeepSpeedStrategy without processes: the config mapping, "auto" filling, registered names, bad input.

Building the strategy only checks that deepspeed is installed; nothing here imports it or starts
processes (those tests are in tests/distributed/test_deepspeed.py).
"""

from __future__ import annotations

import json
import logging
import re
import sys

import pytest
import torch

from torchfleet.errors import CheckpointError, ConfigurationError
from torchfleet.strategies import StrategyRegistry
from torchfleet.strategies import _deepspeed_config as dsc
from torchfleet.strategies.deepspeed import DeepSpeedStrategy, deepspeed_available

needs_deepspeed = pytest.mark.skipif(not deepspeed_available(), reason="deepspeed is not installed (the 'deepspeed' extra)")

# every seed-doc parameter that lands in the config: (argument, a non-default value, where it lands)
MAPPING = [
    ("stage", 3, ("zero_optimization", "stage")),
    ("contiguous_gradients", False, ("zero_optimization", "contiguous_gradients")),
    ("overlap_comm", False, ("zero_optimization", "overlap_comm")),
    ("allgather_partitions", False, ("zero_optimization", "allgather_partitions")),
    ("reduce_scatter", False, ("zero_optimization", "reduce_scatter")),
    ("allgather_bucket_size", 123, ("zero_optimization", "allgather_bucket_size")),
    ("reduce_bucket_size", 456, ("zero_optimization", "reduce_bucket_size")),
    ("sub_group_size", 789, ("zero_optimization", "sub_group_size")),
    ("offload_optimizer_device", "nvme", ("zero_optimization", "offload_optimizer", "device")),
    ("optimizer_buffer_count", 7, ("zero_optimization", "offload_optimizer", "buffer_count")),
    ("pin_memory", True, ("zero_optimization", "offload_optimizer", "pin_memory")),
    ("offload_params_device", "nvme", ("zero_optimization", "offload_param", "device")),
    ("params_buffer_count", 9, ("zero_optimization", "offload_param", "buffer_count")),
    ("params_buffer_size", 1000, ("zero_optimization", "offload_param", "buffer_size")),
    ("max_in_cpu", 2000, ("zero_optimization", "offload_param", "max_in_cpu")),
    ("block_size", 4096, ("aio", "block_size")),
    ("queue_depth", 3, ("aio", "queue_depth")),
    ("single_submit", True, ("aio", "single_submit")),
    ("overlap_events", False, ("aio", "overlap_events")),
    ("thread_count", 4, ("aio", "thread_count")),
    ("zero_allow_untested_optimizer", False, ("zero_allow_untested_optimizer",)),
    ("logging_batch_size_per_gpu", 6, ("train_micro_batch_size_per_gpu",)),
    ("loss_scale", 128.0, ("fp16", "loss_scale")),
    ("initial_scale_power", 8, ("fp16", "initial_scale_power")),
    ("loss_scale_window", 50, ("fp16", "loss_scale_window")),
    ("hysteresis", 5, ("fp16", "hysteresis")),
    ("min_loss_scale", 2, ("fp16", "min_loss_scale")),
    ("partition_activations", True, ("activation_checkpointing", "partition_activations")),
    ("cpu_checkpointing", True, ("activation_checkpointing", "cpu_checkpointing")),
    ("contiguous_memory_optimization", True, ("activation_checkpointing", "contiguous_memory_optimization")),
    ("synchronize_checkpoint_boundary", True, ("activation_checkpointing", "synchronize_checkpoint_boundary")),
]


def _at(config: dict, path: tuple) -> object:
    for key in path:
        config = config[key]
    return config


@needs_deepspeed
def test_every_parameter_lands_at_its_deepspeed_key(tmp_path):
    kwargs = {name: value for name, value, _ in MAPPING}
    strategy = DeepSpeedStrategy(offload_optimizer=True, offload_parameters=True, nvme_path=str(tmp_path),
                                 logging_level=logging.ERROR, remote_device="cpu", load_full_weights=True,
                                 process_group_backend="gloo", **kwargs)
    config = strategy.config
    for name, value, path in MAPPING:
        assert _at(config, path) == value, name
    for section in ("offload_optimizer", "offload_param"):
        assert config["zero_optimization"][section]["nvme_path"] == str(tmp_path)
    # the parameters that are not DeepSpeed config keys are kept on the strategy
    assert (strategy.logging_level, strategy.remote_device, strategy.load_full_weights) == (logging.ERROR, "cpu", True)
    assert strategy.process_group_backend == "gloo"
    # our own default: a torch optimizer may be used with offloading
    assert config["zero_force_ds_cpu_optimizer"] is False


@needs_deepspeed
def test_the_seed_parameter_list_is_the_signature():
    import inspect

    params = set(inspect.signature(DeepSpeedStrategy).parameters)
    seed = {"accelerator", "zero_optimization", "stage", "remote_device", "offload_optimizer", "offload_parameters",
            "offload_params_device", "nvme_path", "params_buffer_count", "params_buffer_size", "max_in_cpu",
            "offload_optimizer_device", "optimizer_buffer_count", "block_size", "queue_depth", "single_submit",
            "overlap_events", "thread_count", "pin_memory", "sub_group_size", "contiguous_gradients", "overlap_comm",
            "allgather_partitions", "reduce_scatter", "allgather_bucket_size", "reduce_bucket_size",
            "zero_allow_untested_optimizer", "logging_batch_size_per_gpu", "config", "logging_level",
            "parallel_devices", "cluster_environment", "loss_scale", "initial_scale_power", "loss_scale_window",
            "hysteresis", "min_loss_scale", "partition_activations", "cpu_checkpointing",
            "contiguous_memory_optimization", "synchronize_checkpoint_boundary", "load_full_weights",
            "precision_plugin", "process_group_backend"}
    # precision= is precision_plugin's torchfleet name; timeout, start_method and max_restarts are DDPStrategy's;
    # keep_sharded is torchfleet's (the module is made whole when a stage ends unless it is True)
    assert seed - params == set()
    assert params - seed == {"precision", "timeout", "start_method", "max_restarts", "keep_sharded"}


@needs_deepspeed
def test_keep_sharded_is_a_flag():
    assert DeepSpeedStrategy().keep_sharded is False and DeepSpeedStrategy(keep_sharded=True).keep_sharded is True
    with pytest.raises(ConfigurationError, match=r"DeepSpeedStrategy\(keep_sharded='yes'\) is not valid: give False"):
        DeepSpeedStrategy(keep_sharded="yes")


@needs_deepspeed
def test_defaults_leave_what_the_trainer_knows_auto():
    config = DeepSpeedStrategy().config
    assert config["train_micro_batch_size_per_gpu"] == "auto"
    assert config["gradient_accumulation_steps"] == "auto"
    assert config["gradient_clipping"] == "auto"
    assert config["fp16"]["enabled"] == "auto" and config["bf16"]["enabled"] == "auto"
    assert config["zero_optimization"]["stage"] == 2
    assert "offload_optimizer" not in config["zero_optimization"]
    assert "zero_optimization" not in DeepSpeedStrategy(zero_optimization=False).config


@needs_deepspeed
@pytest.mark.parametrize("as_file", [False, True])
def test_user_config_wins_over_the_arguments(tmp_path, as_file):
    user = {"zero_optimization": {"stage": 1}, "train_micro_batch_size_per_gpu": 3, "gradient_clipping": 0.5}
    given = user
    if as_file:
        given = tmp_path / "ds.json"
        given.write_text(json.dumps(user))
    strategy = DeepSpeedStrategy(stage=3, overlap_comm=False, config=given)
    assert strategy.config == user  # the constructor's defaults are not mixed in
    assert strategy.zero_stage == 1
    if not as_file:
        user["zero_optimization"]["stage"] = 2
        assert strategy.zero_stage == 1, "the strategy keeps its own copy"


def _fill(config, **kw):
    args = dict(micro_batch_size=4, accumulate_grad_batches=2, gradient_clip_val=1.5, gradient_clip_algorithm="norm",
                precision_name="bf16-mixed")
    args.update(kw)
    return dsc.fill_auto(config, **args)


@needs_deepspeed
def test_auto_values_are_filled_from_the_trainer():
    template = DeepSpeedStrategy().config
    filled, half = _fill(template)
    assert filled["train_micro_batch_size_per_gpu"] == 4
    assert filled["gradient_accumulation_steps"] == 2
    assert filled["gradient_clipping"] == 1.5
    assert filled["bf16"]["enabled"] is True and filled["fp16"]["enabled"] is False and half == "bf16"
    assert "auto" not in json.dumps(filled)
    assert template["gradient_clipping"] == "auto", "filling works on a copy"
    filled, half = _fill(template, precision_name="16-mixed", gradient_clip_val=None)
    assert (filled["fp16"]["enabled"], filled["bf16"]["enabled"], half) == (True, False, "fp16")
    assert filled["gradient_clipping"] == 0.0
    filled, half = _fill(template, precision_name="32-true")
    assert (filled["fp16"]["enabled"], filled["bf16"]["enabled"], half) == (False, False, None)


def test_user_values_are_kept_and_missing_ones_filled():
    # a user config without the Trainer-known keys gets them; values it states stay
    filled, half = _fill({"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 0.1}, precision_name="32-true")
    assert filled == {"train_micro_batch_size_per_gpu": 8, "gradient_clipping": 0.1, "gradient_accumulation_steps": 2}
    assert half is None
    # train_batch_size alone: DeepSpeed derives the micro batch from it
    filled, _ = _fill({"train_batch_size": 16}, precision_name="32-true")
    assert "train_micro_batch_size_per_gpu" not in filled and filled["train_batch_size"] == 16
    # bf16 enabled in the config with the Trainer's default precision: the config's choice holds
    filled, half = _fill({"bf16": {"enabled": True}}, precision_name="32-true")
    assert half == "bf16" and filled["bf16"]["enabled"] is True


@pytest.mark.parametrize(("config", "kw", "words"), [
    ({"gradient_accumulation_steps": 4}, {}, "accumulate_grad_batches"),
    ({"fp16": {"enabled": True}}, {"precision_name": "bf16-mixed"}, "enables fp16"),
    ({"fp16": {"enabled": True}, "bf16": {"enabled": True}}, {"precision_name": "32-true"}, "both fp16 and bf16"),
    ({}, {"precision_name": "64-true"}, "64-true"),
    ({}, {"gradient_clip_algorithm": "value"}, "norm only"),
])
def test_contradictions_with_the_trainer_are_errors(config, kw, words):
    with pytest.raises(ConfigurationError, match=words):
        _fill(config, **kw)


@needs_deepspeed
@pytest.mark.parametrize(("name", "stage", "offload_optimizer", "offload_param"), [
    ("deepspeed", 2, None, None),
    ("deepspeed_stage_1", 1, None, None),
    ("deepspeed_stage_1_offload", 1, "cpu", None),
    ("deepspeed_stage_2", 2, None, None),
    ("deepspeed_stage_2_offload", 2, "cpu", None),
    ("deepspeed_stage_3", 3, None, None),
    ("deepspeed_stage_3_offload", 3, "cpu", "cpu"),
    ("deepspeed_stage_3_offload_nvme", 3, "nvme", "nvme"),
])
def test_registered_names(name, stage, offload_optimizer, offload_param, tmp_path):
    entry = StrategyRegistry.entry(name)
    assert entry.cls is DeepSpeedStrategy and entry.description
    overrides = {"nvme_path": str(tmp_path)} if name.endswith("nvme") else {}
    strategy = StrategyRegistry.get(name, **overrides)
    zero = strategy.config["zero_optimization"]
    assert zero["stage"] == stage == strategy.zero_stage
    assert zero.get("offload_optimizer", {}).get("device") == offload_optimizer
    assert zero.get("offload_param", {}).get("device") == offload_param
    if name.endswith("nvme"):
        assert strategy.remote_device == "nvme"


# ------------------------------------------------------------------ bad input
@needs_deepspeed
@pytest.mark.parametrize("stage", [4, -1, True, "2", 2.5])
def test_stage_outside_0_to_3(stage):
    with pytest.raises(ConfigurationError, match="is not a ZeRO stage"):
        DeepSpeedStrategy(stage=stage)


@needs_deepspeed
def test_stage_outside_0_to_3_in_a_user_config():
    with pytest.raises(ConfigurationError, match="stage=5 is not a ZeRO stage"):
        DeepSpeedStrategy(config={"zero_optimization": {"stage": 5}})


@needs_deepspeed
def test_nvme_offload_needs_an_existing_nvme_path(tmp_path):
    missing = tmp_path / "no_such_dir"
    with pytest.raises(ConfigurationError, match="not an existing directory"):
        DeepSpeedStrategy(stage=3, offload_parameters=True, offload_params_device="nvme", nvme_path=str(missing))
    with pytest.raises(ConfigurationError, match="not an existing directory"):
        DeepSpeedStrategy(offload_optimizer=True, offload_optimizer_device="nvme", nvme_path=str(missing))
    with pytest.raises(ConfigurationError, match="not an existing directory"):
        DeepSpeedStrategy(config={"zero_optimization": {"stage": 3, "offload_param": {"device": "nvme"}}})
    # the registered name uses the seed docs' default /local_nvme
    import os

    if not os.path.isdir("/local_nvme"):
        with pytest.raises(ConfigurationError, match="/local_nvme"):
            StrategyRegistry.get("deepspeed_stage_3_offload_nvme")
    # an existing directory is accepted
    DeepSpeedStrategy(offload_optimizer=True, offload_optimizer_device="nvme", nvme_path=str(tmp_path))


@needs_deepspeed
def test_config_path_that_does_not_exist(tmp_path):
    with pytest.raises(ConfigurationError, match="does not exist"):
        DeepSpeedStrategy(config=str(tmp_path / "missing.json"))
    with pytest.raises(ConfigurationError, match="is a directory"):
        DeepSpeedStrategy(config=tmp_path)


@needs_deepspeed
@pytest.mark.parametrize(("text", "words"), [("{stage: 2,", "not valid JSON"), ("[1, 2]", "JSON list, not an object")])
def test_config_file_that_is_not_a_json_object(tmp_path, text, words):
    path = tmp_path / "ds.json"
    path.write_text(text)
    with pytest.raises(ConfigurationError, match=words):
        DeepSpeedStrategy(config=path)


@needs_deepspeed
@pytest.mark.parametrize(("kwargs", "words"), [
    ({"config": 3}, "as a dict or as the path"),
    ({"stage": 2, "offload_parameters": True}, "needs stage=3"),
    ({"offload_optimizer": True, "offload_optimizer_device": "gpu"}, "'cpu'"),
    ({"zero_optimization": False, "offload_optimizer": True}, "zero_optimization=False"),
    ({"logging_batch_size_per_gpu": 0}, "logging_batch_size_per_gpu"),
    ({"remote_device": "cuda"}, "remote_device"),
])
def test_other_bad_arguments(kwargs, words):
    with pytest.raises(ConfigurationError, match=words):
        DeepSpeedStrategy(**kwargs)


# ------------------------------------------------------------------ the typed options behind the arguments
def _expected_config(**zero_extra: object) -> dict:
    """The DeepSpeed config of the seed docs' defaults, written out (the zero_optimization section extended)."""
    return {
        "train_micro_batch_size_per_gpu": "auto",
        "gradient_accumulation_steps": "auto",
        "gradient_clipping": "auto",
        "zero_allow_untested_optimizer": True,
        "zero_force_ds_cpu_optimizer": False,
        "fp16": {"enabled": "auto", "loss_scale": 0, "initial_scale_power": 16, "loss_scale_window": 1000,
                 "hysteresis": 2, "min_loss_scale": 1},
        "bf16": {"enabled": "auto"},
        "aio": {"block_size": 1_048_576, "queue_depth": 8, "single_submit": False, "overlap_events": True,
                "thread_count": 1},
        "activation_checkpointing": {"partition_activations": False, "cpu_checkpointing": False,
                                     "contiguous_memory_optimization": False, "synchronize_checkpoint_boundary": False},
        "zero_optimization": {"stage": 2, "contiguous_gradients": True, "overlap_comm": True,
                              "allgather_partitions": True, "reduce_scatter": True,
                              "allgather_bucket_size": 200_000_000, "reduce_bucket_size": 200_000_000,
                              "sub_group_size": 1_000_000_000_000, **zero_extra},
    }


def test_default_options_give_the_seed_config():
    assert dsc.DeepSpeedOptions().to_config() == _expected_config()
    no_zero = _expected_config()
    del no_zero["zero_optimization"]
    assert dsc.DeepSpeedOptions(zero_optimization=False).to_config() == no_zero


def test_offload_to_nvme_options_give_their_config():
    options = dsc.DeepSpeedOptions(stage=3, offload_optimizer=True, offload_parameters=True,
                                   offload_optimizer_device="nvme", offload_params_device="nvme", nvme_path="/fast",
                                   pin_memory=True, optimizer_buffer_count=3, params_buffer_count=6,
                                   logging_batch_size_per_gpu=4, loss_scale=128.0)
    expected = _expected_config(
        offload_optimizer={"device": "nvme", "nvme_path": "/fast", "buffer_count": 3, "pin_memory": True},
        offload_param={"device": "nvme", "nvme_path": "/fast", "buffer_count": 6, "buffer_size": 100_000_000,
                       "max_in_cpu": 1_000_000_000, "pin_memory": True},
    )
    expected["zero_optimization"]["stage"] = 3
    expected["train_micro_batch_size_per_gpu"] = 4
    expected["fp16"]["loss_scale"] = 128.0
    assert options.to_config() == expected


@needs_deepspeed
def test_the_options_are_the_constructors_config_keywords_with_its_defaults():
    import dataclasses
    import inspect

    params = inspect.signature(DeepSpeedStrategy).parameters
    for f in dataclasses.fields(dsc.DeepSpeedOptions):
        assert f.name in params and params[f.name].default == f.default, f.name
    assert DeepSpeedStrategy().config == _expected_config()


@pytest.mark.parametrize(("name", "value"), [
    ("overlap_comm", 1),  # a bool given an int
    ("zero_optimization", 0),
    ("pin_memory", "yes"),
    ("reduce_bucket_size", True),  # an int given a bool
    ("params_buffer_count", False),
    ("thread_count", 1.5),
    ("allgather_bucket_size", -1),  # sizes and counts below DeepSpeed's minimum
    ("params_buffer_size", -5),
    ("max_in_cpu", -1),
    ("optimizer_buffer_count", -1),
    ("reduce_bucket_size", 0),
    ("block_size", 0),
    ("offload_optimizer_device", "gpu"),  # not an offload device
    ("offload_params_device", "disk"),
    ("logging_batch_size_per_gpu", "Auto"),  # "auto" or an int >= 1
    ("logging_batch_size_per_gpu", 0),
    ("logging_batch_size_per_gpu", 2.0),
    ("logging_batch_size_per_gpu", True),
    ("stage", 4),
    ("stage", -1),
    ("stage", True),
    ("stage", "2"),
    ("loss_scale", -1.0),
    ("loss_scale", float("nan")),
    ("loss_scale", "1"),
    ("nvme_path", 3),
])
def test_a_bad_option_names_the_parameter_and_what_it_accepts(name, value):
    with pytest.raises(ConfigurationError, match=rf"^{re.escape(f'{name}={value!r}')} .*\. Accepted: ") as info:
        dsc.DeepSpeedOptions(**{name: value})
    assert "\n" not in str(info.value)
    if deepspeed_available():
        with pytest.raises(ConfigurationError, match=rf"^{re.escape(f'{name}={value!r}')}"):
            DeepSpeedStrategy(**{name: value})


@pytest.mark.parametrize(("name", "value", "words"), [
    ("overlap_comm", 1, "(type int) is not valid. Accepted: True or False."),
    ("reduce_bucket_size", True, "(type bool) is not valid. Accepted: an int >= 1."),
    ("max_in_cpu", -1, "is not valid. Accepted: an int >= 0."),
    ("offload_optimizer_device", "gpu", "is not a place DeepSpeed can offload to. Accepted: 'cpu' or 'nvme'"),
    ("logging_batch_size_per_gpu", "Auto", "Accepted: an int >= 1, or 'auto'"),
    ("stage", 4, "is not a ZeRO stage. Accepted: an int from 0 to 3"),
])
def test_the_error_says_what_is_accepted(name, value, words):
    with pytest.raises(ConfigurationError, match=re.escape(words)):
        dsc.DeepSpeedOptions(**{name: value})


def test_values_of_the_declared_types_are_accepted(tmp_path):
    for options in (dsc.DeepSpeedOptions(logging_batch_size_per_gpu=1), dsc.DeepSpeedOptions(loss_scale=0),
                    dsc.DeepSpeedOptions(loss_scale=2.5), dsc.DeepSpeedOptions(nvme_path=tmp_path),
                    dsc.DeepSpeedOptions(stage=0, allgather_bucket_size=0, params_buffer_count=0)):
        assert options.to_config()
    with pytest.raises(AttributeError):
        dsc.DeepSpeedOptions().stage = 3  # frozen


@needs_deepspeed
def test_keywords_are_checked_also_beside_a_given_config():
    with pytest.raises(ConfigurationError, match="overlap_comm=1"):
        DeepSpeedStrategy(config={"zero_optimization": {"stage": 1}}, overlap_comm=1)


def test_deepspeed_not_installed(monkeypatch):
    import torchfleet as tf
    from torchfleet.checkpoint.deepspeed import consolidate_deepspeed

    monkeypatch.setitem(sys.modules, "deepspeed", None)  # what `import deepspeed` sees when it is not installed
    for name in [n for n in StrategyRegistry.available() if n.startswith("deepspeed")]:
        with pytest.raises(ConfigurationError, match=r'pip install "torchfleet\[deepspeed\]"'):
            StrategyRegistry.get(name)
    with pytest.raises(ConfigurationError, match=r'pip install "torchfleet\[deepspeed\]"'):
        tf.Trainer(strategy="deepspeed_stage_2", accelerator="cpu", devices=2, logger=False)
    with pytest.raises(ConfigurationError, match=r'pip install "torchfleet\[deepspeed\]"'):
        DeepSpeedStrategy()
    with pytest.raises(ConfigurationError, match=r'pip install "torchfleet\[deepspeed\]"'):
        consolidate_deepspeed("does-not-matter")


@needs_deepspeed
def test_things_deepspeed_cannot_do_say_so():
    strategy = DeepSpeedStrategy()
    with pytest.raises(ConfigurationError, match="by their norm"):
        strategy.clip_gradients_value(None, None, 1.0)
    with pytest.raises(ConfigurationError, match="setup"):
        strategy.run_backward(None, None)
    with pytest.raises(ConfigurationError, match="storage_options"):
        strategy.save_checkpoint({}, "x.ckpt", storage_options={"a": 1})
    with pytest.raises(CheckpointError, match="own checkpoints"):
        strategy.load_optimizer_state(None, {"state": {}, "param_groups": []})


# ---------------------------------------------------------------------------- DeepSpeed's accelerator follows ours
@pytest.fixture
def restore_deepspeed_accelerator():
    """Put back whatever accelerator DeepSpeed held before the test."""
    from deepspeed.accelerator import real_accelerator

    before = real_accelerator.ds_accelerator
    yield real_accelerator
    real_accelerator.ds_accelerator = before


@needs_deepspeed
@pytest.mark.parametrize(("device", "name"), [("cpu", "cpu"), ("cuda:1", "cuda"), ("cuda", "cuda"), ("mps", "mps")])
def test_our_devices_name_deepspeeds_accelerators(device, name):
    from torchfleet.strategies._deepspeed_accelerator import deepspeed_accelerator_name

    assert deepspeed_accelerator_name(torch.device(device)) == name


@needs_deepspeed
def test_a_device_deepspeed_cannot_use_is_refused():
    from torchfleet.strategies._deepspeed_accelerator import deepspeed_accelerator_name

    with pytest.raises(ConfigurationError, match="cannot train on 'meta' devices.*cpu, cuda, mps"):
        deepspeed_accelerator_name(torch.device("meta"))


@needs_deepspeed
def test_cpu_replaces_the_cuda_accelerator_deepspeed_chose_by_itself(restore_deepspeed_accelerator):
    """What a GPU host does: DeepSpeed picks CUDA on import; accelerator='cpu' must take it back."""
    from deepspeed.accelerator.cuda_accelerator import CUDA_Accelerator

    from torchfleet.strategies._deepspeed_accelerator import select_deepspeed_accelerator

    real = restore_deepspeed_accelerator
    real.set_accelerator(CUDA_Accelerator())
    chosen = select_deepspeed_accelerator(torch.device("cpu"))
    assert chosen.device_name() == "cpu" and real.get_accelerator() is chosen
    assert type(chosen).__name__ == "CPU_Accelerator"
    # already the right one: kept, not rebuilt
    assert select_deepspeed_accelerator(torch.device("cpu")) is chosen
    assert select_deepspeed_accelerator(torch.device("cuda", 1)).device_name() == "cuda"
    assert type(real.get_accelerator()).__name__ == "CUDA_Accelerator"


@needs_deepspeed
def test_a_cuda_trainer_selects_deepspeeds_cuda_accelerator(restore_deepspeed_accelerator, monkeypatch):
    """With 2 CUDA devices (the count patched), rank 1 trains on cuda:1 and DeepSpeed gets index 1."""
    import torchfleet as tf
    from torchfleet.strategies._deepspeed_accelerator import device_rank, select_deepspeed_accelerator

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    trainer = tf.Trainer(strategy="deepspeed_stage_2", accelerator="cuda", devices=2, logger=False)
    strategy = trainer.strategy
    assert [d.type for d in strategy.parallel_devices] == ["cuda", "cuda"]
    device = strategy.parallel_devices[1]
    assert select_deepspeed_accelerator(device).device_name() == "cuda"
    assert device_rank(device, local_rank=1) == 1
    cpu = tf.Trainer(strategy="deepspeed_stage_2", accelerator="cpu", devices=2, logger=False).strategy
    assert [d.type for d in cpu.parallel_devices] == ["cpu", "cpu"]
    assert select_deepspeed_accelerator(cpu.root_device).device_name() == "cpu"
    # DeepSpeed's CPU accelerator ignores the index; a negative one would make the engine think it runs alone
    assert device_rank(cpu.parallel_devices[1], local_rank=1) == 1


@needs_deepspeed
def test_a_stage_0_checkpoint_into_zero_is_refused_with_what_works(tmp_path):
    """Checked from the checkpoint's record before the engine is touched (a stand-in strategy is enough)."""
    from types import SimpleNamespace

    from torchfleet.checkpoint.deepspeed import InEngine
    from torchfleet.strategies._deepspeed_checkpoint import load_engine_checkpoint

    checkpoint = {"state_dict": InEngine("module", str(tmp_path)),
                  "deepspeed": {"tag": "checkpoint", "world_size": 2, "zero_stage": 0}}
    strategy = SimpleNamespace(engine=SimpleNamespace(optimizer=object()), zero_stage=2, world_size=1)
    with pytest.raises(CheckpointError, match="without ZeRO.*stage 2.*torchfleet consolidate"):
        load_engine_checkpoint(strategy, checkpoint, with_optimizer=True)
