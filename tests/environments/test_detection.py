"""detect_environment(): which environment wins, alone and when several match."""

from __future__ import annotations

import pytest

from torchfleet.environments import (
    ClusterEnvironment,
    KubeflowEnvironment,
    LocalEnvironment,
    LSFEnvironment,
    MPIEnvironment,
    SLURMEnvironment,
    TorchElasticEnvironment,
    detect_environment,
)

TORCHRUN = dict(TORCHELASTIC_RUN_ID="r1", RANK=1, WORLD_SIZE=2, LOCAL_RANK=1, GROUP_RANK=0, LOCAL_WORLD_SIZE=2,
                MASTER_ADDR="n0", MASTER_PORT=29500)
SLURM = dict(SLURM_NTASKS=2, SLURM_PROCID=1, SLURM_LOCALID=1, SLURM_NODEID=0, SLURM_NODELIST="n0",
             SLURM_JOB_ID=4242, SLURM_JOB_NAME="train", SLURM_TASKS_PER_NODE=2)
LSF = dict(LSB_JOBID=77, JSM_NAMESPACE_SIZE=2, JSM_NAMESPACE_RANK=1, JSM_NAMESPACE_LOCAL_RANK=1,
           LSB_MCPU_HOSTS="batch 1 n0 2")
MPI = dict(OMPI_COMM_WORLD_SIZE=2, OMPI_COMM_WORLD_RANK=1, OMPI_COMM_WORLD_LOCAL_RANK=1)
KUBEFLOW = dict(KUBERNETES_PORT="tcp://10.0.0.1:443", MASTER_ADDR="job-master-0", MASTER_PORT=23456, WORLD_SIZE=2,
                RANK=1)


@pytest.mark.parametrize(
    "variables, expected",
    [
        ({}, LocalEnvironment),
        (TORCHRUN, TorchElasticEnvironment),
        (SLURM, SLURMEnvironment),
        (LSF, LSFEnvironment),
        (MPI, MPIEnvironment),
        (KUBEFLOW, KubeflowEnvironment),
    ],
)
def test_each_environment_alone(env, variables, expected):
    env(**variables)
    found = detect_environment()
    assert type(found) is expected
    assert isinstance(found, ClusterEnvironment)
    # and no other environment claims these variables (Local always does: it is the fallback)
    others = [e for e in (TorchElasticEnvironment, SLURMEnvironment, LSFEnvironment, MPIEnvironment,
                          KubeflowEnvironment) if e is not expected and e.detect()]
    assert others == []


@pytest.mark.parametrize(
    "layers, expected",
    [
        ((SLURM, TORCHRUN), TorchElasticEnvironment),  # torchrun inside an sbatch job
        ((MPI, TORCHRUN), TorchElasticEnvironment),
        ((LSF, SLURM), SLURMEnvironment),
        ((MPI, SLURM), SLURMEnvironment),  # srun --mpi=pmi2 sets PMI_* too
        ((MPI, LSF), LSFEnvironment),
        ((KUBEFLOW, MPI), MPIEnvironment),
        ((KUBEFLOW, SLURM, LSF, MPI), SLURMEnvironment),
        ((KUBEFLOW, SLURM, LSF, MPI, TORCHRUN), TorchElasticEnvironment),
    ],
)
def test_detection_order(env, layers, expected):
    for variables in layers:
        env(**variables)
    assert type(detect_environment()) is expected


def test_torchrun_inside_a_kubeflow_pod_is_torchelastic(env):
    env(**KUBEFLOW, LOCAL_RANK=0, GROUP_RANK=1)
    assert not KubeflowEnvironment.detect()
    assert type(detect_environment()) is TorchElasticEnvironment


def test_torchelastic_without_run_id_needs_all_five(env):
    env(RANK=0, WORLD_SIZE=2, LOCAL_RANK=0, MASTER_ADDR="n0")
    assert not TorchElasticEnvironment.detect()
    env(MASTER_PORT=1)
    assert TorchElasticEnvironment.detect()


def test_our_own_launcher_children_stay_local(env):
    # the script launcher exports these (no RANK), so its children are not mistaken for torchrun's
    env(LOCAL_RANK=1, NODE_RANK=0, WORLD_SIZE=2, MASTER_ADDR="127.0.0.1", MASTER_PORT=12345)
    assert type(detect_environment()) is LocalEnvironment


@pytest.mark.parametrize("job_name", ["bash", "interactive"])
def test_interactive_slurm_shell_is_local(env, job_name):
    env(**SLURM)
    env(SLURM_JOB_NAME=job_name)
    assert type(detect_environment()) is LocalEnvironment


def test_mpi_needs_size_and_rank(env):
    env(PMI_SIZE=2)
    assert not MPIEnvironment.detect()
    env(PMI_RANK=0)
    assert MPIEnvironment.detect()


def test_detect_returns_a_fresh_object(env):
    assert detect_environment() is not detect_environment()
