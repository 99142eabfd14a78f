"""The ``devices`` table: every accepted form and every refused one, as pure functions of a device count."""

from __future__ import annotations

import pytest

from torchfleet.accelerators.devices import parse_cpu_processes, parse_gpu_ids
from torchfleet.errors import ConfigurationError


# Each row: what the user writes, and the ids the docs' table says it selects (4 devices visible).
@pytest.mark.parametrize(
    "devices, expected",
    [
        (3, [0, 1, 2]),  # int k: the first k devices
        (1, [0]),
        (4, [0, 1, 2, 3]),
        ("3", [0, 1, 2]),  # numeric string without a comma: a count, like the int
        (" 2 ", [0, 1]),
        ([1, 3], [1, 3]),  # list: exactly those ids
        ([3, 1], [3, 1]),  # in the order given
        ((0, 2), [0, 2]),
        ([0], [0]),
        ("1, 3", [1, 3]),  # comma string: those ids
        ("1,3", [1, 3]),
        ("0, 1, 2, 3", [0, 1, 2, 3]),
        ("2,", [2]),  # trailing comma: the single id 2, not two devices
        ("0,", [0]),
        (-1, [0, 1, 2, 3]),  # all devices
        ("-1", [0, 1, 2, 3]),
        ("auto", [0, 1, 2, 3]),
        ("AUTO", [0, 1, 2, 3]),
    ],
)
def test_devices_table_rows(devices, expected):
    assert parse_gpu_ids(devices, 4) == expected


def test_all_devices_follows_the_count():
    assert parse_gpu_ids(-1, 2) == [0, 1]
    assert parse_gpu_ids("auto", 1) == [0]
    assert parse_gpu_ids("-1", 8) == list(range(8))


def test_numpy_style_integers_are_accepted():
    class Index:  # what numpy ints look like to Python: __index__, not an int subclass
        def __init__(self, v: int) -> None:
            self.v = v

        def __index__(self) -> int:
            return self.v

    assert parse_gpu_ids(Index(2), 4) == [0, 1]
    assert parse_gpu_ids([Index(3)], 4) == [3]


@pytest.mark.parametrize(
    "devices, fragment",
    [
        (0, "at least one device"),
        ("0", "at least one device"),
        ([], "the list is empty"),
        ((), "the list is empty"),
        ("", "the string is empty"),
        ("   ", "the string is empty"),
        (",", "names no device"),
        (-2, "negative counts other than -1"),
        ("-3", "negative counts other than -1"),
        ([-1], "cannot be negative"),
        ("1, -2", "cannot be negative"),
        ([1, 1], "device 1 is listed twice"),
        ("2, 0, 2", "device 2 is listed twice"),
        (1.0, "a float"),
        (2.5, "a float"),
        ([1.0], "1.0 is not an int device id"),
        (True, "a bool"),
        (False, "a bool"),
        ([True], "True is not an int device id"),
        ("two", "'two' is not a device id"),
        ("1, x", "'x' is not a device id"),
        ("[1, 3]", "is not a device id"),
        ([0, "1"], "'1' is not an int device id"),
        (None, "a NoneType is not understood"),
        ({0: 1}, "a dict is not understood"),
    ],
)
def test_refused_forms_name_the_problem_and_the_accepted_forms(devices, fragment):
    with pytest.raises(ConfigurationError) as info:
        parse_gpu_ids(devices, 4)
    text = str(info.value)
    assert fragment in text
    assert f"devices={devices!r}" in text  # what was given
    assert "Accepted:" in text and "'2,'" in text and "-1" in text  # what is accepted
    assert "\n" not in text  # one paragraph


@pytest.mark.parametrize("devices, bad_id", [([3], 3), ("0, 3", 3), ("2,", 2), ([0, 5], 5)])
def test_ids_beyond_the_device_count(devices, bad_id):
    with pytest.raises(ConfigurationError) as info:
        parse_gpu_ids(devices, 2)
    text = str(info.value)
    assert f"device {bad_id}" in text
    assert "only 2 are visible" in text and "ids 0..1" in text


def test_one_visible_device_reads_as_singular():
    with pytest.raises(ConfigurationError, match=r"only 1 is visible here \(ids 0..0\)"):
        parse_gpu_ids([1], 1)


@pytest.mark.parametrize("devices", [5, "5", 100])
def test_more_devices_than_exist(devices):
    with pytest.raises(ConfigurationError) as info:
        parse_gpu_ids(devices, 4)
    text = str(info.value)
    assert f"asks for {int(devices)} cuda devices" in text
    assert "only 4 are visible" in text and "devices=4 or fewer" in text


@pytest.mark.parametrize("devices", [1, "1", 2, [0], "0,", -1, "-1", "auto"])
def test_asking_for_gpus_when_none_exist(devices):
    with pytest.raises(ConfigurationError) as info:
        parse_gpu_ids(devices, 0)
    text = str(info.value)
    assert "none is visible" in text and "accelerator='cpu'" in text


def test_kind_is_named_in_the_message():
    with pytest.raises(ConfigurationError, match="not valid for mps"):
        parse_gpu_ids(0, 1, kind="mps")
    with pytest.raises(ConfigurationError, match="asks for mps devices, but none is visible"):
        parse_gpu_ids(1, 0, kind="mps")


@pytest.mark.parametrize("devices, expected", [(1, 1), (4, 4), (64, 64), ("2", 2), (" 3 ", 3), ("auto", 1), ("Auto", 1)])
def test_cpu_process_counts(devices, expected):
    assert parse_cpu_processes(devices) == expected


@pytest.mark.parametrize(
    "devices, fragment",
    [
        (0, "at least one process"),
        ("0", "at least one process"),
        (-2, "at least one process"),
        ([0, 1], "the CPU takes a count, not device ids"),
        ([1], "the CPU takes a count, not device ids"),
        ("1, 3", "not valid for the CPU"),
        (-1, "not used on the CPU"),
        ("-1", "not used on the CPU"),
        (1.5, "not valid for the CPU"),
        (2.0, "not valid for the CPU"),
        (True, "not valid for the CPU"),
        ("x", "not valid for the CPU"),
        ("", "not valid for the CPU"),
        (None, "not valid for the CPU"),
    ],
)
def test_cpu_refused_forms(devices, fragment):
    with pytest.raises(ConfigurationError) as info:
        parse_cpu_processes(devices)
    assert fragment in str(info.value)


def test_cpu_list_error_suggests_a_count():
    with pytest.raises(ConfigurationError, match="e.g. devices=2"):
        parse_cpu_processes([0, 1])
