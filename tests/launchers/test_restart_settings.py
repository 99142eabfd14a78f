"""max_restarts as an argument (checked before anything runs), where it applies, and the restart line's summary.

The restarts themselves run real processes: tests/distributed/test_restarts.py.
"""

from __future__ import annotations

import logging
import re

import pytest

import torchfleet as tf
from torchfleet.errors import ConfigurationError
from torchfleet.launchers.base import ProcessFailedError, failure_summary
from torchfleet.preemption import RESTART_VARIABLES, is_restart, restart_count
from torchfleet.strategies import DDPStrategy, FSDPStrategy


@pytest.fixture(autouse=True)
def no_restart_variables(monkeypatch):
    for var in RESTART_VARIABLES:
        monkeypatch.delenv(var, raising=False)


@pytest.mark.parametrize("value", [-1, 1.5, True, "2", None])
def test_bad_values_are_refused_with_what_is_accepted(value):
    with pytest.raises(ConfigurationError, match=re.escape(f"max_restarts={value!r} is not valid: give an int >= 0")):
        tf.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_restarts=value)
    with pytest.raises(ConfigurationError, match="is not valid: give an int >= 0"):
        tf.Fleet(accelerator="cpu", devices=2, strategy="ddp", max_restarts=value)
    with pytest.raises(ConfigurationError, match="is not valid: give an int >= 0"):
        DDPStrategy(max_restarts=value)
    with pytest.raises(ConfigurationError, match="is not valid: give an int >= 0"):
        FSDPStrategy(max_restarts=value)


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn", "fsdp"])
def test_the_trainers_value_reaches_the_launcher(strategy):
    trainer = tf.Trainer(accelerator="cpu", devices=2, strategy=strategy, max_restarts=3)
    assert trainer.strategy.max_restarts == 3
    assert trainer.strategy.launcher.max_restarts == 3
    # the default fails at the first failure, as before
    assert tf.Trainer(accelerator="cpu", devices=2, strategy=strategy).strategy.launcher.max_restarts == 0


def test_a_strategy_objects_value_is_kept_and_a_different_one_refused():
    trainer = tf.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(max_restarts=2))
    assert trainer.strategy.launcher.max_restarts == 2
    tf.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(max_restarts=2), max_restarts=2)  # the same: fine
    with pytest.raises(ConfigurationError, match="max_restarts=1 disagrees with the strategy object's max_restarts=2"):
        tf.Trainer(accelerator="cpu", devices=2, strategy=DDPStrategy(max_restarts=2), max_restarts=1)


def test_several_machines_under_our_own_launcher_are_refused(monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")  # as each machine of a run started by hand has
    monkeypatch.setenv("MASTER_PORT", "29500")
    with pytest.raises(ConfigurationError, match="restarts the ranks of one machine only") as info:
        tf.Trainer(accelerator="cpu", devices=2, num_nodes=2, strategy="ddp", max_restarts=1)
    assert "torchrun" in str(info.value)


def test_where_nothing_can_restart_it_says_so(monkeypatch, caplog):
    with caplog.at_level(logging.WARNING):
        tf.Trainer(accelerator="cpu", devices=1, max_restarts=1)
    assert "max_restarts=1 has no effect with SingleDeviceStrategy" in caplog.text
    caplog.clear()
    for key, value in {"TORCHELASTIC_RUN_ID": "x", "RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                       "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(key, value)
    with caplog.at_level(logging.WARNING):
        tf.Trainer(accelerator="cpu", devices=2, strategy="ddp", max_restarts=2)
    assert "max_restarts=2 has no effect here: TorchElasticEnvironment started the ranks" in caplog.text
    assert "TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1" in caplog.text


def test_the_restart_count_is_the_largest_of_ours_torchruns_and_slurms(monkeypatch):
    assert restart_count() == 0 and not is_restart()
    monkeypatch.setenv("TF_RESTART_COUNT", "2")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert restart_count() == 2 and is_restart()
    monkeypatch.setenv("SLURM_RESTART_COUNT", "5")
    assert restart_count() == 5
    assert tf.Fleet(accelerator="cpu", devices=1).restart_count == 5


def test_the_restart_line_names_the_rank_and_why():
    raised = ProcessFailedError(1, "Traceback (most recent call last):\n  File \"x.py\", line 3\nValueError: boom\n", 1)
    assert failure_summary(raised, 0) == "rank 1 failed (exit code 1): ValueError: boom"
    killed = ProcessFailedError(3, "it left no Python traceback (killed by SIGKILL); its own output above may say more.",
                                -9)
    assert failure_summary(killed, 0) == "rank 3 failed (killed by SIGKILL)"
    assert failure_summary(RuntimeError("out of memory\nmore"), 4) == "rank 4 raised RuntimeError: out of memory"


def test_under_torchfleet_run_the_command_owns_restarts(monkeypatch, caplog, tmp_path):
    from torchfleet.cli_run import run

    script = tmp_path / "train.py"
    script.write_text("")
    with pytest.raises(ConfigurationError, match=re.escape("max_restarts=-1 is not valid")):
        run([str(script), "--max-restarts", "-1"])
    with pytest.raises(ConfigurationError, match="each machine would restart its own processes alone"):
        run([str(script), "--max-restarts", "1", "--num-nodes", "2", "--main-port", "29500"])
    # in a process `torchfleet run` started, Fleet(max_restarts=...) points to the command's option
    for key, value in {"TF_RUN_STARTED": "1", "TF_ERROR_DIR": str(tmp_path), "LOCAL_RANK": "0", "WORLD_SIZE": "2",
                       "NODE_RANK": "0", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}.items():
        monkeypatch.setenv(key, value)
    with caplog.at_level(logging.WARNING):
        tf.Fleet(accelerator="cpu", devices=2, strategy="ddp", max_restarts=1)
    assert "`torchfleet run` started the processes, so it is what restarts them: give it --max-restarts 1" in caplog.text
