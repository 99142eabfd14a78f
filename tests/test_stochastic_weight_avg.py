"""StochasticWeightAveraging: Lightning's averaged weights and rates bitwise on one seeded program, and the average
checked against the epochs' weights without Lightning."""

from __future__ import annotations

import json

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

from tests.helpers import Regressor, make_data, quiet
from tests.lightning_more_programs import source
from tests.lightning_reference import finish, needs_lightning, run_here, start_in_lightning
from torchfleet import Trainer
from torchfleet.errors import ConfigurationError
from torchfleet.trainer.callbacks import StochasticWeightAveraging


@needs_lightning
def test_the_averaged_weights_and_rates_equal_lightnings_bitwise():
    # the same float32 steps and running mean in the same order on the CPU: nothing allows a rounding difference
    theirs = start_in_lightning(source("lightning", "swa"))
    ours = json.loads(run_here(source("torchfleet", "swa")).split("RESULTS ", 1)[1])
    theirs = json.loads(finish(theirs).split("RESULTS ", 1)[1])
    assert ours["cos"]["n_averaged"] == 4  # the starts of epochs 3..6 (1-based)
    assert ours == theirs


class _Recording(Regressor):
    def __init__(self):
        super().__init__(lr=0.05)
        self.starts, self.rates = [], []

    def on_train_epoch_start(self):
        self.starts.append([p.detach().clone() for p in self.parameters()])
        self.rates.append(self.trainer.optimizers[0].param_groups[0]["lr"])


def test_the_final_weights_are_the_mean_of_the_averaged_epochs_starting_weights():
    torch.manual_seed(0)
    model = _Recording()
    swa = StochasticWeightAveraging(swa_lrs=0.01, swa_epoch_start=0.5, annealing_epochs=1, annealing_strategy="linear")
    Trainer(max_epochs=6, callbacks=[swa], **quiet()).fit(model, DataLoader(make_data(48), batch_size=8, shuffle=True))
    # swa_epoch_start=0.5 of 6 epochs: epoch 3 (1-based), so the starts of epochs 3, 4, 5 and 6 are averaged
    expected = [torch.stack([start[i] for start in model.starts[2:]]).mean(0) for i in range(len(model.starts[0]))]
    for value, mean in zip(model.parameters(), expected):
        torch.testing.assert_close(value.detach(), mean, rtol=1e-6, atol=1e-7)
    assert int(swa.n_averaged) == 4
    # before: the Module's constant rate; from epoch 4 on the SWA rate (a linear anneal over 1 epoch reaches it)
    assert model.rates[:3] == [0.05] * 3 and model.rates[3:] == pytest.approx([0.01] * 3)


def test_bad_arguments_and_batch_norm_are_refused_in_one_paragraph():
    with pytest.raises(ConfigurationError, match="swa_epoch_start=0"):
        StochasticWeightAveraging(swa_lrs=0.1, swa_epoch_start=0)
    with pytest.raises(ConfigurationError, match="swa_lrs=-1.0"):
        StochasticWeightAveraging(swa_lrs=-1.0)
    with pytest.raises(ConfigurationError, match="annealing_strategy='step'"):
        StochasticWeightAveraging(swa_lrs=0.1, annealing_strategy="step")

    class Normed(Regressor):
        def __init__(self):
            super().__init__()
            self.norm = nn.BatchNorm1d(8)

        def forward(self, x):
            return self.net(self.norm(x))

    trainer = Trainer(max_epochs=2, callbacks=[StochasticWeightAveraging(swa_lrs=0.1)], **quiet())
    with pytest.raises(ConfigurationError, match="has batch normalization"):
        trainer.fit(Normed(), DataLoader(make_data(16), batch_size=8))
