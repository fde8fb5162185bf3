"""Under ``mpiexec``: COMM_WORLD is the world, user settings are checked against it.

Also: a lone process (no launcher, no rendezvous) and the torch tutorial's
``run.py`` with only the import changed. Every subprocess has a hard timeout.
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import textwrap
from pathlib import Path

import pytest
from mpirun import Result, run_within

ROOT = Path(__file__).resolve().parents[2]
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
LIMIT = 60

needs_mpiexec = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found")

PRELUDE = """
import os, sys
from datetime import timedelta
from hpcdist.rendezvous import join_world
T = timedelta(seconds=30)


def say(*parts):
    # one write() per line: ranks share mpiexec's stdout and must not interleave within a line
    os.write(1, (" ".join(map(str, parts)) + "\\n").encode())
"""


def clean_env(**extra: str) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_", "MV2_", "PALS_", "JSM_", "FLUX_", "HYDRA_"))
        and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
    }
    env["HPCDIST_ABORT_ON_EXCEPTION"] = "0"
    env.update(extra)
    return env


def mpirun(n: int, code: str, timeout: int = LIMIT, **env: str) -> Result:
    script = PRELUDE + textwrap.dedent(code)
    cmd = [str(MPIEXEC), "-n", str(n), sys.executable, "-c", script]
    return run_within(cmd, clean_env(**env), timeout, cwd=ROOT)


def python(code: str, timeout: int = LIMIT, **env: str) -> Result:
    script = PRELUDE + textwrap.dedent(code)
    return run_within([sys.executable, "-c", script], clean_env(**env), timeout, cwd=ROOT)


def lines(proc: Result, prefix: str) -> list[str]:
    return sorted(line for line in proc.stdout.splitlines() if line.startswith(prefix))


@needs_mpiexec
@pytest.mark.timeout(LIMIT + 10)
def test_launched_takes_rank_from_mpi():
    code = """
    for kw in ({"rank": -1, "world_size": -1}, {"rank": 0, "world_size": 0}):
        for init in (None, "mpi://", "env://", "tcp://10.0.0.1:1", "file:///nonexistent/x"):
            j = join_world(init, store=None, timeout=T, **kw)
            assert j.store is None, j
            assert j.comm.allreduce(1) == 2
            say("OK", init, j.comm.Get_rank(), j.rank, j.world_size, j.launcher)
    """
    proc = mpirun(2, code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    ok = lines(proc, "OK")
    assert len(ok) == 20
    assert all(line.split()[2:] in (["0", "0", "2", "mpiexec"], ["1", "1", "2", "mpiexec"]) for line in ok)


@needs_mpiexec
@pytest.mark.timeout(LIMIT + 10)
@pytest.mark.parametrize(
    ("env", "init", "match"),
    [
        ({"RANK": "5"}, None, "rank 5 from environment variable RANK contradicts the MPI launch"),
        ({"WORLD_SIZE": "3"}, "env://", "world_size 3 from environment variable WORLD_SIZE contradicts"),
        ({}, "tcp://127.0.0.1:29500?world_size=4", "world_size 4 from the init_method URL query"),
    ],
)
def test_launched_contradiction_raises_everywhere(env, init, match):
    code = f"""
    try:
        join_world({init!r}, store=None, rank=-1, world_size=-1, timeout=T)
    except ValueError as exc:
        say("VALUEERROR", exc)
        sys.exit(3)
    say("JOINED")
    """
    proc = mpirun(2, code, **env)
    errors = lines(proc, "VALUEERROR")
    assert len(errors) == 2, proc.stdout + proc.stderr[-2000:]
    assert all(match in line for line in errors), errors
    assert "this process has" in errors[0]


@needs_mpiexec
@pytest.mark.timeout(LIMIT + 10)
def test_launched_one_rank_contradicts_all_raise():
    """Only rank 1 passes a wrong rank: rank 0 raises too, instead of hanging later."""
    code = """
    from mpi4py import MPI
    bad = 7 if MPI.COMM_WORLD.Get_rank() == 1 else 0
    try:
        join_world(None, store=None, rank=bad, world_size=2, timeout=T)
    except ValueError as exc:
        say("VALUEERROR", MPI.COMM_WORLD.Get_rank(), exc)
    """
    proc = mpirun(2, code)
    errors = lines(proc, "VALUEERROR")
    assert len(errors) == 2, proc.stdout + proc.stderr[-2000:]
    assert errors[0].startswith("VALUEERROR 0 rank 1 refused to join: rank 7 from the rank= argument")
    assert errors[1].startswith("VALUEERROR 1 rank 7 from the rank= argument contradicts")


@needs_mpiexec
@pytest.mark.timeout(LIMIT + 10)
def test_group_store_and_torchrun_env():
    code = """
    from hpcdist.rendezvous import group_store, export_torchrun_env
    j = join_world(None, store=None, rank=-1, world_size=-1, timeout=T)
    store = group_store(j.comm, T)
    if j.rank == 0:
        store.set("hello", "from rank 0")
    say("GOT", j.rank, store.get("hello").decode(), store.host)
    os.environ["LOCAL_RANK"] = "99"  # wrong: rewritten
    export_torchrun_env(j.comm, j.rank, j.world_size, store=store)
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    say("ENV", " ".join(os.environ[k] for k in keys), store.port)
    j.comm.Barrier()
    """
    proc = mpirun(2, code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert lines(proc, "GOT") == ["GOT 0 from rank 0 127.0.0.1", "GOT 1 from rank 0 127.0.0.1"]
    env = lines(proc, "ENV")
    assert len(env) == 2
    for rank, line in enumerate(env):
        _, r, n, lr, ln, addr, port, store_port = line.split()
        assert (r, n, lr, ln, addr) == (str(rank), "2", str(rank), "2", "127.0.0.1")
        assert port != store_port and 0 < int(port) < 65536  # a free port for torch code, not our store's


@needs_mpiexec
@pytest.mark.timeout(LIMIT + 10)
def test_init_process_group_under_mpiexec_tutorial_call():
    code = """
    import numpy as np
    import hpcdist as dist
    dist.init_process_group("mpi", rank=0, world_size=0)
    x = np.array([dist.get_rank() + 1.0])
    dist.all_reduce(x)
    say("SUM", dist.get_rank(), dist.get_world_size(), x[0], os.environ["WORLD_SIZE"])
    dist.destroy_process_group()
    """
    proc = mpirun(2, code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert lines(proc, "SUM") == ["SUM 0 2 3.0 2", "SUM 1 2 3.0 2"]


@pytest.mark.timeout(LIMIT + 10)
def test_lone_process_is_a_world_of_one():
    code = """
    j = join_world(None, store=None, rank=-1, world_size=-1, timeout=T)
    say("LONE", j.rank, j.world_size, j.store, j.launcher, j.comm.Get_size())
    import hpcdist as dist
    dist.init_process_group()
    say("DIST", dist.get_rank(), dist.get_world_size())
    dist.destroy_process_group()
    """
    proc = python(code)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert lines(proc, "LONE") == ["LONE 0 1 None None 1"]
    assert lines(proc, "DIST") == ["DIST 0 1"]


@pytest.mark.timeout(LIMIT + 10)
def test_lone_process_field_errors():
    """Without a launcher, each bad field raises ValueError naming it, at once."""
    code = """
    import time
    from hpcdist.store import HashStore
    cases = [
        ("mpi://", None, -1, 2),
        (None, HashStore(), -1, 2),
        (None, HashStore(), 0, -1),
        (None, HashStore(), 2, 2),
        ("tcp://127.0.0.1:0?rank=0&world_size=2", None, -1, -1),
        ("env://", None, 0, 0),
        ("bogus://x", None, 0, 2),
    ]
    for init, store, rank, ws in cases:
        t = time.monotonic()
        try:
            join_world(init, store=store, rank=rank, world_size=ws, timeout=T)
            say("JOINED?!", init)
        except ValueError as exc:
            say("VALUEERROR", round(time.monotonic() - t, 1), exc)
    """
    proc = python(code, MASTER_ADDR="127.0.0.1", MASTER_PORT="29500")
    errors = [line for line in proc.stdout.splitlines() if line.startswith("VALUEERROR")]
    assert len(errors) == 7, proc.stdout + proc.stderr[-2000:]
    expected = [
        "mpiexec -n 2",
        "store= given without rank",
        "store= given without world_size",
        "store= rendezvous: rank must be in [0, world_size) = [0, 2), got 2",
        "tcp:// rendezvous: port must be a TCP port",
        "env:// rendezvous: world_size must be >= 1",
        "No rendezvous handler for bogus://",
    ]
    for line, text in zip(errors, expected):
        assert text in line, (line, text)
        assert float(line.split()[1]) < 1.0  # at once, nothing waited for


@pytest.mark.timeout(LIMIT + 10)
def test_tutorial_run_py():
    """The torch tutorial's run.py, only the import changed: two mp.Process, env://, gloo, send/recv."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = str(s.getsockname()[1])
    proc = run_within(
        [sys.executable, str(ROOT / "examples" / "tutorial_run.py")],
        clean_env(HPCDIST_TUTORIAL_PORT=port),
        LIMIT,
        cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert out.count("has data") == 2 and out.count("tensor(1.)") == 2, out + proc.stderr[-2000:]
