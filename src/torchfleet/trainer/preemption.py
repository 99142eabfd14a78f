"""Preemption in the Trainer: the signal flag for the duration of fit, the agreed stop, the preemption checkpoint.

``FitPreemption`` is entered by each rank around its fit stage. The fit loop polls its
``StopAgreement`` after every optimizer step; when the ranks agree that a SIGTERM/SIGUSR1 arrived,
``stop`` writes ``preempted.ckpt`` (every rank takes part in the strategy's atomic save, as for any
checkpoint) at that step, exactly where an uninterrupted run would continue, asks the cluster
environment to requeue the job (SLURM), and raises ``Preempted`` (exit code 75). The epoch-end hooks
do not run: the epoch is not over, and callbacks such as EarlyStopping must not count it. Which
checkpoint a restarted run resumes from is decided in ``checkpointing.resolve_ckpt_path``.
"""

from __future__ import annotations

import logging
import os
import signal
import time
from typing import TYPE_CHECKING, Any, NoReturn

from torchfleet.preemption import EXIT_CODE, Preempted, SignalFlag, StopAgreement, signal_name

if TYPE_CHECKING:
    from torchfleet.trainer.trainer import Trainer

log = logging.getLogger("torchfleet")

#: the file name of the checkpoint a preempted fit writes
PREEMPTED_NAME = "preempted.ckpt"


def preemption_checkpoint_path(trainer: Trainer) -> str:
    """Where a preempted fit saves: the first ModelCheckpoint's folder, else ``<default_root_dir>/checkpoints``."""
    ck = trainer.checkpoint_callback
    folder = ck.dirpath if ck is not None and ck.dirpath else os.path.join(trainer.default_root_dir, "checkpoints")
    return os.path.join(folder, PREEMPTED_NAME)


class FitPreemption:
    """The preemption signals recorded while one rank's fit runs (installed on enter, restored on exit)."""

    def __init__(self, trainer: Trainer) -> None:
        self.trainer = trainer
        self.flag = SignalFlag()
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

    def start_loop(self) -> StopAgreement:
        """The agreement the fit loop polls (every rank creates it at the same point)."""
        self.agreement = StopAgreement(self.flag, self.trainer.strategy.world_size)
        return self.agreement

    def stop(self, signum: int) -> NoReturn:
        """Every rank, after the same step: save the preemption checkpoint, requeue, raise ``Preempted``."""
        trainer = self.trainer
        name = signal_name(signum)
        path = preemption_checkpoint_path(trainer)
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
        raise Preempted(message, name, path)


def _cluster_environment(trainer: Trainer) -> Any:
    env = getattr(trainer.strategy, "cluster_environment", None)
    if env is None:
        from torchfleet.environments import detect_environment

        env = detect_environment()
    return env
