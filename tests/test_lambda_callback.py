"""LambdaCallback: functions as hooks, called by the Trainer with the hook's arguments."""

from __future__ import annotations

import pytest

from tests.helpers import RegressionData, Regressor, quiet
from torchfleet import Trainer
from torchfleet.callbacks import LambdaCallback
from torchfleet.errors import ConfigurationError


def test_given_hooks_run_with_their_arguments():
    calls = []
    callback = LambdaCallback(
        on_train_batch_end=lambda trainer, module, outputs, batch, batch_idx: calls.append(("batch", batch_idx)),
        on_validation_end=lambda trainer, module: calls.append(("val", trainer.current_epoch)),
        on_fit_end=None,  # None: that hook stays unset
    )
    trainer = Trainer(max_epochs=2, limit_train_batches=3, callbacks=[callback], **quiet())
    trainer.fit(Regressor(), datamodule=RegressionData())
    assert calls == [("batch", 0), ("batch", 1), ("batch", 2), ("val", 0),
                     ("batch", 0), ("batch", 1), ("batch", 2), ("val", 1)]
    assert "on_fit_end" not in vars(callback)


def test_unknown_hook_names_are_refused_with_the_closest():
    with pytest.raises(ConfigurationError, match=r"'on_train_epoch_ends'.*Did you mean 'on_train_epoch_end'"):
        LambdaCallback(on_train_epoch_ends=print)
    with pytest.raises(ConfigurationError, match="not callable"):
        LambdaCallback(on_fit_start=3)
    with pytest.raises(ConfigurationError, match="state_dict"):
        LambdaCallback(state_dict=dict)
