"""What a ported Lightning program catches about bad ``devices`` and device-type conflicts: Lightning's exception
types and the order of its checks, each still one paragraph of ours (what was given, what is accepted)."""

from __future__ import annotations

import pytest
import torch

from torchfleet import Trainer
from torchfleet.accelerators import CPUAccelerator
from torchfleet.connector import resolve
from torchfleet.errors import ConfigurationError, DevicesTypeError
from torchfleet.strategies import DDPStrategy, SingleDeviceStrategy


@pytest.mark.parametrize("devices", [["0"], [0, "1"], ["GPU"], [["0", "1"], [0, 1]], [False], 1.5, True])
def test_a_devices_value_of_the_wrong_type_is_both_a_type_error_and_ours(cuda_count, devices):
    cuda_count(2)
    with pytest.raises(TypeError, match="must be an int, a string, a sequence of ints, but you passed") as info:
        Trainer(accelerator="gpu", devices=devices)
    assert isinstance(info.value, ConfigurationError) and isinstance(info.value, DevicesTypeError)
    assert f"devices={devices!r} is not valid for cuda" in str(info.value) and "Accepted:" in str(info.value)


def test_a_wrong_value_of_the_right_type_stays_a_value_error(cuda_count):
    cuda_count(2)
    with pytest.raises(ConfigurationError) as info:
        Trainer(accelerator="gpu", devices=[0, 0])
    assert not isinstance(info.value, TypeError) and "listed twice" in str(info.value)


@pytest.mark.parametrize("accelerator", ["cuda", "mps", "tpu", "gpu"])
@pytest.mark.parametrize("devices", ["0", 0, [], ()])
def test_no_device_is_named_before_an_accelerator_this_machine_lacks(cuda_count, mps, accelerator, devices):
    with pytest.raises(ConfigurationError) as info:
        resolve(accelerator=accelerator, devices=devices)
    text = str(info.value)
    assert f"`Trainer(devices={devices!r})` value is not a valid input using {accelerator} accelerator" in text
    assert "asks for no device" in text and "Give a number of devices >= 1" in text


def test_without_a_zero_the_missing_accelerator_is_still_named(cuda_count):
    with pytest.raises(ConfigurationError, match="accelerator='cuda' was requested, but cuda is not available"):
        resolve(accelerator="cuda", devices=1)


def test_an_accelerator_object_is_named_by_its_class():
    with pytest.raises(ConfigurationError, match="value is not a valid input using cpu accelerator"):
        resolve(accelerator=CPUAccelerator(), devices=0)


@pytest.mark.parametrize(("parallel_devices", "accelerator", "kind"), [
    ([torch.device("cpu")], "cuda", "CPU"),
    ([torch.device("cuda", i) for i in range(8)], "tpu", "GPU"),
    ([torch.device("cuda", 0)], "cpu", "GPU"),
])
def test_a_strategy_built_for_one_device_type_and_an_accelerator_for_another(parallel_devices, accelerator, kind):
    with pytest.raises(ConfigurationError) as info:
        resolve(strategy=DDPStrategy(parallel_devices=parallel_devices), accelerator=accelerator)
    text = str(info.value)
    assert f"{kind} parallel_devices set through DDPStrategy class" in text
    assert f"accelerator={accelerator!r}" in text and "Choose one device type" in text


def test_agreeing_device_types_are_accepted():
    strategy = resolve(strategy=DDPStrategy(parallel_devices=[torch.device("cpu")] * 2), accelerator="cpu")
    assert strategy.num_processes == 2
    single = resolve(strategy=SingleDeviceStrategy(device="cpu"), accelerator="cpu")
    assert single.root_device == torch.device("cpu")
    with pytest.raises(ConfigurationError, match="SingleDeviceStrategy was built for cpu devices"):
        resolve(strategy=SingleDeviceStrategy(device="cpu"), accelerator="cuda")


@pytest.mark.parametrize("devices", ["0", 0, []])
def test_no_device_on_a_machine_that_has_the_gpu_says_lightnings_phrase_too(cuda_count, devices):
    cuda_count(2)
    with pytest.raises(ConfigurationError) as info:
        resolve(accelerator="cuda", devices=devices)
    assert f"`Trainer(devices={devices!r})` value is not a valid input using cuda accelerator" in str(info.value)
    assert f"devices={devices!r} is not valid for cuda" in str(info.value)
