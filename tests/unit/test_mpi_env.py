"""What MPI settings a launcher-free world starts the embedded MPICH with (hpcdist.rendezvous.mpi_env)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hpcdist.rendezvous.mpi_env import _local_processes, choose


def test_the_embedded_mpich_loads_without_ucx_memory_hooks_unless_the_user_chose():
    assert choose({}, cpus=8, embedded=True) == {"UCX_MEM_EVENTS": "no"}
    for name in ("UCX_MEM_EVENTS", "UCX_MEM_MMAP_HOOK_MODE", "UCX_MEM_MALLOC_HOOKS"):
        assert choose({name: "yes"}, cpus=8, embedded=True) == {}, name


def test_a_system_mpi_or_the_knob_gets_nothing():
    assert choose({}, cpus=1, embedded=False) == {}
    assert choose({"HPCDIST_MPI_TUNE": "0", "LOCAL_WORLD_SIZE": "64"}, cpus=1, embedded=True) == {}
    with pytest.raises(ValueError, match="HPCDIST_MPI_TUNE"):
        choose({"HPCDIST_MPI_TUNE": "maybe"}, cpus=1, embedded=True)


@pytest.mark.parametrize(
    ("env", "local"),
    [
        ({"LOCAL_WORLD_SIZE": "6"}, 6),
        ({"WORLD_SIZE": "8", "MASTER_ADDR": "127.0.0.1"}, 8),
        ({"WORLD_SIZE": "8", "MASTER_ADDR": "localhost"}, 8),
        ({"WORLD_SIZE": "8", "MASTER_ADDR": "::1"}, 8),
        ({"WORLD_SIZE": "8", "MASTER_ADDR": "10.0.0.7"}, None),  # the others may be on other hosts
        ({"WORLD_SIZE": "8", "MASTER_ADDR": "node17"}, None),
        ({"WORLD_SIZE": "8"}, None),
        ({"LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "8", "MASTER_ADDR": "127.0.0.1"}, 2),
    ],
)
def test_how_many_processes_share_this_host(env, local):
    assert _local_processes(env) == local


def test_heavy_yield_only_when_the_host_is_oversubscribed():
    busy = {"WORLD_SIZE": "8", "MASTER_ADDR": "127.0.0.1"}
    assert choose(busy, cpus=2, embedded=True)["MPIR_CVAR_ENABLE_HEAVY_YIELD"] == "1"
    assert "MPIR_CVAR_ENABLE_HEAVY_YIELD" not in choose(busy, cpus=8, embedded=True)
    assert "MPIR_CVAR_ENABLE_HEAVY_YIELD" not in choose({**busy, "MPIR_CVAR_ENABLE_HEAVY_YIELD": "0"}, 2, True)


_PROBE = """
import json, os, hpcdist as dist
dist.init_process_group("mpi")
print(json.dumps({k: os.environ.get(k) for k in ("UCX_MEM_EVENTS", "MPIR_CVAR_ENABLE_HEAVY_YIELD")}))
dist.destroy_process_group()
"""


def _run(extra: dict[str, str]) -> dict[str, str | None]:
    env = {
        k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "MPIR_CVAR_", "PMI_", "HYDRA_", "HPCDIST_MPI"))
    }
    env.update(RANK="0", WORLD_SIZE="1", HPCDIST_ABORT_ON_EXCEPTION="0", **extra)
    r = subprocess.run([sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout.strip().splitlines()[-1])


@pytest.mark.timeout(300)
def test_a_launcher_free_process_starts_mpi_with_them_and_keeps_the_users_values():
    from hpcdist.rendezvous.mpi_env import embedded_mpich

    if not embedded_mpich(os.environ):
        pytest.skip("not the embedded MPICH: hpcdist sets nothing")
    assert _run({}) == {"UCX_MEM_EVENTS": "no", "MPIR_CVAR_ENABLE_HEAVY_YIELD": None}
    assert _run({"LOCAL_WORLD_SIZE": "512"}) == {"UCX_MEM_EVENTS": "no", "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}
    assert _run({"UCX_MEM_EVENTS": "yes"})["UCX_MEM_EVENTS"] == "yes"
    assert _run({"HPCDIST_MPI_TUNE": "0"}) == {"UCX_MEM_EVENTS": None, "MPIR_CVAR_ENABLE_HEAVY_YIELD": None}


@pytest.mark.timeout(300)
def test_under_a_launcher_hpcdist_sets_no_mpi_variable():
    import shutil

    mpiexec = shutil.which("mpiexec")
    if mpiexec is None:
        pytest.skip("no mpiexec on PATH")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("UCX_", "MPIR_CVAR_", "HPCDIST_MPI"))}
    env.update(HPCDIST_ABORT_ON_EXCEPTION="0", LOCAL_WORLD_SIZE="512")
    r = subprocess.run(
        [mpiexec, "-n", "1", sys.executable, "-c", _PROBE], env=env, capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout.strip().splitlines()[-1]) == {
        "UCX_MEM_EVENTS": None,
        "MPIR_CVAR_ENABLE_HEAVY_YIELD": None,
    }
