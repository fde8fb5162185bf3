"""hpcdist.spawn against torch.multiprocessing.spawn (adversarial round); each test failed before its fix."""

from __future__ import annotations

import os
import re
import sys
import textwrap
from pathlib import Path

import pytest
from mpirun import Result, run_within

from hpcdist.launch.spawn import spawn

ROOT = Path(__file__).resolve().parents[2]

PROGRAM = r"""
import os, sys, time
from hpcdist.launch.spawn import ProcessExitedException, ProcessRaisedException, spawn

def exit_3_on_1(rank):
    if rank == 1:
        sys.exit(3)
    time.sleep(60)

def exit_text_on_0(rank):
    if rank == 0:
        sys.exit("cannot go on")
    time.sleep(60)

def fine(rank):
    pass

if __name__ == "__main__":
    case = sys.argv[1]
    t0 = time.monotonic()
    try:
        if case == "exit3":
            spawn(exit_3_on_1, nprocs=2, timeout=60)
        elif case == "exittext":
            spawn(exit_text_on_0, nprocs=2, timeout=60)
        elif case == "inf":
            print("RETURNED", spawn(fine, nprocs=2, timeout=float("inf")))
        elif case == "grace":
            ctx = spawn(exit_3_on_1, nprocs=2, join=False)
            while not ctx.join(timeout=1, grace_period=0.5):
                pass
    except Exception as exc:
        print("CAUGHT", type(exc).__name__, getattr(exc, "error_index", None), getattr(exc, "exit_code", None),
              f"{time.monotonic() - t0:.1f}")
        print(exc)
"""


def run_case(tmp_path: Path, case: str) -> Result:
    script = tmp_path / "prog.py"
    script.write_text(textwrap.dedent(PROGRAM))
    env = {**os.environ, "PYTHONPATH": os.environ.get("HPCDIST_TEST_PYTHONPATH", str(ROOT))}
    for name in list(env):
        if name.startswith(("PMI_", "OMPI_", "SLURM_")):
            env.pop(name)
    return run_within([sys.executable, str(script), case], env, 80)


@pytest.mark.timeout(90)
def test_sys_exit_with_a_status_is_an_exit_not_a_raise(tmp_path):
    """torch: ProcessExitedException(exit_code=3); hpcdist raised ProcessRaisedException 'SystemExit: 3' (no exit_code)."""
    proc = run_case(tmp_path, "exit3")
    caught = proc.stdout.split("\n", 1)[0].split()
    assert caught[:4] == ["CAUGHT", "ProcessExitedException", "1", "3"], proc.stdout + proc.stderr
    assert float(caught[4]) < 30  # rank 0 (sleeping 60 s) was terminated
    assert "process 1 terminated with exit code 3" in proc.stdout


@pytest.mark.timeout(90)
def test_sys_exit_with_a_message_is_exit_code_1_and_keeps_the_message(tmp_path):
    proc = run_case(tmp_path, "exittext")
    assert proc.stdout.split()[:4] == ["CAUGHT", "ProcessExitedException", "0", "1"], proc.stdout + proc.stderr
    assert "process 0 terminated with exit code 1 (SystemExit: cannot go on)" in proc.stdout


@pytest.mark.timeout(90)
def test_an_infinite_timeout_means_no_bound(tmp_path):
    """timeout=float('inf') raised OverflowError from the wait (after starting the children)."""
    proc = run_case(tmp_path, "inf")
    assert proc.returncode == 0 and "RETURNED None" in proc.stdout, proc.stdout + proc.stderr


@pytest.mark.timeout(90)
def test_join_takes_torchs_grace_period(tmp_path):
    """torch's ProcessContext.join(timeout, grace_period): hpcdist's had no grace_period (TypeError)."""
    proc = run_case(tmp_path, "grace")
    assert proc.stdout.split()[:4] == ["CAUGHT", "ProcessExitedException", "1", "3"], proc.stdout + proc.stderr


@pytest.mark.parametrize(
    ("kwargs", "error", "said"),
    [
        ({"nprocs": 2.0}, TypeError, "nprocs must be an int >= 1, got 2.0 (float)"),
        ({"nprocs": "2"}, TypeError, "nprocs must be an int >= 1, got '2' (str)"),
        ({"nprocs": -1}, ValueError, "nprocs must be an int >= 1, got -1"),
        ({"timeout": "5"}, TypeError, "timeout must be a number of seconds > 0 or None, got '5'"),
        ({"timeout": float("nan")}, ValueError, "timeout must be a number of seconds > 0 or None, got nan"),
        ({"master_port": 70000}, ValueError, "master_port must be an int in 1..65535 or None (a free port), got 70000"),
        ({"master_port": 0}, ValueError, "master_port must be an int in 1..65535"),
        ({"master_port": "29500"}, TypeError, "master_port must be an int in 1..65535"),
        ({"master_addr": ""}, ValueError, "master_addr must be a host name or address of this machine, got ''"),
        ({"master_addr": "no-such-host.invalid"}, ValueError, "master_addr must be a host name or address of this"),
    ],
)
def test_argument_errors_name_the_argument_before_any_child_starts(kwargs, error, said):
    """They came as raw errors (socket.gaierror, '>' not supported), or from the children's init."""
    with pytest.raises(error, match=re.escape(said)):
        spawn(print, **kwargs)
