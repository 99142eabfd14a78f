"""The small helpers that Lightning's module paths brought (docs/porting.md, "Lightning's module paths"): each does
what its Lightning name promises, through the path a ported program imports it from."""

from __future__ import annotations

import re
import warnings
from collections import namedtuple

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from torchfleet.errors import ConfigurationError


def test_move_and_convert_nested_batches():
    from torchfleet.utilities import move_data_to_device
    from torchfleet.utilities.apply_func import convert_tensors_to_scalars, convert_to_tensors

    Pair = namedtuple("Pair", "x y")
    batch = {"a": [torch.ones(2, dtype=torch.float64)], "p": Pair(torch.zeros(1), "label")}
    moved = move_data_to_device(batch, "meta")
    assert moved["a"][0].device.type == "meta" and moved["a"][0].dtype == torch.float64
    assert isinstance(moved["p"], Pair) and moved["p"].x.is_meta and moved["p"].y == "label"
    converted = convert_to_tensors({"n": 3, "f": 0.5, "b": True, "s": "x"}, "cpu")
    assert converted["n"].dtype == torch.int32 and converted["f"].dtype == torch.float32
    assert converted["b"].dtype == torch.uint8 and converted["s"] == "x"
    assert convert_tensors_to_scalars({"loss": torch.tensor(2.5), "k": [torch.tensor([7])]}) == {"loss": 2.5, "k": [7]}
    with pytest.raises(ValueError, match="3 elements"):
        convert_tensors_to_scalars(torch.ones(3))


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(range(3))


def test_data_questions():
    from torchfleet.utilities import suggested_max_num_workers
    from torchfleet.utilities.data import extract_batch_size, has_iterable_dataset, has_len, sized_len

    sized = DataLoader(TensorDataset(torch.zeros(10, 2)), batch_size=4)
    stream = DataLoader(_Stream(), batch_size=2)
    assert sized_len(sized) == 3 and has_len(sized) and not has_iterable_dataset(sized)
    assert sized_len(stream) is None and not has_len(stream) and has_iterable_dataset(stream)
    assert extract_batch_size({"x": "text", "y": [torch.zeros(5, 3)]}) == 5
    assert extract_batch_size(torch.tensor(1.0)) == 1
    with pytest.raises(ConfigurationError, match="no tensor"):
        extract_batch_size({"x": "text"})
    assert suggested_max_num_workers(1) >= 1 and suggested_max_num_workers(10_000) == 1
    with pytest.raises(ConfigurationError, match="local_world_size=0"):
        suggested_max_num_workers(0)


def test_memory_helpers():
    from torchfleet.utilities.memory import is_oom_error, recursive_detach

    assert is_oom_error(RuntimeError("CUDA error: out of memory"))
    assert is_oom_error(RuntimeError("[enforce fail] DefaultCPUAllocator: can't allocate memory: you tried 10 GB"))
    assert not is_oom_error(RuntimeError("shape mismatch")) and not is_oom_error(ValueError("CUDA out of memory"))
    x = torch.ones(2, requires_grad=True)
    out = recursive_detach({"loss": x * 2, "parts": [x + 1, "note"]})
    assert not out["loss"].requires_grad and not out["parts"][0].requires_grad and out["parts"][1] == "note"
    assert torch.equal(out["loss"], torch.full((2,), 2.0))


def test_shared_parameters_found_and_tied_again():
    from torchfleet.utilities import find_shared_parameters, set_shared_parameters

    model = nn.Sequential(nn.Embedding(5, 3), nn.Linear(3, 5, bias=False))
    model[1].weight = model[0].weight
    assert find_shared_parameters(model) == [["0.weight", "1.weight"]]
    model[1].weight = nn.Parameter(model[0].weight.detach().clone())  # untied, as a copy to a device may leave it
    assert find_shared_parameters(model) == []
    set_shared_parameters(model, [["0.weight", "1.weight"]])
    assert model[1].weight is model[0].weight


def test_compiled_modules_in_and_out():
    from torchfleet.utilities.compile import from_compiled, to_uncompiled

    module = nn.Linear(2, 2)
    compiled = torch.compile(module)
    assert to_uncompiled(compiled) is module and to_uncompiled(module) is module
    assert from_compiled(compiled) is compiled
    with pytest.raises(ConfigurationError, match="torch.compile"):
        from_compiled(module)


def test_is_wrapped_tells_fleet_objects_apart():
    import torchfleet
    from torchfleet.wrappers import is_wrapped

    fleet = torchfleet.Fleet(accelerator="cpu", devices=1)
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    loader = DataLoader(TensorDataset(torch.zeros(4, 2)), batch_size=2)
    assert not is_wrapped(model) and not is_wrapped(optimizer) and not is_wrapped(loader)
    wrapped_model, wrapped_optimizer = fleet.setup(model, optimizer)
    assert is_wrapped(wrapped_model) and is_wrapped(wrapped_optimizer) and is_wrapped(fleet.setup_dataloaders(loader))
    assert torchfleet.is_wrapped is is_wrapped


def test_small_names_behave_as_lightnings():
    from torchfleet.accelerators.cuda import is_cuda_available, num_cuda_devices
    from torchfleet.callbacks import Checkpoint, ModelCheckpoint
    from torchfleet.callbacks.timer import Interval, Timer
    from torchfleet.seed import seed_everything
    from torchfleet.utilities.rank_zero import LightningDeprecationWarning, rank_zero_deprecation
    from torchfleet.utilities.seed import max_seed_value, min_seed_value
    from torchfleet.utilities.warnings import PossibleUserWarning, disable_possible_user_warnings

    assert issubclass(ModelCheckpoint, Checkpoint)
    timer = Timer(duration="00:00:01:00", interval=Interval.epoch)
    assert timer.interval == "epoch" and type(timer.interval) is str
    assert num_cuda_devices() == torch.cuda.device_count() and is_cuda_available() == (torch.cuda.device_count() > 0)
    assert seed_everything(max_seed_value, verbose=False) == 2**32 - 1 and min_seed_value == 0
    with pytest.raises(ConfigurationError):
        seed_everything(max_seed_value + 1)
    with pytest.warns(LightningDeprecationWarning, match="old"):
        rank_zero_deprecation("old")
    assert issubclass(LightningDeprecationWarning, DeprecationWarning)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        disable_possible_user_warnings()
        warnings.warn("maybe wrong", PossibleUserWarning)
        warnings.warn("kept", UserWarning)
    assert [str(w.message) for w in caught] == ["kept"]


def test_model_summary_submodule_and_constants():
    from torchfleet.utilities.model_summary import ModelSummary as Package
    from torchfleet.utilities.model_summary.model_summary import (
        LEFTOVER_PARAMS_NAME,
        NOT_APPLICABLE,
        ModelSummary,
        get_formatted_model_size,
        parse_batch_shape,
    )

    assert ModelSummary is Package
    assert get_formatted_model_size(1234.56789) == "1,234.568"
    assert parse_batch_shape([torch.zeros(2, 3), (torch.zeros(4),), "x"]) == [[2, 3], [[4]], "?"]

    class WithOwnParameter(nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = nn.Parameter(torch.ones(1))
            self.layer = nn.Linear(2, 2)

    text = str(ModelSummary(WithOwnParameter()))
    assert LEFTOVER_PARAMS_NAME in text and NOT_APPLICABLE in text


def test_signal_stop_is_lightnings_sigterm_exception():
    from torchfleet import Preempted
    from torchfleet.utilities.exceptions import SIGTERMException

    with pytest.raises(SIGTERMException):
        raise Preempted("stopped on SIGTERM", "SIGTERM")
    assert issubclass(SIGTERMException, SystemExit)


def test_logger_and_progress_bar_helpers(monkeypatch):
    from types import SimpleNamespace

    from torchfleet.callbacks.progress.progress_bar import get_standard_metrics
    from torchfleet.core.optimizer import do_nothing_closure
    from torchfleet.loggers.base import DummyExperiment
    from torchfleet.loggers.logger import rank_zero_experiment

    made = []

    class Recorder:
        @property
        @rank_zero_experiment
        def experiment(self):
            made.append(1)
            return "run"

    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("LOCAL_RANK", raising=False)
    assert Recorder().experiment == "run" and made == [1]
    monkeypatch.setenv("RANK", "1")
    assert isinstance(Recorder().experiment, DummyExperiment) and made == [1]  # rank 1 creates no run
    assert get_standard_metrics(SimpleNamespace(loggers=[SimpleNamespace(version="run-abcdef")])) == {"v_num": "cdef"}
    assert get_standard_metrics(SimpleNamespace(loggers=[SimpleNamespace(version=3)])) == {"v_num": 3}
    assert get_standard_metrics(SimpleNamespace(loggers=[])) == {}
    assert do_nothing_closure() is None


def test_fabrics_throughput_monitor_logs_through_the_fleet(tmp_path):
    import torchfleet
    from torchfleet.loggers import CSVLogger
    from torchfleet.utilities import ThroughputMonitor

    fleet = torchfleet.Fleet(accelerator="cpu", devices=1, loggers=CSVLogger(tmp_path))
    monitor = ThroughputMonitor(fleet, window_size=2, available_flops=100.0)
    assert monitor.world_size == 1
    monitor.update(time=1.0, batches=1, samples=4, flops=10.0)
    metrics = monitor.compute_and_log(step=1, time=3.0, batches=2, samples=8, flops=10.0)
    # 4 samples and 1 batch in the 2 s between the two updates; 10 FLOPs in that time on a 100 FLOP/s device
    assert metrics["device/samples_per_sec"] == 2.0 and metrics["device/batches_per_sec"] == 0.5
    assert metrics["device/mfu"] == pytest.approx(0.05)
    fleet.loggers[0].finalize("success")
    (written,) = list(tmp_path.rglob("metrics.csv"))
    header = written.read_text().splitlines()[0].split(",")
    assert "device/samples_per_sec" in header and "device/mfu" in header


def test_rich_progress_bar_theme_styles_the_bar():
    pytest.importorskip("rich", reason="RichProgressBar needs the optional rich package")
    import io

    from tests.helpers import RegressionData, Regressor, quiet
    from torchfleet import Trainer
    from torchfleet.callbacks.progress.rich_progress import RichProgressBar, RichProgressBarTheme

    out = io.StringIO()
    theme = RichProgressBarTheme(metrics_text_delimiter=" | ", metrics_format=".1e", batch_progress="bold")
    bar = RichProgressBar(theme=theme, console_kwargs={"file": out, "width": 200, "force_terminal": False})
    Trainer(max_epochs=1, callbacks=[bar], **quiet(enable_progress_bar=True)).fit(Regressor(), datamodule=RegressionData())
    text = out.getvalue()
    # the logged loss in the theme's format ("1.2e-01"), the parts joined by its delimiter, the batches counted
    assert re.search(r"train_loss: \d\.\de[-+]\d\d", text) and " | " in text and "8/8" in text
    with pytest.raises(ConfigurationError, match=r"RichProgressBar\(theme='dark'\) is not valid"):
        RichProgressBar(theme="dark")


def test_convert_inf_gives_none_for_unknown_totals():
    from torchfleet.callbacks.progress.tqdm_progress import convert_inf

    assert convert_inf(float("inf")) is None and convert_inf(float("nan")) is None and convert_inf(None) is None
    assert convert_inf(8) == 8 and convert_inf(2.5) == 2.5


def test_save_hyperparameters_function_form_reads_the_calling_constructor():
    import torchfleet
    from torchfleet.utilities.parsing import save_hyperparameters

    class Model(torchfleet.Module):
        def __init__(self, width: int = 4, depth: int = 2, note: str = "x"):
            super().__init__()
            save_hyperparameters(self, ignore="note")

    assert dict(Model(width=8).hparams) == {"width": 8, "depth": 2}

    class Given(torchfleet.Module):
        def __init__(self):
            super().__init__()
            save_hyperparameters(self, given_hparams={"lr": 0.1})

    assert dict(Given().hparams) == {"lr": 0.1}
    with pytest.raises(ConfigurationError, match="got a int"):
        save_hyperparameters(3)


def test_has_len_all_ranks_on_one_process():
    from torchfleet.strategies import SingleDeviceStrategy
    from torchfleet.utilities.data import has_len_all_ranks

    strategy = SingleDeviceStrategy(device="cpu")
    assert has_len_all_ranks([1, 2], strategy)
    assert not has_len_all_ranks(DataLoader(_Stream()), strategy)  # no length
    with pytest.warns(UserWarning, match="no batch on any rank"):
        assert has_len_all_ranks([], strategy)
