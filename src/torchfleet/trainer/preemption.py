"""Preemption in the Trainer: the signal flag for the duration of fit, the agreed stop, the preemption checkpoint.

``FitPreemption`` is entered by each rank around its fit stage. The fit loop polls its
``StopAgreement`` after every optimizer step (the ranks exchange their flags every few steps and on an
epoch's last step); when they agree that a SIGTERM/SIGUSR1 arrived, ``stop`` writes ``preempted.ckpt`` (every rank takes part in the strategy's atomic save, as for any
checkpoint) at that step, exactly where an uninterrupted run would continue, asks the cluster
environment to requeue the job (SLURM), and raises ``Preempted`` (exit code 75). The epoch-end hooks
do not run: the epoch is not over, and callbacks such as EarlyStopping must not count it. Which
checkpoint a restarted run resumes from is decided in ``checkpointing.resolve_ckpt_path``.

Where the ranks cannot reach that agreed stop (a signal before the first step, in validation, while a rank
waits for data or in a collective another rank never joins), ``_overdue`` tells the flag's signal thread
to stop this process without a checkpoint after ``SIGNAL_GRACE_S`` (plus one step's time while steps
still come): the line it writes names where the signal found the run and the checkpoint that stays.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import time
from typing import TYPE_CHECKING, Any, NoReturn

from torchfleet import watchdog
from torchfleet.preemption import (
    EXIT_CODE,
    Preempted,
    StopAgreement,
    describe_signal,
    signal_name,
    steps_overdue,
)
from torchfleet.signals import SignalFlag, exit_without_agreement
from torchfleet.trainer import runs

if TYPE_CHECKING:
    from torchfleet.trainer.loop_trainer import LoopTrainer

log = logging.getLogger("torchfleet")

#: the file name of the checkpoint a preempted fit writes
PREEMPTED_NAME = "preempted.ckpt"


def preemption_checkpoint_path(trainer: LoopTrainer) -> str:
    """Where a preempted fit saves: the first ModelCheckpoint's folder, else ``<log_dir>/checkpoints`` (the
    logger's version folder: a run of its own; default_root_dir without a logger)."""
    ck = trainer.checkpoint_callback
    folder = ck.dirpath if ck is not None and ck.dirpath else os.path.join(trainer.log_dir, "checkpoints")
    return os.path.join(folder, PREEMPTED_NAME)


class FitPreemption:
    """The preemption signals recorded while one rank's fit runs (installed on enter, restored on exit)."""

    def __init__(self, trainer: LoopTrainer) -> None:
        self.trainer = trainer
        self.flag = SignalFlag(self._overdue, single_process=trainer.strategy.world_size == 1)
        self.agreement: StopAgreement | None = None

    def __enter__(self) -> FitPreemption:
        self.flag.install()
        self.trainer._preemption = self
        self.trainer._received_sigterm = False
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        try:
            agreement, self.agreement = self.agreement, None
            if agreement is not None:
                if exc_type is None:
                    # every rank polled as often: the reduction in flight completes on all of them
                    late = agreement.finish()
                    if late and self.trainer.is_global_zero:
                        log.info("torchfleet: %s arrived after the last training step; fit finished normally.",
                                 signal_name(late))
                else:
                    agreement.abandon()
        finally:
            self.trainer._preemption = None
            self.trainer._received_sigterm = self.flag.signum == signal.SIGTERM  # trainer.received_sigterm after fit
            self.flag.restore()
        flag = self.flag
        if exc is not None and not isinstance(exc, Preempted) and flag.signum is not None and not flag.stopping:
            # an error after a signal this rank had not yet acted on is its echo (a data-loader worker ended by it, a
            # rank that stopped on it): the signal is why the run stops, as it would have a moment later
            summary = (str(exc).strip().splitlines() or [""])[0][:200]
            line = (f"torchfleet: {describe_signal(flag.signum)} received; the run then stopped on "
                    f"{type(exc).__name__}: {summary} - every process stops without saving ({self._kept()}). "
                    f"Exit code {EXIT_CODE}.")
            if not flag.single_process:
                exit_without_agreement(line)
            sys.stderr.write(line + "\n")
            raise Preempted(line, signal_name(flag.signum)) from exc

    def start_loop(self) -> StopAgreement:
        """The agreement the fit loop polls (every rank creates it at the same point)."""
        strategy = self.trainer.strategy
        self.agreement = StopAgreement(self.flag, strategy.world_size if strategy.agrees_on_signals else 1)
        return self.agreement

    def stop(self, signum: int) -> NoReturn:
        """Every rank, after the same step: save the preemption checkpoint, requeue, raise ``Preempted``."""
        trainer = self.trainer
        self.flag.begin_agreed_stop()  # the ranks save together now: the signal thread must not end this one
        name = describe_signal(signum)
        path = runs.own_name(preemption_checkpoint_path(trainer))  # another run's preempted.ckpt stays
        own = self.flag.signum is not None
        if trainer.is_global_zero:
            log.warning("torchfleet: %s received; saving %s after step %d, then stopping.", name, path,
                        trainer.global_step)
        self.agreement = None  # nothing in flight: the poll that agreed waited for it
        trainer.save_checkpoint(path)
        saved_at = time.monotonic()
        after = f", {saved_at - self.flag.received_at:.2f} s after the signal reached this rank" if own else ""
        requeued = None
        if trainer.is_global_zero:
            requeued = _cluster_environment(trainer).on_preempted()
        message = (f"{name} asked this run to stop: the checkpoint {path} was saved at step {trainer.global_step}"
                   f"{after}. {requeued + ' ' if requeued else ''}fit(ckpt_path=\"last\") resumes from it; a restarted "
                   f"job (SLURM_RESTART_COUNT or TORCHELASTIC_RESTART_COUNT > 0) does so by itself. Exit code {EXIT_CODE}.")
        if trainer.is_global_zero:
            log.warning("torchfleet: %s", message)
        raise Preempted(message, signal_name(signum), path)

    def _overdue(self, flag: SignalFlag, now: float) -> str | None:
        """In the signal thread: the line to stop with when the agreed stop will not come in time, else None."""
        record = watchdog.current()
        position = record["position"]
        training = position is not None and position[0] == "training"
        if steps_overdue(flag, self.agreement, now, stepping=training) is None:
            return None
        waited = now - record["started"] if record["state"] == "in" else 0.0
        if waited > 1.0:
            where = (f"while this rank waited {waited:.1f} s in collective #{record['seq']} {record['name']} (called "
                     f"at {record['site']}), which another rank does not join")
        elif training:
            last = self.agreement.last_poll if self.agreement is not None else None
            since = f" for {now - last:.1f} s" if last is not None else ""
            where = (f"in epoch {position[1]} after batch {position[2]}, with no training step completed{since} "
                     "(waiting for data, or for another rank)")
        elif position is not None:
            where = {"sanity_check": "during the sanity check", "validate": "during validation"}.get(
                position[0], f"during {position[0]}")
        elif self.agreement is None or self.agreement.last_poll is None:
            where = "before the first training step"
        else:
            where = "at the end of an epoch (validation, checkpoints or epoch-end hooks)"
        return (f"torchfleet: {describe_signal(flag.signum or 0)} received {where}; the ranks cannot agree on a "
                f"checkpoint there, so every process stops without saving ({self._kept()}). Exit code {EXIT_CODE}.")

    def _kept(self) -> str:
        kept = _newest_checkpoint(self.trainer)
        return f"the last complete one stays: {kept}" if kept else "none was saved before"


def _newest_checkpoint(trainer: LoopTrainer) -> str | None:
    """The newest file or directory this fit's checkpoint callbacks wrote that still exists (None when none)."""
    paths = []
    for cb in trainer.checkpoint_callbacks:
        paths += [cb.last_model_path, cb.best_model_path, *getattr(cb, "best_k_models", {})]
    found = [p for p in paths if p and os.path.exists(p)]
    return max(found, key=os.path.getmtime) if found else None


def _cluster_environment(trainer: LoopTrainer) -> Any:
    env = trainer.strategy.cluster_environment
    if env is None:
        from torchfleet.environments import detect_environment

        env = detect_environment()
    return env
