"""XLAStrategy and XLAAccelerator where torch_xla is absent (the normal suite): names, arguments, the error.

What runs on XLA devices is in tests/xla (scripts/xla_lane.sh).
"""

from __future__ import annotations

import subprocess
import sys

import pytest

from torchfleet.accelerators import AcceleratorRegistry, XLAAccelerator
from torchfleet.accelerators.xla import parse_xla_devices
from torchfleet.errors import ConfigurationError
from torchfleet.strategies import StrategyRegistry, XLAStrategy


@pytest.fixture
def without_torch_xla(monkeypatch):
    """As where torch_xla is not installed (the lane's environment has it)."""
    import torchfleet.accelerators.xla as accelerator_module
    import torchfleet.strategies.xla as strategy_module

    monkeypatch.setattr(accelerator_module, "xla_installed", lambda: False)
    monkeypatch.setattr(strategy_module, "xla_installed", lambda: False)


def test_registry_rows():
    assert StrategyRegistry.entry("xla").cls is XLAStrategy
    assert StrategyRegistry["xla"]["init_params"] == {}
    assert StrategyRegistry["xla_debug"]["init_params"] == {"debug": True}  # Lightning's alias
    assert StrategyRegistry["xla_spmd"]["init_params"] == {"mode": "spmd"}
    assert AcceleratorRegistry.entry("xla").cls is XLAAccelerator
    assert AcceleratorRegistry.entry("tpu").cls is XLAAccelerator  # Lightning's name


@pytest.mark.parametrize("kwargs", [{"strategy": "xla"}, {"strategy": "xla_spmd"}, {"strategy": "xla_debug"},
                                    {"accelerator": "tpu"}, {"accelerator": "xla", "devices": 2}])
def test_asking_without_torch_xla_gives_the_install_command(without_torch_xla, kwargs):
    from torchfleet import Trainer

    with pytest.raises(ConfigurationError) as error:
        Trainer(**kwargs)
    message = str(error.value)
    assert "pip install torch==2.9.1 torch_xla==2.9.0" in message
    assert "mode='launch'" in message and "mode='spmd'" in message  # what is supported
    assert "\n" not in message  # one paragraph


def test_accelerator_is_unavailable_without_torch_xla(without_torch_xla):
    assert XLAAccelerator.is_available() is False
    with pytest.raises(ConfigurationError, match="torch_xla"):
        XLAAccelerator()


@pytest.mark.parametrize("kwargs, match", [
    ({"mode": "ddp"}, "mode='ddp'.*'launch'.*'spmd'"),
    ({"mode": "SPMD"}, "mode='SPMD'"),
    ({"debug": "yes"}, "debug"),
    ({"sync_module_states": 1}, "sync_module_states"),
    ({"start_method": "popen"}, "start_method='popen'.*'fork'.*'spawn'"),
])
def test_arguments_are_checked_before_anything_is_imported(without_torch_xla, kwargs, match):
    with pytest.raises(ConfigurationError, match=match):
        XLAStrategy(**kwargs)


@pytest.mark.parametrize("devices, count, expected", [
    ("auto", 8, 8), (1, 8, 1), (8, 8, 8), ("8", 8, 8), ([3], 8, [3]), ("2,", 4, [2]), (2, 2, 2),
])
def test_devices_as_lightning_accepts_them(devices, count, expected):
    assert parse_xla_devices(devices, count) == expected


@pytest.mark.parametrize("devices, count", [(4, 8), (0, 8), ([8], 8), ([0, 1], 8), ("x", 8), (True, 8), (-1, 8)])
def test_other_devices_are_refused(devices, count):
    with pytest.raises(ConfigurationError, match=f"'auto', 1, {count}"):
        parse_xla_devices(devices, count)


def test_precisions_xla_runs_and_those_it_does_not():
    from torchfleet.precision import precision_for
    from torchfleet.strategies.xla import _check_precision

    for name in ("32-true", "bf16-true", "16-true"):
        _check_precision(precision_for(name, "cpu"))
    for name in ("bf16-mixed", "64-true"):
        with pytest.raises(ConfigurationError, match=f"precision='{name}' is not supported by XLAStrategy"):
            _check_precision(precision_for(name, "cpu"))


def test_torchfleet_imports_no_torch_xla():
    code = ("import sys, torchfleet, torchfleet.strategies, torchfleet.accelerators\n"
            "from torchfleet.strategies import StrategyRegistry\n"
            "StrategyRegistry.available()\n"
            "assert 'torch_xla' not in sys.modules, 'torch_xla was imported'\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
