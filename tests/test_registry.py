"""StrategyRegistry: registration (the seed docs' custom-CheckpointIO example), lookup, removal, entry points."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch

from tests.helpers import RegressionData, Regressor, quiet
from torchfleet import Trainer
from torchfleet.checkpoint import CheckpointIO, TorchCheckpointIO
from torchfleet.errors import ConfigurationError
from torchfleet.strategies import SingleDeviceStrategy, Strategy, StrategyRegistry


class RecordingCheckpointIO(CheckpointIO):
    """A custom CheckpointIO recording every call."""

    def __init__(self):
        self.saved, self.loaded = [], []
        self._inner = TorchCheckpointIO()

    def save_checkpoint(self, checkpoint, path, storage_options=None):
        self.saved.append(str(path))
        self._inner.save_checkpoint(checkpoint, path, storage_options)

    def load_checkpoint(self, path, map_location=None):
        self.loaded.append(str(path))
        return self._inner.load_checkpoint(path, map_location)


@pytest.fixture
def registered():
    names = []

    def register(name, *args, **kwargs):
        StrategyRegistry.register(name, *args, **kwargs)
        names.append(name)

    yield register
    for name in names:
        if name in StrategyRegistry.available():
            StrategyRegistry.remove(name)


def test_register_with_custom_checkpoint_io_then_train_by_name(registered, tmp_path):
    io = RecordingCheckpointIO()
    registered("single_custom_io", SingleDeviceStrategy, description="one device, custom checkpoint io", checkpoint_io=io)
    trainer = Trainer(strategy="single_custom_io", max_epochs=1, **quiet())
    assert trainer.strategy.checkpoint_io is io
    trainer.fit(Regressor(), datamodule=RegressionData())
    trainer.save_checkpoint(tmp_path / "x.ckpt")
    assert io.saved == [str(tmp_path / "x.ckpt")]
    Trainer(strategy="single_custom_io", max_epochs=2, **quiet()).fit(
        Regressor(), datamodule=RegressionData(), ckpt_path=tmp_path / "x.ckpt"
    )
    assert io.loaded == [str(tmp_path / "x.ckpt")]


def test_get_builds_fresh_instances_with_init_params(registered):
    registered("cpu_one", SingleDeviceStrategy, description="d", device="cpu")
    a, b = StrategyRegistry.get("cpu_one"), StrategyRegistry.get("cpu_one")
    assert a is not b and isinstance(a, SingleDeviceStrategy)
    assert a.root_device == torch.device("cpu")
    entry = StrategyRegistry.entry("cpu_one")
    assert entry.description == "d" and entry.init_params == {"device": "cpu"}


def test_available_and_remove(registered):
    registered("temp_strategy", SingleDeviceStrategy)
    assert "temp_strategy" in StrategyRegistry.available_strategies()
    assert "single_device" in StrategyRegistry.available_strategies()
    StrategyRegistry.remove("temp_strategy")
    assert "temp_strategy" not in StrategyRegistry.available_strategies()
    with pytest.raises(ConfigurationError, match="Unknown strategy 'temp_strategy'"):
        StrategyRegistry.remove("temp_strategy")


def test_duplicate_registration_needs_override(registered):
    registered("dup_strategy", SingleDeviceStrategy)
    with pytest.raises(ConfigurationError, match="already registered"):
        StrategyRegistry.register("dup_strategy", SingleDeviceStrategy)
    StrategyRegistry.register("dup_strategy", SingleDeviceStrategy, description="new", override=True)
    assert StrategyRegistry.entry("dup_strategy").description == "new"


def test_register_rejects_non_strategies():
    with pytest.raises(ConfigurationError, match="subclass of Strategy"):
        StrategyRegistry.register("not_a_strategy", dict)
    with pytest.raises(ConfigurationError, match="needs a class"):
        StrategyRegistry.register("instance", SingleDeviceStrategy())


def test_register_as_decorator(registered):
    @StrategyRegistry.register("decorated_strategy", description="via decorator")
    class Decorated(SingleDeviceStrategy):
        pass

    registered_names = StrategyRegistry.available()
    assert "decorated_strategy" in registered_names
    assert isinstance(StrategyRegistry.get("decorated_strategy"), Decorated)
    StrategyRegistry.remove("decorated_strategy")


def test_unknown_name_lists_closest():
    with pytest.raises(ConfigurationError, match=r"Unknown strategy 'single_devcie'.*Did you mean 'single_device'"):
        StrategyRegistry.get("single_devcie")
    with pytest.raises(ConfigurationError, match="Did you mean 'single_device'"):
        Trainer(strategy="singledevice")


def test_entry_point_strategies_load_on_first_miss(tmp_path, monkeypatch):
    """A package on sys.path declaring the entry-point group registers its strategy on first lookup."""
    pkg = tmp_path / "tf_plugin_pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text(textwrap.dedent("""
        from torchfleet.strategies import SingleDeviceStrategy

        class PluginStrategy(SingleDeviceStrategy):
            '''A strategy shipped by a third-party package.'''

        def register(registry):
            registry.register("plugin_by_hook", PluginStrategy, description="registered by a hook")
    """))
    dist = tmp_path / "tf_plugin_pkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tf-plugin-pkg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[torchfleet.strategies]\nplugin_class = tf_plugin_pkg:PluginStrategy\nplugin_hook = tf_plugin_pkg:register\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(StrategyRegistry, "_entry_points_loaded", False)
    try:
        strategy = StrategyRegistry.get("plugin_class")
        assert type(strategy).__name__ == "PluginStrategy"
        assert "plugin_by_hook" in StrategyRegistry
        assert StrategyRegistry.entry("plugin_class").description.startswith("A strategy shipped")
        trainer = Trainer(strategy="plugin_by_hook", **quiet())
        assert type(trainer.strategy).__name__ == "PluginStrategy"
    finally:
        for name in ("plugin_class", "plugin_by_hook"):
            if name in StrategyRegistry.available():
                StrategyRegistry.remove(name)
        sys.modules.pop("tf_plugin_pkg", None)


def test_strategy_objects_are_strategies():
    assert issubclass(SingleDeviceStrategy, Strategy)


def test_registries_read_like_lightnings_dicts():
    from torchfleet.accelerators import AcceleratorRegistry, CPUAccelerator
    from torchfleet.strategies import DeepSpeedStrategy

    entry = StrategyRegistry["deepspeed_stage_2_offload"]
    assert entry["strategy"] is DeepSpeedStrategy
    assert entry["init_params"] == {"stage": 2, "offload_optimizer": True}
    assert "offloaded" in entry["description"]
    entry["init_params"]["stage"] = 3  # a copy: the registry keeps building stage 2
    assert StrategyRegistry.get("deepspeed_stage_2_offload").zero_stage == 2
    assert AcceleratorRegistry["cpu"]["accelerator"] is CPUAccelerator
    assert list(StrategyRegistry) == StrategyRegistry.keys() == StrategyRegistry.available()
    assert "ddp_spawn" in list(StrategyRegistry)
    with pytest.raises(ConfigurationError, match="Unknown strategy 'dpp'. Did you mean .*'ddp'"):
        StrategyRegistry["dpp"]
