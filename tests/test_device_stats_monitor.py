"""DeviceStatsMonitor: the names, steps and cadence of Lightning's logging on one program, and without Lightning
the same computed here."""

from __future__ import annotations

import json

import pytest

from tests.lightning_more_programs import source
from tests.lightning_reference import finish, needs_lightning, run_here, start_in_lightning
from torchfleet import Trainer
from torchfleet.errors import ConfigurationError
from torchfleet.trainer.callbacks import DeviceStatsMonitor

psutil = pytest.importorskip("psutil", reason="the CPU's figures are read with psutil, which is not installed")

# the reference Lightning environment has no psutil: there its CPU figures are stubbed (names as Lightning's own);
# what is compared is which names are logged, at which hooks and steps
_STUB = '''
import lightning.pytorch.callbacks.device_stats_monitor as _dsm
from lightning.pytorch.accelerators import CPUAccelerator as _CPU
_dsm._PSUTIL_AVAILABLE = True
_CPU.get_device_stats = lambda self, device: {"cpu_vm_percent": 1.0, "cpu_percent": 2.0, "cpu_swap_percent": 3.0}
'''


@needs_lightning
def test_the_logged_names_and_steps_equal_lightnings():
    theirs = start_in_lightning(source("lightning", "device_stats").replace("\nclass Recorder", _STUB + "\nclass Recorder", 1))
    ours = json.loads(run_here(source("torchfleet", "device_stats")).split("RESULTS ", 1)[1])
    assert ours == json.loads(finish(theirs).split("RESULTS ", 1)[1])


def test_the_cadence_follows_log_every_n_steps():
    calls = json.loads(run_here(source("torchfleet", "device_stats")).split("RESULTS ", 1)[1])["calls"]
    # 5 training batches an epoch, 2 epochs, log_every_n_steps=2: the training batches k (counted over the run) with
    # (k + 1) % 2 == 0, at their start and end, logged at step k; the second of each validation's 2 batches, at the
    # steps taken before the epoch's last batch
    expected = []
    for k in range(10):
        if (k + 1) % 2 == 0:
            expected += [("on_train_batch_start", k), ("on_train_batch_end", k)]
        if k in (4, 9):
            expected += [("on_validation_batch_start", k), ("on_validation_batch_end", k)]
    assert [(names[0].split("/")[0].split(".")[1], step) for names, step, _ in calls] == expected
    assert all(sorted(n.split("/")[1] for n in names) == ["cpu_percent", "cpu_swap_percent", "cpu_vm_percent"]
               and floats for names, _, floats in calls)


def test_without_a_logger_it_is_refused():
    from torch.utils.data import DataLoader

    from tests.helpers import Regressor, make_data, quiet

    trainer = Trainer(max_epochs=1, callbacks=[DeviceStatsMonitor()], **quiet())
    with pytest.raises(ConfigurationError, match="logger=False"):
        trainer.fit(Regressor(), DataLoader(make_data(16), batch_size=8))
