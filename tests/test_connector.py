"""connector.resolve: every argument error is raised at Trainer/Fleet construction; choices are right."""

from __future__ import annotations

import pytest
import torch

from torchfleet.checkpoint import TorchCheckpointIO
from torchfleet.connector import resolve
from torchfleet.environments import LocalEnvironment
from torchfleet.errors import ConfigurationError
from torchfleet.precision import Precision, precision_for
from torchfleet.strategies import SingleDeviceStrategy


@pytest.fixture
def four_gpus(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 4)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True, raising=False)


@pytest.fixture
def no_gpu(monkeypatch):
    """A machine without CUDA or MPS, whatever this one has."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)


def test_auto_on_cpu_is_single_device(no_gpu):
    s = resolve()
    assert isinstance(s, SingleDeviceStrategy)
    assert s.root_device == torch.device("cpu")
    assert s.precision.name == "32-true"
    assert isinstance(s.checkpoint_io, TorchCheckpointIO)
    assert s.accelerator.name == "cpu"


def test_auto_prefers_cuda_when_present(four_gpus):
    s = resolve(devices=1)
    assert s.accelerator.name == "cuda" and s.root_device == torch.device("cuda", 0)
    assert not torch.cuda.is_initialized()


def test_gpu_device_selection_without_initialising_cuda(four_gpus):
    s = resolve(accelerator="gpu", devices="2,")
    assert s.root_device == torch.device("cuda", 2) and s.device_ids == [2]
    s = resolve(accelerator="cuda", devices=[3])
    assert s.root_device == torch.device("cuda", 3)
    assert not torch.cuda.is_initialized()


def test_gpu_requested_where_none_exists(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    with pytest.raises(ConfigurationError, match="(?i)no .*gpu|cuda.*not available"):
        resolve(accelerator="gpu")
    with pytest.raises(ConfigurationError, match="(?i)cuda"):
        resolve(accelerator="cuda")


def test_gpu_id_beyond_count(four_gpus):
    with pytest.raises(ConfigurationError, match="4"):
        resolve(accelerator="cuda", devices=[5])


def test_auto_picks_ddp_for_several_processes_and_says_why(caplog, monkeypatch):
    import torchfleet.connector as connector
    from torchfleet.strategies import DDPStrategy

    monkeypatch.setattr(connector, "_AUTO_CHOICES_LOGGED", set())
    with caplog.at_level("INFO", logger="torchfleet.connector"):
        s = resolve(accelerator="cpu", devices=2)
        resolve(accelerator="cpu", devices=2)
    assert isinstance(s, DDPStrategy) and s.start_method == "popen" and s.world_size == 2
    chosen = [r.getMessage() for r in caplog.records if "chose 'ddp'" in r.getMessage()]
    assert len(chosen) == 1 and "2 cpu process(es)" in chosen[0]  # logged once, with the reason


def test_auto_picks_ddp_fork_in_an_interactive_session(monkeypatch):
    import sys

    monkeypatch.setattr(sys, "ps1", ">>> ", raising=False)
    s = resolve(accelerator="cpu", devices=2)
    assert s.start_method == "fork"


def test_single_device_with_two_devices_is_refused():
    with pytest.raises(ConfigurationError, match="single_device"):
        resolve(strategy="single_device", accelerator="cpu", devices=2)


def test_unknown_names_suggest_the_closest():
    with pytest.raises(ConfigurationError, match="single_device"):
        resolve(strategy="singel_device")
    with pytest.raises(ConfigurationError, match="'cuda'"):
        resolve(accelerator="cdua")
    with pytest.raises(ConfigurationError, match="bf16-mixed"):
        resolve(precision="bf16mixed")


def test_precision_aliases_are_normalised():
    assert resolve(precision=64).precision.name == "64-true"
    assert resolve(precision="32").precision.name == "32-true"
    assert resolve(precision="bf16").precision.name == "bf16-mixed"
    assert resolve(precision="bf16-true").precision.name == "bf16-true"


@pytest.mark.parametrize("num_nodes", [0, -1, 1.5, "2", True])
def test_bad_num_nodes(num_nodes):
    with pytest.raises(ConfigurationError, match="num_nodes"):
        resolve(num_nodes=num_nodes)


def test_plugins_fill_parts_and_duplicates_fail():
    io = TorchCheckpointIO()
    env = LocalEnvironment()
    prec = precision_for("bf16-mixed", "cpu")
    s = resolve(plugins=[io, prec, env])
    assert s.checkpoint_io is io and s.precision is prec
    with pytest.raises(ConfigurationError, match="two checkpoint_io plugins"):
        resolve(plugins=[TorchCheckpointIO(), TorchCheckpointIO()])
    with pytest.raises(ConfigurationError, match="two precision plugins"):
        resolve(plugins=[Precision(), Precision()])
    with pytest.raises(ConfigurationError, match="not a plugin"):
        resolve(plugins=["fast"])
    with pytest.raises(ConfigurationError, match="both given"):
        resolve(precision="bf16-mixed", plugins=[Precision()])


def test_strategy_object_parts_win_and_conflicts_fail():
    io = TorchCheckpointIO()
    strategy = SingleDeviceStrategy(checkpoint_io=io)
    assert resolve(strategy=strategy).checkpoint_io is io
    with pytest.raises(ConfigurationError, match="already has a checkpoint_io"):
        resolve(strategy=SingleDeviceStrategy(checkpoint_io=io), plugins=[TorchCheckpointIO()])
    with pytest.raises(ConfigurationError, match="disagrees"):
        resolve(strategy=SingleDeviceStrategy(precision=precision_for("64-true", "cpu")), precision="bf16-mixed")


def test_strategy_argument_type_checked():
    with pytest.raises(ConfigurationError, match="registered name"):
        resolve(strategy=3)


def test_resolve_builds_fresh_strategies():
    assert resolve() is not resolve()


def test_auto_devices_use_every_gpu_with_ddp(four_gpus):
    from torchfleet.strategies import DDPStrategy

    s = resolve()
    assert isinstance(s, DDPStrategy)
    assert s.parallel_devices == [torch.device("cuda", i) for i in range(4)]
    assert s.process_group_backend == "nccl"


def test_a_strategy_built_for_the_cpu_stays_there_on_a_gpu_machine(four_gpus):
    s = resolve(strategy=SingleDeviceStrategy(device="cpu"))
    assert s.accelerator.name == "cpu" and s.root_device == torch.device("cpu")
    assert s.precision.name == "32-true"
    s = resolve(strategy=SingleDeviceStrategy(device="cuda:1"), devices=1)
    assert s.accelerator.name == "cuda" and s.root_device == torch.device("cuda", 1)
    # without a device of its own the strategy takes the machine's best one, as before
    assert resolve(strategy=SingleDeviceStrategy(), devices=1).accelerator.name == "cuda"
    assert not torch.cuda.is_initialized()


@pytest.fixture
def only_mps(monkeypatch):
    """A Mac: one MPS device, no CUDA."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)


@pytest.mark.parametrize("accelerator", ["mps", "gpu", "auto"])
@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn", "ddp_fork", "fsdp", "deepspeed"])
def test_process_group_strategies_are_refused_on_mps(only_mps, accelerator, strategy):
    from torchfleet.strategies import StrategyRegistry

    with pytest.raises(ConfigurationError, match=r"no backend for MPS devices.*accelerator='cpu'"):
        resolve(accelerator=accelerator, strategy=strategy)
    with pytest.raises(ConfigurationError, match="not supported on the MPS accelerator"):
        resolve(accelerator=accelerator, strategy=StrategyRegistry.get(strategy))
    # the same strategies run on the CPU of that machine, and the Mac's GPU trains in one process
    assert resolve(accelerator="cpu", strategy=strategy, devices=2).root_device.type == "cpu"
    assert resolve(accelerator=accelerator).root_device.type == "mps"


def test_strategy_names_are_matched_in_lower_case_after_an_exact_match():
    assert type(resolve(accelerator="cpu", strategy="DDP_Spawn", devices=2)).__name__ == "DDPStrategy"
    assert resolve(accelerator="cpu", strategy="DDP_Spawn", devices=2).start_method == "spawn"
    with pytest.raises(ConfigurationError, match="Unknown strategy 'DPP'. Did you mean 'ddp'"):
        resolve(accelerator="cpu", strategy="DPP")


def test_hang_timeout_is_given_to_the_strategy_it_resolves_a_declared_attribute_of_every_strategy():
    from torchfleet.strategies import Strategy
    from torchfleet.watchdog import DEFAULT_HANG_TIMEOUT_S

    assert "hang_timeout" in vars(Strategy)  # declared on the base class: nobody probes for it
    assert resolve(accelerator="cpu", strategy="ddp", devices=2).hang_timeout == DEFAULT_HANG_TIMEOUT_S
    assert resolve(accelerator="cpu", strategy="ddp", devices=2, hang_timeout=7.0).hang_timeout == 7.0
    assert resolve(accelerator="cpu", strategy="ddp_spawn", devices=2, hang_timeout=None).hang_timeout is None
    # a strategy object of one's own (a subclass of one device, as third-party strategies are) receives it as well
    given = SingleDeviceStrategy()
    assert resolve(strategy=given, hang_timeout=12.5) is given and given.hang_timeout == 12.5
