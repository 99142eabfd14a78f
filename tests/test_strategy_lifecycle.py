"""The strategy's lifecycle under the Trainer: teardown last in every stage, on_exception then teardown on an error
(Lightning's order), and what teardown releases: the precision's, CheckpointIO's and accelerator's state."""

from __future__ import annotations

import pytest
import torch

import torchfleet as tf
from tests.helpers import Regressor, loader, quiet
from torchfleet.accelerators import CPUAccelerator
from torchfleet.callbacks import Callback
from torchfleet.checkpoint import TorchCheckpointIO
from torchfleet.loggers import CSVLogger
from torchfleet.precision import Precision
from torchfleet.strategies import SingleDeviceStrategy

ORDER: list[str] = []


class Part:
    """Counts the teardown of a part the strategy holds."""

    def teardown(self) -> None:
        ORDER.append(f"{type(self).__name__}.teardown")
        super().teardown()  # type: ignore[misc]


class CountedPrecision(Part, Precision):
    pass


class CountedIO(Part, TorchCheckpointIO):
    pass


class CountedAccelerator(Part, CPUAccelerator):
    pass


class Recording(SingleDeviceStrategy):
    def __init__(self) -> None:
        super().__init__(device="cpu", accelerator=CountedAccelerator(), precision=CountedPrecision(),
                         checkpoint_io=CountedIO())

    def on_train_end(self) -> None:
        ORDER.append("S.on_train_end")

    def on_exception(self, exception: BaseException) -> None:
        ORDER.append(f"S.on_exception({exception})")

    def teardown(self) -> None:
        ORDER.append("S.teardown")
        super().teardown()


class Hooks(Callback):
    def on_train_end(self, trainer, module):
        ORDER.append("C.on_train_end")

    def on_fit_end(self, trainer, module):
        ORDER.append("C.on_fit_end")

    def on_exception(self, trainer, module, exception):
        ORDER.append("C.on_exception")

    def teardown(self, trainer, module, stage):
        ORDER.append(f"C.teardown({stage})")


class Finalizing(CSVLogger):
    def finalize(self, status: str) -> None:
        ORDER.append(f"L.finalize({status})")
        super().finalize(status)


def _trainer(tmp_path) -> tf.Trainer:
    return tf.Trainer(**quiet(strategy=Recording(), max_steps=4, callbacks=[Hooks()], default_root_dir=tmp_path,
                              logger=Finalizing(tmp_path)))


def test_teardown_ends_every_stage_after_the_last_save_and_before_on_fit_end(tmp_path):
    ORDER.clear()
    trainer = _trainer(tmp_path)
    model = Regressor()
    trainer.fit(model, loader(32))
    parts = ["CountedPrecision.teardown", "CountedIO.teardown", "CountedAccelerator.teardown"]
    assert ORDER == ["C.on_train_end", "S.on_train_end", "S.teardown", *parts, "C.on_fit_end", "L.finalize(success)",
                     "C.teardown(fit)"]
    ORDER.clear()
    trainer.validate(model, loader(16), verbose=False)
    assert ORDER == ["S.teardown", *parts, "C.teardown(validate)"]
    assert trainer.model is model  # what the strategy left: the Module itself


def test_on_exception_then_teardown_then_the_error_reaches_the_caller(tmp_path):
    class Failing(Regressor):
        def training_step(self, batch, batch_idx):
            if batch_idx == 2:
                raise KeyError("at batch 2")
            return super().training_step(batch, batch_idx)

    ORDER.clear()
    trainer = _trainer(tmp_path)
    model = Failing()
    with pytest.raises(KeyError, match="at batch 2"):
        trainer.fit(model, loader(32))
    # Lightning's order: the callbacks', the strategy's on_exception, the loggers, teardown; no on_train_end,
    # on_fit_end or teardown hooks after a failure
    assert ORDER == ["C.on_exception", "S.on_exception('at batch 2')", "L.finalize(failed)", "S.teardown",
                     "CountedPrecision.teardown", "CountedIO.teardown", "CountedAccelerator.teardown"]
    assert trainer.interrupted
    with torch.no_grad():  # the module is usable after the failed fit
        assert model(torch.zeros(2, 8)).shape == (2, 1)


def test_an_error_in_on_fit_end_reaches_on_exception_and_teardown_runs_again(tmp_path):
    """As Lightning's Trainer: the stage-end hooks run inside the stage's error handling, after its teardown."""
    class FailsAtFitEnd(Hooks):
        def on_fit_end(self, trainer, module):
            super().on_fit_end(trainer, module)
            raise RuntimeError("at fit end")

    ORDER.clear()
    trainer = tf.Trainer(**quiet(strategy=Recording(), max_steps=4, callbacks=[FailsAtFitEnd()],
                                 default_root_dir=tmp_path, logger=Finalizing(tmp_path)))
    with pytest.raises(RuntimeError, match="at fit end"):
        trainer.fit(Regressor(), loader(32))
    parts = ["CountedPrecision.teardown", "CountedIO.teardown", "CountedAccelerator.teardown"]
    assert ORDER == ["C.on_train_end", "S.on_train_end", "S.teardown", *parts, "C.on_fit_end", "C.on_exception",
                     "S.on_exception(at fit end)", "L.finalize(failed)", "S.teardown", *parts]
    assert trainer.interrupted
