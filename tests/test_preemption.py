"""Preemption and automatic resume in one process: a real SIGTERM/SIGUSR1 sent to this process during fit
saves one checkpoint, fit raises Preempted (exit code 75), and a restart resumes bitwise.

The reference for every resumed run is the same fit without any signal: a resumed run must end with
exactly its weights (torch.equal) and step count.
"""

from __future__ import annotations

import logging
import os
import signal
import stat
import sys
import time

import pytest
import torch

from tests.helpers import RegressionData, Regressor, loader, make_data, quiet
from torchfleet import Trainer
from torchfleet.callbacks import Callback, ModelCheckpoint
from torchfleet.environments import SLURMEnvironment
from torchfleet.errors import ConfigurationError
from torchfleet.preemption import EXIT_CODE, Preempted

TOTAL_STEPS = 24  # 3 epochs of 8 batches


class SendSignal(Callback):
    """Sends real signals to this process at chosen points of fit."""

    def __init__(self, where: str, step: int = 5, signals=(signal.SIGTERM,)) -> None:
        self.where, self.step, self.signals, self.sent = where, step, signals, False
        self.steps_run = 0

    def _send(self) -> None:
        if not self.sent:
            self.sent = True
            for sig in self.signals:
                os.kill(os.getpid(), sig)

    def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
        self.steps_run += 1
        if self.where == "step" and trainer.global_step == self.step:
            self._send()

    def on_save_checkpoint(self, trainer, module, checkpoint):
        # inside the save ModelCheckpoint makes at this step, before the file is written
        if self.where == "save" and trainer.global_step == self.step:
            self._send()

    def on_validation_batch_end(self, trainer, module, outputs, batch, batch_idx, dataloader_idx=0):
        if self.where == "validation" and not trainer.sanity_checking and trainer.global_step == self.step:
            self._send()
        if self.where == "sanity" and trainer.sanity_checking:
            self._send()


def _fit(root, callbacks=(), ckpt_path=None, seed=0, **kw):
    torch.manual_seed(seed)
    model = Regressor(dropout=0.2, scheduler="step")
    args = quiet(max_epochs=3, default_root_dir=root, callbacks=list(callbacks))
    args.update(kw)
    trainer = Trainer(**args)
    trainer.fit(model, datamodule=RegressionData(shuffle=True), ckpt_path=ckpt_path)
    return model, trainer


def _assert_same(a, b):
    for (name, p), q in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(p, q), name


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    model, trainer = _fit(tmp_path_factory.mktemp("ref"))
    assert trainer.global_step == TOTAL_STEPS
    return model


@pytest.fixture
def restart(monkeypatch):
    def set_restart(count: int = 1) -> None:
        monkeypatch.setenv("SLURM_RESTART_COUNT", str(count))

    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    monkeypatch.delenv("TORCHELASTIC_RESTART_COUNT", raising=False)
    monkeypatch.delenv("TF_RESTART_COUNT", raising=False)
    return set_restart


def _checkpoints(root):
    return sorted(os.path.relpath(os.path.join(d, f), root) for d, _, files in os.walk(root) for f in files)


@pytest.mark.parametrize(
    ("where", "kw", "stopped_at"),
    [
        ("step", {}, 5),
        # ModelCheckpoint saves every step; the signal lands in that save: it completes, then the stop
        ("save", {"enable_checkpointing": True, "callbacks_extra": "every_step"}, 5),
        ("validation", {"val_check_interval": 0.5, "limit_val_batches": 2}, 4),
        ("sanity", {"num_sanity_val_steps": 2}, 1),
        ("twice", {}, 5),
    ],
)
def test_signal_saves_one_checkpoint_and_a_restart_resumes_exactly(tmp_path, restart, where, kw, stopped_at):
    kw = dict(kw)
    extra = []
    if kw.pop("callbacks_extra", None):
        extra = [ModelCheckpoint(dirpath=tmp_path / "ck", every_n_train_steps=1, save_top_k=-1)]
    # the same run without a signal (validation draws from the RNG too: each setting has its own reference)
    reference, _ = _fit(tmp_path / "reference", **kw)
    signals = (signal.SIGTERM, signal.SIGUSR1) if where == "twice" else (signal.SIGUSR1,) if where == "sanity" else (
        signal.SIGTERM,)
    sender = SendSignal("step" if where == "twice" else where, step=stopped_at, signals=signals)
    before = signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)
    with pytest.raises(Preempted) as info:
        _fit(tmp_path, [sender, *extra], **kw)
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGUSR1)) == before  # handlers given back
    exc = info.value
    assert isinstance(exc, SystemExit) and exc.code == EXIT_CODE == 75
    assert exc.signal == signals[0].name and exc.signal in str(exc)
    folder = tmp_path / "ck" if extra else tmp_path / "checkpoints"
    assert exc.checkpoint == str(folder / "preempted.ckpt") and exc.checkpoint in str(exc)
    # exactly one preemption checkpoint, complete, and no temporary file left anywhere
    files = _checkpoints(tmp_path)
    assert [f for f in files if f.endswith("preempted.ckpt")] == [os.path.relpath(exc.checkpoint, tmp_path)]
    assert not [f for f in files if os.path.basename(f).startswith(".")], files
    saved = torch.load(exc.checkpoint, weights_only=True)
    assert saved["global_step"] == stopped_at
    assert sender.steps_run == stopped_at  # stopped right after the step the signal came in (or the next check)

    restart(1)
    counter = SendSignal("never")
    model, trainer = _fit(tmp_path, [counter, *extra], seed=123, **kw)  # a different seed: all comes from the file
    assert trainer.ckpt_path == exc.checkpoint
    assert counter.steps_run == TOTAL_STEPS - stopped_at
    assert trainer.global_step == TOTAL_STEPS
    _assert_same(model, reference)


def test_a_signal_inside_an_accumulation_window_stops_after_its_optimizer_step(tmp_path, restart):
    class SignalAtBatch(SendSignal):
        def on_train_batch_end(self, trainer, module, outputs, batch, batch_idx):
            self.steps_run += 1
            if self.steps_run == 5:  # the first micro-batch of the third window of 2
                self._send()

    reference, _ = _fit(tmp_path / "reference", accumulate_grad_batches=2)
    sender = SignalAtBatch("never")
    with pytest.raises(Preempted) as info:
        _fit(tmp_path, [sender], accumulate_grad_batches=2)
    assert sender.steps_run == 6  # the window was completed and stepped, not cut
    assert torch.load(info.value.checkpoint, weights_only=True)["global_step"] == 3
    restart(1)
    model, trainer = _fit(tmp_path, seed=123, accumulate_grad_batches=2)
    assert trainer.global_step == TOTAL_STEPS // 2
    _assert_same(model, reference)


def test_without_a_signal_nothing_changes_and_handlers_are_restored(tmp_path, reference):
    before = signal.getsignal(signal.SIGTERM)
    model, trainer = _fit(tmp_path)
    assert signal.getsignal(signal.SIGTERM) is before
    _assert_same(model, reference)
    assert not (tmp_path / "checkpoints").exists()


def test_auto_resume_off_starts_from_the_beginning_on_a_restart(tmp_path, restart):
    with pytest.raises(Preempted):
        _fit(tmp_path, [SendSignal("step")])
    restart(2)
    counter = SendSignal("never")
    _, trainer = _fit(tmp_path, [counter], auto_resume=False)
    assert trainer.ckpt_path is None and counter.steps_run == TOTAL_STEPS


def test_no_restart_no_resume_and_an_explicit_path_wins(tmp_path, restart, reference):
    with pytest.raises(Preempted):
        _fit(tmp_path, [SendSignal("step", step=3)])
    counter = SendSignal("never")
    _, trainer = _fit(tmp_path / "other", [counter])  # not a restart: a fresh run
    assert trainer.ckpt_path is None and counter.steps_run == TOTAL_STEPS
    explicit = tmp_path / "explicit.ckpt"
    trainer.save_checkpoint(explicit)  # step 24: nothing left to train
    restart(1)
    counter = SendSignal("never")
    _, trainer = _fit(tmp_path, [counter], ckpt_path=explicit)
    assert trainer.ckpt_path == str(explicit) and counter.steps_run == 0


def test_last_is_the_newest_complete_checkpoint(tmp_path, reference):
    # ModelCheckpoint's last.ckpt at the end of epoch 0, then a preemption at step 13
    ck = ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)
    with pytest.raises(Preempted) as info:
        _fit(tmp_path, [SendSignal("step", step=13), ck], enable_checkpointing=True)
    assert (tmp_path / "ck" / "last.ckpt").exists()
    # leftovers of saves that never finished are newer, but not complete: never chosen
    (tmp_path / "ck" / ".zzz.ckpt.tmp-1-2").write_bytes(b"partial")
    (tmp_path / "ck" / "sharded.ckpt").mkdir()  # a directory without its metadata file
    (tmp_path / "ck" / ".other.ckpt.partial").mkdir()
    counter = SendSignal("never")
    model, trainer = _fit(tmp_path, [counter, ModelCheckpoint(dirpath=tmp_path / "ck", save_last=True)],
                          ckpt_path="last", enable_checkpointing=True)
    assert trainer.ckpt_path == info.value.checkpoint
    assert counter.steps_run == TOTAL_STEPS - 13
    _assert_same(model, reference)


def test_a_restart_with_nothing_saved_starts_fresh(tmp_path, restart, caplog):
    restart(1)
    counter = SendSignal("never")
    with caplog.at_level(logging.INFO, logger="torchfleet"):
        _, trainer = _fit(tmp_path, [counter])
    assert trainer.ckpt_path is None and counter.steps_run == TOTAL_STEPS
    assert "no checkpoint was found" in caplog.text


def test_bad_auto_resume_is_refused():
    with pytest.raises(ConfigurationError, match="auto_resume='yes' is not valid"):
        Trainer(auto_resume="yes", **quiet())


# ------------------------------------------------------------------------------------------------ SLURM requeue
def _fake_scontrol(folder, exit_code: int = 0) -> str:
    """An executable ``scontrol`` that records its arguments in ``<folder>/calls.txt``."""
    record = folder / "calls.txt"
    script = folder / "scontrol"
    script.write_text(f"#!{sys.executable}\nimport sys\nopen({str(record)!r}, 'a').write(' '.join(sys.argv[1:]) + '\\n')\n"
                      f"sys.exit({exit_code})\n")
    script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return str(record)


@pytest.fixture
def slurm_job(monkeypatch, tmp_path):
    """This process as task 0 of a one-task SLURM job 4242, with a fake scontrol first on PATH."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, value in {"SLURM_NTASKS": "1", "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
                        "SLURM_JOB_ID": "4242", "SLURM_JOB_NAME": "train", "SLURM_NODELIST": "localhost"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("SLURM_ARRAY_JOB_ID", raising=False)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    return bin_dir


def test_preempted_slurm_job_requeues_itself_after_saving(tmp_path, slurm_job):
    calls = _fake_scontrol(slurm_job)
    with pytest.raises(Preempted) as info:
        _fit(tmp_path / "run", [SendSignal("step")])
    with open(calls) as f:
        assert f.read() == "requeue 4242\n"
    assert "SLURM job 4242 requeued" in str(info.value)
    assert os.path.exists(info.value.checkpoint)


def test_requeue_failures_are_warnings_not_errors(tmp_path, slurm_job, monkeypatch, caplog):
    env = SLURMEnvironment()
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no scontrol anywhere
    with caplog.at_level(logging.WARNING, logger="torchfleet"):
        assert env.on_preempted() is None
    assert "'scontrol' was not found on PATH" in caplog.text
    caplog.clear()
    calls = _fake_scontrol(slurm_job, exit_code=1)
    monkeypatch.setenv("PATH", str(slurm_job))
    with caplog.at_level(logging.WARNING, logger="torchfleet"):
        assert env.on_preempted() is None
    assert "exited with code 1" in caplog.text
    with open(calls) as f:
        assert f.read() == "requeue 4242\n"


def test_requeue_command_and_switch(tmp_path, slurm_job, monkeypatch):
    calls = _fake_scontrol(slurm_job)
    monkeypatch.setenv("SLURM_ARRAY_JOB_ID", "77")
    monkeypatch.setenv("SLURM_ARRAY_TASK_ID", "3")
    assert "requeued" in SLURMEnvironment(requeue_command=["scontrol", "requeuehold", "{job_id}"]).on_preempted()
    assert SLURMEnvironment(auto_requeue=False).on_preempted() is None
    with open(calls) as f:
        assert f.read() == "requeuehold 77_3\n"  # an array task is requeued by its own id; the switch ran nothing


@pytest.mark.parametrize("bad", [{"auto_requeue": "yes"}, {"requeue_command": "scontrol requeue"},
                                 {"requeue_command": []}])
def test_bad_slurm_requeue_arguments_are_refused(bad):
    with pytest.raises(ConfigurationError, match="is not valid"):
        SLURMEnvironment(**bad)


# ------------------------------------------------------------------------------------------------ Fleet
def test_fleet_preemption_requested_in_one_process():
    from torch import nn

    from torchfleet import Fleet

    def loop(fleet):
        torch.manual_seed(0)
        model = nn.Linear(4, 1)
        model, opt = fleet.setup(model, torch.optim.SGD(model.parameters(), lr=0.1))
        assert signal.getsignal(signal.SIGTERM) is before  # nothing installed until the loop asks
        seen = []
        for step in range(1, 6):
            fleet.backward(model(torch.ones(2, 4)).sum())
            opt.step()
            seen.append(fleet.preemption_requested)
            if step == 2:
                os.kill(os.getpid(), signal.SIGUSR1)
                os.kill(os.getpid(), signal.SIGUSR1)  # twice: the same request
        return seen

    before = signal.getsignal(signal.SIGTERM)
    seen = Fleet(accelerator="cpu", devices=1).launch(loop)
    # the signal came after step 2's optimizer.step; step 3's step records it
    assert seen == [False, False, True, True, True]
    assert signal.getsignal(signal.SIGTERM) is before  # given back when the launched function returned
    assert issubclass(Preempted, SystemExit) and Preempted("x").code == EXIT_CODE


# ------------------------------------------------------------------------------------------------ no step comes
class _SignalThenWait(Callback):
    """Sends SIGTERM to this process where no training step can follow soon, then waits far longer than the test."""

    def __init__(self, where: str) -> None:
        self.where = where

    def _stall(self) -> None:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(60)  # a slow validation; the raised Preempted cuts it short

    def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
        if self.where == "sanity" and trainer.sanity_checking:
            self._stall()
        if self.where == "validation" and not trainer.sanity_checking:
            self._stall()


class _StallingData(torch.utils.data.Dataset):
    """A dataset whose 30th fetch signals this process and then waits (a data loader that stopped delivering)."""

    def __init__(self) -> None:
        self.inner, self.fetched = make_data(64), 0

    def __len__(self) -> int:
        return len(self.inner)

    def __getitem__(self, i):
        self.fetched += 1
        if self.fetched == 30:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(60)
        return self.inner[i]


@pytest.mark.parametrize(("where", "said"), [("data", "with no training step completed"),
                                            ("validation", "during validation"),
                                            ("sanity", "during the sanity check")])
def test_one_process_stops_within_seconds_where_no_step_comes(tmp_path, where, said, capfd):
    # one process, no launcher: after the grace the signal thread raises Preempted in the main thread, which
    # unwinds (callbacks' on_exception, the handlers given back); no checkpoint is made up at such a point
    before = signal.getsignal(signal.SIGTERM)
    torch.manual_seed(0)
    trainer = Trainer(**quiet(max_epochs=1, default_root_dir=tmp_path, callbacks=[_SignalThenWait(where)],
                              val_check_interval=4, limit_val_batches=1,
                              num_sanity_val_steps=1 if where == "sanity" else 0))
    train = torch.utils.data.DataLoader(_StallingData() if where == "data" else make_data(64), batch_size=8)
    started = time.monotonic()
    with pytest.raises(Preempted) as info:
        trainer.fit(Regressor(), train, torch.utils.data.DataLoader(make_data(16), batch_size=8))
    took = time.monotonic() - started
    assert took < 10, took
    assert info.value.code == EXIT_CODE and info.value.checkpoint is None and info.value.signal == "SIGTERM"
    message = str(info.value)
    assert said in message and "stops without saving" in message and "Exit code 75" in message, message
    assert [line for line in capfd.readouterr().err.splitlines() if "Exit code 75" in line] == [message]
    assert not (tmp_path / "checkpoints").exists()
    assert signal.getsignal(signal.SIGTERM) is before


def test_a_second_ctrl_c_a_second_later_stops_at_once(tmp_path):
    from torchfleet.signals import REPEAT_S

    # Ctrl-C reaches a fit only where SIGINT is not ignored: a suite started as a background job of a
    # non-interactive shell inherits it ignored (and the fit rightly keeps it so), so this test sets it as a
    # terminal's foreground process has it, and puts back what it found
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        _two_ctrl_c_stop_at_once(tmp_path, REPEAT_S)
    finally:
        signal.signal(signal.SIGINT, previous)


def _two_ctrl_c_stop_at_once(tmp_path, REPEAT_S):

    class TwoCtrlC(Callback):
        def on_validation_batch_start(self, trainer, module, batch, batch_idx, dataloader_idx=0):
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(REPEAT_S + 0.2)
            os.kill(os.getpid(), signal.SIGINT)  # the user presses Ctrl-C again: no more waiting
            time.sleep(60)

    trainer = Trainer(**quiet(max_epochs=1, default_root_dir=tmp_path, callbacks=[TwoCtrlC()], val_check_interval=4,
                              limit_val_batches=1))
    with pytest.raises(Preempted) as info:
        trainer.fit(Regressor(), loader(), loader(16))
    assert "a second SIGINT (Ctrl-C, KeyboardInterrupt) stops the run at once" in str(info.value), str(info.value)
    assert info.value.code == EXIT_CODE and info.value.signal == "SIGINT"


def test_an_ignored_sigint_stays_ignored():
    # a shell's background job starts with SIGINT ignored: Ctrl-C in the terminal is not for it, nor for its fits
    from torchfleet.signals import SignalFlag

    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        flag = SignalFlag()
        assert flag.install()
        assert signal.getsignal(signal.SIGINT) is signal.SIG_IGN
        assert signal.getsignal(signal.SIGTERM) == flag._handle
        flag.restore()
        flag = SignalFlag()
        signal.signal(signal.SIGINT, signal.default_int_handler)
        assert flag.install() and signal.getsignal(signal.SIGINT) == flag._handle
        flag.restore()
        assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    finally:
        signal.signal(signal.SIGINT, previous)


def test_the_grace_follows_the_steps_that_still_come(monkeypatch):
    from torchfleet import preemption
    from torchfleet.preemption import SIGNAL_GRACE_S, StopAgreement, steps_overdue
    from torchfleet.signals import SignalFlag

    clock = [100.0]
    monkeypatch.setattr(preemption, "_monotonic", lambda: clock[0])
    flag = SignalFlag()
    agreement = StopAgreement(flag, 1)
    flag.received_at = 99.0
    assert steps_overdue(flag, agreement, 99.0 + SIGNAL_GRACE_S - 0.1) is None  # before the first step: the grace
    assert steps_overdue(flag, agreement, 99.0 + SIGNAL_GRACE_S + 0.1) is not None
    for t in (100.0, 103.0, 160.0):  # steps of 3 s, then one that held a long validation
        clock[0] = t
        agreement.poll()
    assert agreement.interval == 3.0  # the shorter of the last two
    flag.received_at = 160.5
    limit = 160.5 + SIGNAL_GRACE_S + 3.0  # a step's time more than the grace, from the signal (after the last step)
    assert steps_overdue(flag, agreement, limit - 0.1) is None
    assert steps_overdue(flag, agreement, limit + 0.1) is not None
    # outside the training steps (validation): the grace alone
    assert steps_overdue(flag, agreement, 160.5 + SIGNAL_GRACE_S + 0.1, stepping=False) is not None
