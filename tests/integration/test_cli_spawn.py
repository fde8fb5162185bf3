"""hpcdist.spawn (like torch.multiprocessing.spawn): ranks without an MPI launcher."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from mpirun import Result, run_within

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = r"""
import os, sys, time
import numpy as np
from hpcdist.launch.spawn import ProcessExitedException, ProcessRaisedException, spawn

def show_env(rank, tag):
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
    vals = " ".join(os.environ[k] for k in keys)
    sys.stdout.write(f"ENV {tag} {rank} {vals} {'PMI_RANK' in os.environ}\n")  # one write: no interleaving
    sys.stdout.flush()

def fail_on_1(rank):
    if rank == 1:
        raise KeyError("child one failed")
    time.sleep(60)

def die_on_0(rank):
    if rank == 0:
        os._exit(7)
    time.sleep(60)

def sleep(rank):
    time.sleep(60)

def allreduce(rank):
    import hpcdist as dist
    dist.init_process_group("mpi", init_method="env://")
    x = np.array([rank + 1.0])
    dist.all_reduce(x)
    sys.stdout.write(f"WORLD {dist.get_rank()} {dist.get_world_size()} {x[0]}\n")
    sys.stdout.flush()
    dist.destroy_process_group()

if __name__ == "__main__":
    case = sys.argv[1]
    t0 = time.monotonic()
    try:
        if case == "env":
            os.environ["PMI_RANK"] = "5"  # a launcher variable of the parent must not leak
            spawn(show_env, args=("x",), nprocs=3)
        elif case == "raise":
            spawn(fail_on_1, nprocs=2)
        elif case == "exit":
            spawn(die_on_0, nprocs=2)
        elif case == "timeout":
            spawn(sleep, nprocs=2, timeout=2)
        elif case == "nojoin":
            ctx = spawn(show_env, args=("y",), nprocs=2, join=False)
            while not ctx.join(timeout=1):
                pass
            print("PIDS", len(ctx.pids()))
        elif case == "allreduce":
            spawn(allreduce, nprocs=2, timeout=60)
    except Exception as exc:
        print("CAUGHT", type(exc).__name__, getattr(exc, "error_index", None), f"{time.monotonic() - t0:.1f}")
        print(exc)
"""


def run_case(tmp_path: Path, case: str) -> Result:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    for name in list(env):
        if name.startswith(("PMI_", "OMPI_", "SLURM_")):
            env.pop(name)
    return run_within([sys.executable, str(script), case], env, 80)


@pytest.mark.timeout(90)
def test_env_variables(tmp_path):
    proc = run_case(tmp_path, "env")
    assert proc.returncode == 0, proc.stderr
    rows = sorted(line.split() for line in proc.stdout.splitlines() if line.startswith("ENV"))
    assert [r[2:7] for r in rows] == [[str(i), str(i), "3", str(i), "3"] for i in range(3)]
    assert {r[7] for r in rows} == {"127.0.0.1"} and len({r[8] for r in rows}) == 1
    assert {r[9] for r in rows} == {"False"}


@pytest.mark.timeout(90)
def test_child_exception_reraised_with_traceback(tmp_path):
    proc = run_case(tmp_path, "raise")
    caught = proc.stdout.split("\n", 1)[0].split()
    assert caught[:3] == ["CAUGHT", "ProcessRaisedException", "1"], proc.stdout + proc.stderr
    assert float(caught[3]) < 30  # rank 0 (sleeping 60 s) was terminated
    assert "-- Process 1 terminated with the following error:" in proc.stdout
    assert "KeyError: 'child one failed'" in proc.stdout and 'raise KeyError("child one failed")' in proc.stdout


@pytest.mark.timeout(90)
def test_child_exit_without_exception(tmp_path):
    proc = run_case(tmp_path, "exit")
    assert proc.stdout.split()[:3] == ["CAUGHT", "ProcessExitedException", "0"], proc.stdout + proc.stderr
    assert "exit code 7" in proc.stdout


@pytest.mark.timeout(90)
def test_timeout(tmp_path):
    proc = run_case(tmp_path, "timeout")
    assert proc.stdout.split()[:2] == ["CAUGHT", "DistTimeoutError"], proc.stdout + proc.stderr


@pytest.mark.timeout(90)
def test_join_false_returns_context(tmp_path):
    proc = run_case(tmp_path, "nojoin")
    assert proc.returncode == 0, proc.stderr
    assert "PIDS 2" in proc.stdout


@pytest.mark.timeout(90)
def test_env_rendezvous_end_to_end(tmp_path):
    proc = run_case(tmp_path, "allreduce")
    assert proc.returncode == 0 and "CAUGHT" not in proc.stdout, proc.stdout + proc.stderr
    rows = sorted(line for line in proc.stdout.splitlines() if line.startswith("WORLD"))
    assert rows == ["WORLD 0 2 3.0", "WORLD 1 2 3.0"]


def test_argument_errors():
    from hpcdist.launch.spawn import spawn

    with pytest.raises(ValueError, match="nprocs must be an int >= 1, got 0"):
        spawn(print, nprocs=0)
    with pytest.raises(TypeError, match="args must be a tuple, got list"):
        spawn(print, args=[1])  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="fn must be callable"):
        spawn(3)  # type: ignore[arg-type]
