"""FSDPStrategy without processes: registered names, meshes, mixed precision, meta-device init, bad input.

What needs a process group (sharding, checkpoints, equivalence) is in tests/distributed/test_fsdp.py.
"""

from __future__ import annotations

import logging

import pytest
import torch
from torch import nn

from torchfleet.connector import resolve
from torchfleet.errors import ConfigurationError
from torchfleet.strategies import FSDPStrategy, StrategyRegistry
from torchfleet.strategies.fsdp import _materialize


def build(strategy="fsdp", devices=2, num_nodes=1, precision=None, **kwargs):
    if kwargs:
        strategy = FSDPStrategy(**kwargs)
    return resolve(accelerator="cpu", devices=devices, strategy=strategy, num_nodes=num_nodes, precision=precision)


@pytest.fixture
def two_nodes(monkeypatch):
    # num_nodes > 1 by hand needs the rendezvous address; nothing connects to it here
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29555")
    monkeypatch.setenv("NODE_RANK", "0")


@pytest.mark.parametrize(("name", "offload"), [("fsdp", False), ("fsdp_cpu_offload", True)])
def test_registered_names(name, offload):
    entry = StrategyRegistry.entry(name)
    assert entry.cls is FSDPStrategy and entry.description
    strategy = build(name)
    assert isinstance(strategy, FSDPStrategy) and strategy.cpu_offload is offload
    assert strategy.world_size == 2 and strategy.sharding_strategy == "FULL_SHARD"
    assert strategy.state_dict_type == "sharded"


@pytest.mark.parametrize(("kwargs", "devices", "shape"), [
    ({}, 4, (4,)),
    ({"sharding_strategy": "SHARD_GRAD_OP"}, 4, (4,)),
    ({"sharding_strategy": "NO_SHARD"}, 4, (4, 1)),
    ({"device_mesh": (2, 2)}, 4, (2, 2)),
    ({"sharding_strategy": "HYBRID_SHARD", "device_mesh": (1, 3)}, 3, (1, 3)),
])
def test_mesh_shapes(kwargs, devices, shape):
    assert build(devices=devices, **kwargs)._mesh_shape() == shape


def test_hybrid_shard_shards_within_a_node_and_replicates_across_nodes(two_nodes):
    strategy = build(devices=4, num_nodes=2, sharding_strategy="HYBRID_SHARD")
    assert strategy.world_size == 8 and strategy._mesh_shape() == (2, 4)


def test_hybrid_shard_on_one_node_says_it_is_full_shard(caplog):
    with caplog.at_level(logging.WARNING, logger="torchfleet"):
        assert build(devices=2, sharding_strategy="HYBRID_SHARD")._mesh_shape() == (1, 2)
    assert caplog.text.count("exactly as 'FULL_SHARD'") == 1


def test_a_mesh_that_does_not_fit_the_world_is_refused_before_any_process_starts(two_nodes):
    with pytest.raises(ConfigurationError, match=r"device_mesh=\(2, 3\) has 6 positions but the run has 4 processes"):
        build(devices=4, device_mesh=(2, 3))
    with pytest.raises(ConfigurationError, match=r"e\.g\. \(2, 2\)"):
        build(devices=2, num_nodes=2, device_mesh=(3, 1))


@pytest.mark.parametrize("mesh", [(2,), (2, 0), (2.0, 1), "2x1", [1, 2], (True, 2)])
def test_a_mesh_that_is_not_understood(mesh):
    with pytest.raises(ConfigurationError, match="device_mesh=.* is not understood"):
        FSDPStrategy(device_mesh=mesh)


def test_sharding_strategy_names():
    from torch.distributed.fsdp import ShardingStrategy  # FSDP1's enum: its members are accepted by name

    assert FSDPStrategy(sharding_strategy="shard_grad_op").sharding_strategy == "SHARD_GRAD_OP"
    assert FSDPStrategy(sharding_strategy=ShardingStrategy.HYBRID_SHARD).sharding_strategy == "HYBRID_SHARD"
    with pytest.raises(ConfigurationError, match="Did you mean 'FULL_SHARD'.*Accepted: 'FULL_SHARD'"):
        FSDPStrategy(sharding_strategy="FULL_SHRAD")


def test_wrap_policies():
    layer = nn.TransformerEncoderLayer(8, 2, 16)
    for policy in ({nn.TransformerEncoderLayer}, nn.TransformerEncoderLayer, [nn.TransformerEncoderLayer],
                   lambda m: isinstance(m, nn.TransformerEncoderLayer)):
        predicate = FSDPStrategy(auto_wrap_policy=policy)._wrap_policy
        assert predicate(layer) and not predicate(nn.Linear(2, 2))
    assert FSDPStrategy()._wrap_policy is None


@pytest.mark.parametrize(("kwargs", "words"), [
    ({"auto_wrap_policy": {nn.Linear, 3}}, "must hold nn.Module subclasses"),
    ({"auto_wrap_policy": set()}, "an empty set"),
    ({"auto_wrap_policy": "TransformerEncoderLayer"}, "is not understood"),
    ({"activation_checkpointing_policy": {int}}, "must hold nn.Module subclasses"),
    ({"cpu_offload": "yes"}, "give True/False or a torch.distributed.fsdp.CPUOffloadPolicy"),
    ({"mixed_precision": "bf16"}, "MixedPrecisionPolicy"),
    ({"state_dict_type": "consolidated"}, "Accepted: 'sharded'"),
    ({"keep_sharded": 1}, r"FSDPStrategy\(keep_sharded=1\) is not valid: give False"),
])
def test_bad_arguments_say_what_is_accepted(kwargs, words):
    with pytest.raises(ConfigurationError, match=words):
        FSDPStrategy(**kwargs)


def test_storage_options_are_refused_for_sharded_checkpoints(tmp_path):
    with pytest.raises(TypeError, match="state_dict_type='full'"):
        build().save_checkpoint(tmp_path / "x.ckpt", {}, storage_options={"a": 1})


@pytest.mark.parametrize(("precision", "param", "reduce"), [
    ("bf16-mixed", torch.bfloat16, torch.float32),
    ("16-mixed", torch.float16, torch.float32),
    ("32-true", None, None),
    ("bf16-true", None, None),
])
def test_mixed_precision_follows_the_trainer(precision, param, reduce):
    policy = build(precision=precision).mixed_precision_policy
    assert policy.param_dtype == param and policy.reduce_dtype == reduce


def test_an_explicit_mixed_precision_policy_wins():
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mine = MixedPrecisionPolicy(param_dtype=torch.float16)
    assert build(precision="bf16-mixed", mixed_precision=mine).mixed_precision_policy is mine


def test_cpu_offload_without_cuda_does_not_pin_memory():
    from torch.distributed.fsdp import CPUOffloadPolicy, OffloadPolicy

    policy = build("fsdp_cpu_offload")._offload_policy()
    assert isinstance(policy, CPUOffloadPolicy) and policy.pin_memory is False
    assert build(cpu_offload=CPUOffloadPolicy(pin_memory=True))._offload_policy().pin_memory is False
    assert type(build()._offload_policy()) is OffloadPolicy  # no offload


def test_init_module_with_empty_init_creates_no_memory():
    strategy = build(precision="bf16-true")
    with strategy.module_init_context(empty_init=True):
        model = nn.Linear(4096, 4096)
    assert model.weight.is_meta and model.weight.dtype == torch.bfloat16
    with strategy.module_init_context(empty_init=False):
        model = nn.Linear(4, 4)
    assert model.weight.device.type == "cpu" and model.weight.dtype == torch.bfloat16
    assert torch.get_default_dtype() == torch.float32


def test_materialising_runs_every_reset_parameters():
    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(4, 8), nn.LayerNorm(8), nn.Linear(8, 2))
    _materialize(model, torch.device("cpu"))
    assert not any(p.is_meta for p in model.parameters())
    assert model[1].weight.eq(1).all() and model[1].bias.eq(0).all()  # LayerNorm's reset_parameters
    assert model[0].weight.abs().max() <= 0.5 and model[0].weight.std() > 0  # kaiming-uniform, bound 1/sqrt(4)


def test_materialising_a_module_without_reset_parameters_names_it():
    class Scale(nn.Module):
        def __init__(self):
            super().__init__()
            self.gain = nn.Parameter(torch.ones(3))

    with torch.device("meta"):
        model = nn.Sequential(nn.Linear(3, 3), Scale())
    with pytest.raises(ConfigurationError, match=r"'1' own parameters or buffers that no reset_parameters\(\)"):
        _materialize(model, torch.device("cpu"))


def test_manual_optimisation_shards_each_child_with_parameters_and_refuses_root_parameters():
    """A backward inside training_step reduces gradients only of units called in the step (the GAN under fsdp in
    tests/distributed/test_porting.py trains as one process); parameters on the root itself are refused."""

    class Gan(nn.Module):
        def __init__(self):
            super().__init__()
            self.generator = nn.Sequential(nn.Linear(2, 2), nn.Tanh())
            self.act = nn.ReLU()  # no parameters: no unit
            self.discriminator = nn.Linear(2, 1)

    model = Gan()
    assert FSDPStrategy._manual_units(model, []) == [model.generator, model.discriminator]
    assert FSDPStrategy._manual_units(model, [model.generator]) == [model.discriminator]  # already a unit
    model.scale = nn.Parameter(torch.ones(1))
    with pytest.raises(ConfigurationError, match=r"manual optimisation under fsdp.*\(scale\).*submodule"):
        FSDPStrategy._manual_units(model, [])
