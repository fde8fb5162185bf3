"""hpcdist.rendezvous.init_guard: the bound on MPI_Init, on real processes (a block that sleeps stands in for an
MPI_Init that waits for a rank that never comes; tests/integration/test_faults.py runs the real one under mpiexec)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(60)

PROG = """
import sys, time
from hpcdist.rendezvous.init_guard import bounded_mpi_init
from proc_children import children

declared = None if sys.argv[2] == "none" else (1, int(sys.argv[2]))
with bounded_mpi_init(float(sys.argv[1]), declared):
    print("inside", len(children()), flush=True)
    time.sleep(float(sys.argv[3]))
deadline = time.monotonic() + 10
while children() and time.monotonic() < deadline:
    time.sleep(0.02)
print("after", len(children()), flush=True)
"""


TESTS = Path(__file__).resolve().parents[1]  # tests/: proc_children


def run(limit: float, size: str, sleep: float, close_stderr: bool = False) -> subprocess.CompletedProcess:
    path = os.pathsep.join(p for p in (str(TESTS.parent), str(TESTS), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-c", PROG, str(limit), size, str(sleep)],
        env={**os.environ, "PYTHONPATH": path},
        capture_output=not close_stderr,
        stdout=subprocess.PIPE if close_stderr else None,
        stderr=subprocess.DEVNULL if close_stderr else None,
        text=True,
        timeout=30,
    )


def test_a_block_that_outlives_the_bound_ends_the_process_with_the_reason():
    res = run(0.5, "4", 20)
    assert res.returncode == -signal.SIGKILL, (res.stdout, res.stderr)
    assert res.stdout.splitlines() == ["inside 1"]  # the watcher; never "after"
    assert "hpcdist: MPI_Init on rank 1 (pid " in res.stderr and "did not complete within 0.5s" in res.stderr
    assert "a rank that ended before init_process_group" in res.stderr


def test_the_process_is_ended_even_where_the_reason_cannot_be_written():
    res = run(0.5, "2", 20, close_stderr=True)
    assert res.returncode == -signal.SIGKILL, res.stdout


def test_a_block_that_ends_in_time_leaves_no_watcher():
    res = run(20, "2", 0.2)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["inside 1", "after 0"]  # the watcher ran, then was reaped


@pytest.mark.parametrize("size", ["none", "1"], ids=["no-launcher", "one-rank"])
def test_nothing_is_spawned_where_mpi_init_waits_for_nobody(size):
    res = run(0.3, size, 1.0)
    assert res.returncode == 0, res.stderr
    assert res.stdout.splitlines() == ["inside 0", "after 0"]
