"""Importing torchfleet configures none of the program's logging; a Trainer shows its info lines when it is built."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

_FIT = """
    import torch
    from torch.utils.data import DataLoader, TensorDataset

    class Tiny(torchfleet.Module):
        def __init__(self):
            super().__init__()
            self.layer = torch.nn.Linear(2, 1)

        def training_step(self, batch, batch_idx):
            return self.layer(batch[0]).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    trainer = torchfleet.Trainer(accelerator="cpu", max_epochs=1, logger=False, enable_checkpointing=False,
                                 enable_progress_bar=False, default_root_dir=ROOT)
    trainer.fit(Tiny(), DataLoader(TensorDataset(torch.randn(4, 2)), batch_size=2))
"""


def _run(code: str, tmp_path) -> subprocess.CompletedProcess:
    """Run ``code`` and then a one-epoch fit in a fresh Python."""
    src = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [src, os.environ.get("PYTHONPATH")]))}
    program = f"ROOT = {str(tmp_path)!r}\n" + textwrap.dedent(code) + textwrap.dedent(_FIT)
    return subprocess.run([sys.executable, "-c", program], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=240, check=True)


def test_import_adds_no_handler_and_a_trainer_still_prints_its_lines(tmp_path):
    done = _run("""
        import logging
        import torchfleet, torchfleet.trainer.trainer

        def streams(name):
            return [h for h in logging.getLogger(name).handlers if not isinstance(h, logging.NullHandler)]

        print("after import:", streams(None), streams("torchfleet"))
    """, tmp_path)
    assert "after import: [] []" in done.stdout
    # the Trainer attached its handler: the summary of the model and strategy is shown, once
    assert done.stderr.count("Tiny on cpu, SingleDeviceStrategy, precision 32-true") == 1, done.stderr
    assert "3 trainable, 0 frozen, 3 total parameters" in done.stderr


def test_a_program_that_configured_logging_gets_the_lines_through_its_own_handler(tmp_path):
    done = _run("""
        import logging
        import torchfleet
        from torchfleet import Trainer  # imported before the program sets its logging up

        logging.basicConfig(format="mine| %(message)s")
    """, tmp_path)
    lines = [line for line in done.stderr.splitlines() if "SingleDeviceStrategy, precision 32-true" in line]
    assert lines == ["mine| Tiny on cpu, SingleDeviceStrategy, precision 32-true:"], done.stderr
