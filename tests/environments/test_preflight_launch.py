"""The pre-flight check of a launch (devices x num_nodes against the environment) runs where Lightning's launcher
runs it: a Trainer for a layout this machine cannot start is built, and ``fit`` refuses it before any rank starts."""

from __future__ import annotations

import subprocess

import pytest

from tests.helpers import RegressionData, Regressor, quiet
from torchfleet import Trainer
from torchfleet.environments import LocalEnvironment, SLURMEnvironment
from torchfleet.errors import ConfigurationError
from torchfleet.launchers import processes


@pytest.fixture
def no_rank_starts(monkeypatch):
    """Fail the test if a rank process is started: the check must come first."""

    def refuse(*args, **kwargs):
        raise AssertionError("a rank was started before the pre-flight check")

    monkeypatch.setattr(subprocess, "Popen", refuse)
    monkeypatch.setattr(processes.ProcessLauncher, "_launch_once", refuse)


@pytest.mark.parametrize("strategy", ["ddp", "ddp_spawn"])
@pytest.mark.parametrize("devices", [1, 2])
def test_several_nodes_without_an_address_are_refused_when_fit_launches(env, no_rank_starts, strategy, devices):
    env()  # no MASTER_ADDR/MASTER_PORT, no scheduler
    trainer = Trainer(strategy=strategy, devices=devices, num_nodes=2, max_epochs=1, **quiet())
    assert trainer.strategy.num_nodes == 2
    assert isinstance(trainer.strategy.cluster_environment, LocalEnvironment)
    with pytest.raises(ConfigurationError, match="num_nodes=2 without a cluster scheduler needs MASTER_ADDR and "
                                                 "MASTER_PORT") as info:
        trainer.fit(Regressor(), datamodule=RegressionData())
    assert "NODE_RANK=0..1" in str(info.value)


def test_slurm_tasks_per_node_against_devices_is_refused_when_fit_launches(env, no_rank_starts):
    env(SLURM_NTASKS=2, SLURM_NTASKS_PER_NODE=1, SLURM_JOB_NAME="train", SLURM_NODEID=0, SLURM_PROCID=1,
        SLURM_LOCALID=1, SLURM_NODELIST="127.0.0.1", SLURM_JOB_ID=1234)
    trainer = Trainer(strategy="ddp", devices=2, max_epochs=1, **quiet())
    assert isinstance(trainer.strategy.cluster_environment, SLURMEnvironment)
    assert trainer.strategy.local_rank == 1
    with pytest.raises(ConfigurationError, match=r"the number of tasks per node configured in SLURM \(1\) does not "
                                                 "match") as info:
        trainer.fit(Regressor(), datamodule=RegressionData())
    assert "devices=2" in str(info.value) and "--ntasks-per-node=2" in str(info.value)


def test_a_torchrun_rank_beyond_devices_builds_and_is_refused_when_fit_launches(env, no_rank_starts):
    # torchrun --nproc-per-node=2 with Trainer(devices=1): rank 1 has no device of its own until the check runs
    env(TORCHELASTIC_RUN_ID="x", RANK=1, LOCAL_RANK=1, GROUP_RANK=0, WORLD_SIZE=2, LOCAL_WORLD_SIZE=2,
        MASTER_ADDR="127.0.0.1", MASTER_PORT=29511)
    trainer = Trainer(strategy="ddp", devices=1, max_epochs=1, **quiet())
    with pytest.raises(ConfigurationError, match=r"torchrun started 2 processes \(WORLD_SIZE=2\)"):
        trainer.fit(Regressor(), datamodule=RegressionData())


def test_fleet_setup_without_launch_checks_a_torchrun_rank(env):
    from torchfleet import Fleet

    env(TORCHELASTIC_RUN_ID="x", RANK=1, LOCAL_RANK=1, GROUP_RANK=0, WORLD_SIZE=2, LOCAL_WORLD_SIZE=2,
        MASTER_ADDR="127.0.0.1", MASTER_PORT=29512)
    fleet = Fleet(accelerator="cpu", strategy="ddp", devices=1)
    with pytest.raises(ConfigurationError, match=r"torchrun started 2 processes \(WORLD_SIZE=2\)"):
        fleet.setup(Regressor())
