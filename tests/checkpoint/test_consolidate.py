"""``torchfleet consolidate`` and read_full_checkpoint on inputs that need no processes.

Consolidating real fsdp and DeepSpeed shards is tested with the checkpoints those tests write
(tests/distributed/test_fsdp.py, tests/distributed/test_deepspeed.py).
"""

from __future__ import annotations

import pytest
import torch

import torchfleet as tf
from tests.helpers import Regressor, loader, quiet
from torchfleet.checkpoint.consolidate import consolidate
from torchfleet.cli import main
from torchfleet.errors import CheckpointError


@pytest.fixture
def single_file(tmp_path):
    model = Regressor()
    trainer = tf.Trainer(max_epochs=1, **quiet())
    trainer.fit(model, loader())
    path = tmp_path / "run.ckpt"
    trainer.save_checkpoint(path)
    return path, {k: v.clone() for k, v in model.state_dict().items()}


def test_a_single_file_consolidates_to_weights_only_by_default(single_file, tmp_path, capsys):
    path, weights = single_file
    out = tmp_path / "weights.pt"
    assert main(["consolidate", str(path), str(out)]) == 0
    printed = capsys.readouterr().out
    assert "4 tensors" in printed and f"{8 * 16 + 16 + 16 + 1:,} parameters" in printed
    checkpoint = torch.load(out, weights_only=False)
    assert "optimizer_states" not in checkpoint and checkpoint["global_step"] == 8
    plain = Regressor()
    plain.load_state_dict(checkpoint["state_dict"])
    for k, v in weights.items():
        assert torch.equal(plain.state_dict()[k], v)


def test_with_optimizer_keeps_what_resuming_needs(single_file, tmp_path):
    path, _ = single_file
    out = tmp_path / "full.pt"
    summary = consolidate(path, out, with_optimizer=True)
    assert summary["optimizer"] and "optimizer_states" in summary["entries"]
    model = Regressor()
    trainer = tf.Trainer(max_epochs=2, **quiet())
    trainer.fit(model, loader(), ckpt_path=str(out))
    assert trainer.global_step == 16  # resumed at step 8, trained the second epoch only


def test_missing_input_is_one_line_and_exit_2(tmp_path, capsys):
    assert main(["consolidate", str(tmp_path / "nope.ckpt"), str(tmp_path / "out.pt")]) == 2
    err = capsys.readouterr().err
    assert "torchfleet consolidate: error:" in err and "does not exist" in err and "Traceback" not in err


def test_a_directory_that_is_not_a_checkpoint(tmp_path, capsys):
    (tmp_path / "half.ckpt").mkdir()
    (tmp_path / "half.ckpt" / "__0_0.distcp").write_bytes(b"x")
    assert main(["consolidate", str(tmp_path / "half.ckpt"), str(tmp_path / "out.pt")]) == 2
    err = capsys.readouterr().err
    assert "never finished saving" in err and not (tmp_path / "out.pt").exists()


def test_refuses_to_overwrite_its_input(single_file):
    path, _ = single_file
    with pytest.raises(CheckpointError, match="would overwrite its input"):
        consolidate(path, path)


def test_usage_errors_exit_2(capsys):
    assert main(["consolidate"]) == 2
    assert "CKPT" in capsys.readouterr().err
