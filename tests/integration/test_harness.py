"""The MPI test runner's own promises (tests/mpi_pytest.py): a hung test names itself and ends the job."""

from __future__ import annotations

import os
import sys
import textwrap

import pytest
from mpirun import ROOT, mpiexec, run_limited

pytestmark = pytest.mark.timeout(120)

STUCK = """
    import time

    from mpi4py import MPI


    def test_first_passes():
        assert MPI.COMM_WORLD.Get_size() == 2


    def test_stuck_on_rank_1():
        if MPI.COMM_WORLD.Get_rank() == 1:
            print("rank 1 goes to sleep", flush=True)
            time.sleep(600)
        MPI.COMM_WORLD.Barrier()


    def test_never_reached():
        pass
"""


def test_a_hung_test_names_itself_shows_every_rank_and_ends_the_job(tmp_path):
    (tmp_path / "test_stuck.py").write_text(textwrap.dedent(STUCK))
    env = {**os.environ, "HPCDIST_TEST_DEADLINE": "3", "PYTHONUNBUFFERED": "1"}
    cmd = [mpiexec(), "-n", "2", sys.executable, str(ROOT / "tests" / "mpi_pytest.py"), "-q", "-p", "no:cacheprovider"]
    res = run_limited([*cmd, "test_stuck.py"], env, limit=90, cwd=tmp_path)
    out = res.output
    assert not res.timed_out, out
    assert res.returncode != 0, out
    assert res.elapsed < 60, (res.elapsed, out)  # 3 s deadline + 10 s grace + start-up, not the 90 s limit
    for rank in (0, 1):  # each rank names the test and shows where its threads were
        assert f"rank {rank} of 2: test_stuck.py::test_stuck_on_rank_1 still running after 3s" in out, out
    assert "time.sleep(600)" in out, out  # rank 1's stack
    assert "Barrier()" in out, out  # rank 0's stack
    assert "rank 1 goes to sleep" in out, out  # rank 1's log tail, which its dying process would have lost
    assert "ending the job (exit status 3)" in out, out
