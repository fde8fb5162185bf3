"""Launcher detection from environment variables alone."""

from __future__ import annotations

import pytest

from hpcdist.rendezvous.detect import detect_launcher, launcher_local_rank_size, launcher_rank_size

CASES = [
    ({}, None, None),
    ({"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "4"}, "mpiexec", (1, 4)),
    ({"PMI_RANK": "1", "PMI_SIZE": "4", "I_MPI_ROOT": "/opt/intel/mpi"}, "intelmpi", (1, 4)),
    ({"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "3"}, "openmpi", (2, 3)),
    ({"PMIX_RANK": "2"}, "pmix", None),
    ({"MV2_COMM_WORLD_RANK": "0", "MV2_COMM_WORLD_SIZE": "2"}, "mvapich", (0, 2)),
    ({"PALS_RANKID": "3", "PMI_SIZE": "8", "PMI_RANK": "3"}, "pals", (3, 8)),
    ({"JSM_NAMESPACE_RANK": "5", "JSM_NAMESPACE_SIZE": "6"}, "jsrun", (5, 6)),
    ({"FLUX_TASK_RANK": "1", "FLUX_JOB_SIZE": "2"}, "flux", (1, 2)),
    ({"SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_NTASKS": "4"}, "srun", (3, 4)),
    ({"SLURM_STEP_ID": "1", "SLURM_PROCID": "3", "SLURM_NTASKS": "8", "SLURM_STEP_NUM_TASKS": "4"}, "srun", (3, 4)),
    # the batch script itself was not started by srun
    ({"SLURM_STEP_ID": "batch", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, None, None),
    ({"SLURM_STEP_ID": "4294967294", "SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, None, None),
    # no step id: an sbatch shell, not srun
    ({"SLURM_PROCID": "0", "SLURM_NTASKS": "4"}, None, None),
    # srun --mpi=pmi2: PMI and Slurm agree -> srun
    (
        {"PMI_RANK": "3", "PMI_SIZE": "4", "SLURM_STEP_ID": "0", "SLURM_PROCID": "3", "SLURM_NTASKS": "4"},
        "srun",
        (3, 4),
    ),
    # mpiexec whose proxies srun started: Slurm describes the proxy, PMI the rank -> mpiexec
    (
        {"PMI_RANK": "5", "PMI_SIZE": "8", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"},
        "mpiexec",
        (5, 8),
    ),
    # srun --mpi=pmix: PMIx gives no size, Slurm does
    ({"PMIX_RANK": "1", "SLURM_STEP_ID": "0", "SLURM_PROCID": "1", "SLURM_NTASKS": "2"}, "srun", (1, 2)),
    # garbage and out-of-range values give no rank/size
    ({"PMI_RANK": "x", "PMI_SIZE": "4"}, "mpiexec", None),
    ({"PMI_RANK": "4", "PMI_SIZE": "4"}, "mpiexec", None),
    ({"PMI_RANK": "", "PMI_SIZE": "4"}, None, None),
]


@pytest.mark.parametrize(("env", "name", "rank_size"), CASES)
def test_detect(env, name, rank_size):
    assert detect_launcher(env) == name
    assert launcher_rank_size(env) == rank_size


def test_local_rank_size():
    env = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4"}
    env.update(OMPI_COMM_WORLD_LOCAL_RANK="0", OMPI_COMM_WORLD_LOCAL_SIZE="2")
    assert launcher_local_rank_size(env) == (0, 2)
    assert launcher_local_rank_size({}) == (None, None)


def test_reads_os_environ_by_default(monkeypatch):
    monkeypatch.setenv("FLUX_TASK_RANK", "0")
    monkeypatch.setenv("FLUX_JOB_SIZE", "1")
    for name in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "MV2_COMM_WORLD_RANK", "PALS_RANKID", "JSM_NAMESPACE_RANK"):
        monkeypatch.delenv(name, raising=False)
    assert detect_launcher() == "flux"
    assert launcher_rank_size() == (0, 1)
