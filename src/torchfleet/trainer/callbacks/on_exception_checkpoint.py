"""OnExceptionCheckpoint: the training state written to one file when a stage raises, removed when it ends well."""

from __future__ import annotations

import logging
import os
from typing import Any

from torchfleet.errors import ConfigurationError
from torchfleet.trainer.callbacks.base import Checkpoint

log = logging.getLogger("torchfleet")


class OnExceptionCheckpoint(Checkpoint):
    """Save ``<dirpath>/<filename>.ckpt`` through ``trainer.save_checkpoint`` when an exception leaves the stage.

    Lightning's callback of the same name and arguments. The file holds what a normal checkpoint holds at the step
    reached, so ``fit(ckpt_path=...)`` resumes from it. A stage that ends without an exception removes it at
    ``teardown`` (rank 0, through the strategy), so the file exists only while it describes an interrupted run.

    In a run of several processes the save is skipped with a warning: a checkpoint is written collectively, and a
    rank that raised alone would wait in that save for ranks that are elsewhere (torchfleet's ModelCheckpoint
    ``save_on_exception`` makes the same choice; Lightning saves, and hangs in that case).
    """

    FILE_EXTENSION = ".ckpt"

    def __init__(self, dirpath: str | os.PathLike, filename: str = "on_exception") -> None:
        if not filename:
            raise ConfigurationError(
                f"OnExceptionCheckpoint(filename={filename!r}) is not valid: give the name of the file to write "
                "(without the .ckpt extension), e.g. the default 'on_exception'.")
        self.dirpath = dirpath
        self.filename = filename

    @property
    def ckpt_path(self) -> str:
        """The file written on an exception."""
        return os.path.join(self.dirpath, self.filename + self.FILE_EXTENSION)

    def on_exception(self, trainer: Any, module: Any, exception: BaseException) -> None:
        if trainer.world_size > 1:
            log.warning("OnExceptionCheckpoint saves nothing in a %d-process run: the %s may have been raised on "
                        "this rank alone, and a collective save would then hang.", trainer.world_size,
                        type(exception).__name__)
            return
        trainer.save_checkpoint(self.ckpt_path)
        log.warning("%s raised at step %d; saved the training state to %s", type(exception).__name__,
                    trainer.global_step, self.ckpt_path)

    def teardown(self, trainer: Any, module: Any, stage: str) -> None:
        trainer.strategy.remove_checkpoint(self.ckpt_path)
