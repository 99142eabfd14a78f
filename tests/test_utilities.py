"""``torchfleet.utilities`` under Lightning's module paths: what public Lightning programs import from
``lightning.pytorch.utilities``, each behaving as Lightning's (compared with Lightning where it is installed)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from tests.helpers import Regressor, loader, quiet
from tests.lightning_reference import finish, needs_lightning, run_here, start_in_lightning
from torchfleet import Trainer
from torchfleet.errors import ConfigurationError
from torchfleet.utilities import CombinedLoader, grad_norm, rank_zero_only


def test_every_path_lightning_examples_import():
    from torchfleet.utilities import rank_zero_info  # noqa: F401
    from torchfleet.utilities.exceptions import MisconfigurationException
    from torchfleet.utilities.imports import _OMEGACONF_AVAILABLE, _RICH_AVAILABLE, _TORCHVISION_AVAILABLE
    from torchfleet.utilities.model_helpers import get_torchvision_model, is_overridden  # noqa: F401
    from torchfleet.utilities.model_summary import ModelSummary, summarize  # noqa: F401
    from torchfleet.utilities.rank_zero import WarningCache, rank_zero_deprecation, rank_zero_warn  # noqa: F401
    from torchfleet.utilities.seed import isolate_rng, seed_everything  # noqa: F401
    from torchfleet.utilities.types import (  # noqa: F401
        EVAL_DATALOADERS,
        STEP_OUTPUT,
        TRAIN_DATALOADERS,
        LRSchedulerConfig,
        OptimizerLRScheduler,
    )

    assert rank_zero_only is __import__("torchfleet.rank_zero").rank_zero.rank_zero_only
    for flag in (_OMEGACONF_AVAILABLE, _RICH_AVAILABLE, _TORCHVISION_AVAILABLE):
        assert isinstance(flag, bool)
    with pytest.raises(MisconfigurationException):  # every argument error torchfleet raises
        Trainer(max_epochs=-5, **quiet())


def _importable(name: str) -> bool:
    try:
        __import__(name)
    except ImportError:
        return False
    return True


@pytest.mark.parametrize("flag,package", [("_TENSORBOARD_AVAILABLE", "tensorboard"), ("_RICH_AVAILABLE", "rich"),
                                          ("_TORCHVISION_AVAILABLE", "torchvision"), ("_NUMPY_AVAILABLE", "numpy")])
def test_availability_flags_say_whether_the_package_imports(flag, package):
    import torchfleet.utilities.imports as imports

    assert getattr(imports, flag) == _importable(package)


def test_the_flags_import_no_optional_package():
    code = ("import sys, torchfleet.utilities.imports as i; "
            "print(sorted(m for m in ('tensorboard', 'rich', 'omegaconf', 'torchmetrics', 'jsonargparse') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True).stdout
    assert out.strip() == "[]"


def test_version_flags_compare_releases():
    from torchfleet.utilities.imports import _release, version_at_least

    assert _release("2.13.0+cpu") == (2, 13, 0) and _release("1.0.0rc1") == (1, 0, 0)
    assert version_at_least("torch", "2.6") and not version_at_least("torch", "99.0")
    assert not version_at_least("no-such-distribution-here", "0.0")


# ---------------------------------------------------------------------------- CombinedLoader
def _iterables():
    return {"a": DataLoader(range(6), batch_size=4), "b": DataLoader(range(15), batch_size=5)}


def _values(batch):
    return None if batch is None else batch.tolist()


def test_combined_loader_modes():
    a0, a1 = [0, 1, 2, 3], [4, 5]
    b0, b1, b2 = [0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 11, 12, 13, 14]
    want = {
        "min_size": [({"a": a0, "b": b0}, 0, 0), ({"a": a1, "b": b1}, 1, 0)],
        "max_size_cycle": [({"a": a0, "b": b0}, 0, 0), ({"a": a1, "b": b1}, 1, 0), ({"a": a0, "b": b2}, 2, 0)],
        "max_size": [({"a": a0, "b": b0}, 0, 0), ({"a": a1, "b": b1}, 1, 0), ({"a": None, "b": b2}, 2, 0)],
        "sequential": [(a0, 0, 0), (a1, 1, 0), (b0, 0, 1), (b1, 1, 1), (b2, 2, 1)],
    }
    for mode, expected in want.items():
        combined = CombinedLoader(_iterables(), mode)
        got = [({k: _values(v) for k, v in batch.items()} if isinstance(batch, dict) else _values(batch), i, j)
               for batch, i, j in combined]
        assert got == expected, mode
        assert len(combined) == len(expected), mode
    lists = CombinedLoader([DataLoader(range(4), batch_size=2), DataLoader(range(2), batch_size=2)])
    assert [[b.tolist() for b in batch] for batch, _, _ in lists] == [[[0, 1], [0, 1]]]
    with pytest.raises(ConfigurationError, match="'min_size', 'max_size_cycle', 'max_size', 'sequential'"):
        CombinedLoader(_iterables(), "longest")


def test_combined_loader_limits_and_flattened():
    combined = CombinedLoader(_iterables(), "sequential")
    combined.limits = [1, 2]
    assert [(_values(b), i, j) for b, i, j in combined] == [([0, 1, 2, 3], 0, 0), ([0, 1, 2, 3, 4], 0, 1),
                                                           ([5, 6, 7, 8, 9], 1, 1)]
    assert len(combined) == 3
    combined.flattened = [DataLoader(range(2)), DataLoader(range(1))]
    assert list(combined.iterables) == ["a", "b"] and len(combined.iterables["a"]) == 2
    with pytest.raises(ConfigurationError):
        combined.flattened = [DataLoader(range(2))]


@needs_lightning
def test_combined_loader_equals_lightnings():
    code = """
        from torch.utils.data import DataLoader
        from {module} import CombinedLoader
        for mode in ("min_size", "max_size_cycle", "max_size", "sequential"):
            for its in ({{"a": DataLoader(range(7), batch_size=2), "b": [DataLoader(range(3)), DataLoader(range(5), batch_size=3)]}},
                        [DataLoader(range(4), batch_size=3), DataLoader(range(9), batch_size=4)]):
                c = CombinedLoader(its, mode)
                rows = [repr(x) for x in c]
                print(mode, len(c), rows)
    """
    lightning = start_in_lightning(code.format(module="lightning.pytorch.utilities.combined_loader"))
    ours = run_here(__import__("textwrap").dedent(code.format(module="torchfleet.utilities.combined_loader")))
    lightning = finish(lightning)
    assert ours == lightning and ours.count("\n") == 8


class TwoLoaders(Regressor):
    def __init__(self):
        super().__init__()
        self.seen = []

    def training_step(self, batch, batch_idx):
        self.seen.append({k: len(v[0]) for k, v in batch.items()})
        return super().training_step(batch["big"], batch_idx)

    def validation_step(self, batch, batch_idx, dataloader_idx=0):
        self.seen.append(("val", dataloader_idx, len(batch[0])))


def test_fit_takes_a_dict_of_loaders_and_a_sequential_combined_loader():
    model = TwoLoaders()
    trainer = Trainer(**quiet(max_epochs=1))
    val = CombinedLoader([loader(8, batch_size=4), loader(6, batch_size=6)], "sequential")
    trainer.fit(model, {"big": loader(32, batch_size=8), "small": loader(8, batch_size=4)}, val)
    # max_size_cycle: 4 steps, the 2-batch loader restarted; then each validation loader in turn
    assert model.seen == [{"big": 8, "small": 4}] * 4 + [("val", 0, 4), ("val", 0, 4), ("val", 1, 6)]
    assert trainer.num_training_batches == 4 and set(trainer.train_dataloader) == {"big", "small"}


def test_fit_refuses_sequential_and_predict_refuses_other_modes():
    trainer = Trainer(**quiet(max_epochs=1))
    with pytest.raises(ConfigurationError, match="sequential"):
        trainer.fit(Regressor(), CombinedLoader([loader(8)], "sequential"))
    with pytest.raises(ConfigurationError, match="sequential"):
        trainer.predict(Regressor(), CombinedLoader([loader(8)], "min_size"))


def test_evaluation_with_a_combining_mode_gets_the_combined_batch():
    class Both(Regressor):
        def validation_step(self, batch, batch_idx):
            (x1, y1), (x2, y2) = batch
            self.log("val_loss", nn.functional.mse_loss(self(x1), y1) + nn.functional.mse_loss(self(x2), y2))

    model = Both()
    (result,) = Trainer(**quiet()).validate(model, CombinedLoader([loader(16), loader(16, seed=1)], "min_size"))
    with torch.no_grad():  # two batches of 8 from each loader, paired
        sums = [nn.functional.mse_loss(model(x1), y1) + nn.functional.mse_loss(model(x2), y2)
                for (x1, y1), (x2, y2) in zip(loader(16), loader(16, seed=1))]
    assert result["val_loss"] == pytest.approx(float(sum(sums) / 2), rel=1e-6)


# ---------------------------------------------------------------------------- grad_norm, is_overridden, summary
def test_grad_norm():
    layer = nn.Linear(2, 1)
    layer.weight.grad = torch.tensor([[3.0, 4.0]])
    layer.bias.grad = torch.tensor([12.0])
    norms = grad_norm(layer, 2)
    assert set(norms) == {"grad_2.0_norm/weight", "grad_2.0_norm/bias", "grad_2.0_norm_total"}
    assert norms["grad_2.0_norm/weight"].item() == 5.0 and norms["grad_2.0_norm_total"].item() == 13.0
    assert grad_norm(layer, "inf")["grad_inf_norm_total"].item() == 12.0
    with pytest.raises(ConfigurationError, match="positive number"):
        grad_norm(layer, 0)


def test_is_overridden():
    from torchfleet import Callback, DataModule, Module
    from torchfleet.utilities.model_helpers import is_overridden

    class Hooked(Callback):
        def on_fit_start(self, trainer, module):
            pass

    assert is_overridden("training_step", Regressor()) and not is_overridden("on_fit_start", Regressor())
    assert is_overridden("on_fit_start", Hooked()) and not is_overridden("on_fit_end", Hooked())
    assert not is_overridden("setup", DataModule()) and is_overridden("training_step", Regressor(), parent=Module)
    assert not is_overridden("training_step", None)
    with pytest.raises(ConfigurationError, match="parent="):
        is_overridden("forward", nn.Linear(1, 1))


_SUMMARY_PROGRAM = """
import torch
from torch import nn
from {demos} import BoringModel
from {summary} import ModelSummary, summarize

class Model(BoringModel):
    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Linear(32, 3000), nn.BatchNorm1d(3000), nn.Linear(3000, 32))
        self.extra = nn.Parameter(torch.zeros(5))
        self.net[1].eval()

    def forward(self, x):
        return self.layer(self.net(x))

model = Model()
for example in (None, torch.zeros(4, 32)):
    model.example_input_array = example
    for depth in (1, -1, 0):
        print(ModelSummary(model, depth))
s = summarize(model, max_depth=2)
print(s.layer_names, s.param_nums, s.total_parameters, s.trainable_parameters, s.in_sizes, s.total_flops)
"""


@needs_lightning
def test_model_summary_table_equals_lightnings():
    lightning = start_in_lightning(_SUMMARY_PROGRAM.format(demos="lightning.pytorch.demos.boring_classes",
                                                           summary="lightning.pytorch.utilities.model_summary"))
    ours = run_here(_SUMMARY_PROGRAM.format(demos="torchfleet.demos", summary="torchfleet.utilities.model_summary"))
    lightning = finish(lightning)
    assert ours == lightning and "Total Flops" in ours


def test_model_summary_counts():
    from torchfleet.utilities.model_summary import ModelSummary, get_human_readable_count

    model = nn.Sequential(nn.Linear(4, 3), nn.Sequential(nn.Linear(3, 2)))
    model[0].weight.requires_grad_(False)
    summary = ModelSummary(model, max_depth=-1)
    assert summary.layer_names == ["0", "1", "1.0"] and summary.param_nums == [15, 8, 8]
    assert summary.total_parameters == 23 and summary.trainable_parameters == 11
    assert summary.model_size == pytest.approx(23 * 4 / 1e6)
    assert ModelSummary(model, max_depth=1).layer_names == ["0", "1"] and ModelSummary(model, 0).layer_names == []
    assert [get_human_readable_count(n) for n in (123, 1234, 2e6, 4e14)] == ["123  ", "1.2 K", "2.0 M", "400 T"]
    with pytest.raises(ConfigurationError, match="max_depth"):
        ModelSummary(model, max_depth=-2)
