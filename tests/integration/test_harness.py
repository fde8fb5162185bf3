"""The MPI test runner's own promises (tests/mpi_pytest.py, tests/mpi/conftest.py): a hung test names itself and
ends the job; a test during which hpcdist's watchdog ends the job names itself with hpcdist's message; a failure on
any rank is said at once, and a failure that leaves the ranks out of step ends the session instead of failing
every test after it."""

from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap

import pytest
from mpirun import ROOT, Result, mpiexec, run_limited

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


def run_suite(tmp_path, name: str, source: str, **env: str) -> Result:
    """Run the test file ``source`` as ``name`` under tests/mpi_pytest.py on 2 ranks, with ``env`` added."""
    (tmp_path / name).write_text(textwrap.dedent(source))
    full = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": str(ROOT)}
    full.pop("HPCDIST_TIMEOUT", None)  # (the suite's own, from tests/run_all.py)
    full.update(env)
    cmd = [mpiexec(), "-n", "2", sys.executable, str(ROOT / "tests" / "mpi_pytest.py"), "-q", "-p", "no:cacheprovider"]
    return run_limited([*cmd, name], full, limit=90, cwd=tmp_path)


def test_a_hung_test_names_itself_shows_every_rank_and_ends_the_job(tmp_path):
    res = run_suite(tmp_path, "test_stuck.py", STUCK, HPCDIST_TEST_DEADLINE="3")
    out = res.output
    assert not res.timed_out, out
    assert res.returncode != 0, out
    for rank in (0, 1):  # each rank names the test and shows where its threads were
        assert f"rank {rank} of 2: test_stuck.py::test_stuck_on_rank_1 still running after 3s" in out, out
    assert "time.sleep(600)" in out, out  # rank 1's stack
    assert "Barrier()" in out, out  # rank 0's stack
    assert "rank 1 goes to sleep" in out, out  # rank 1's log tail, which its dying process would have lost
    assert "ending the job (exit status 3)" in out, out


ABORTED = """
    from datetime import timedelta

    import numpy as np

    import hpcdist as dist


    def test_first_passes():
        dist.init_process_group("mpi", timeout=timedelta(seconds=2))
        dist.barrier()


    def test_rank_0_reduces_alone():
        if dist.get_rank() == 0:
            dist.all_reduce(np.ones(4))  # rank 1 never comes: the block-mode watchdog ends the job
        else:
            dist.barrier(timeout=timedelta(seconds=60))
"""


def test_a_test_the_watchdog_ends_names_itself_with_the_watchdogs_message(tmp_path):
    res = run_suite(tmp_path, "test_aborted.py", ABORTED, HPCDIST_WAIT="block")
    out = res.output
    assert not res.timed_out, out
    assert res.returncode == 124, out  # MPI_Abort(124): the watchdog's status
    head = "rank 0 of 2: test_aborted.py::test_rank_0_reduces_alone ends the job: hpcdist.DistTimeoutError"
    assert head in out and "all_reduce" in out, out  # pytest captured rank 0's stderr: this line is the harness's


OUT_OF_STEP = """
    import numpy as np

    import hpcdist as dist


    def test_first_passes():
        dist.all_reduce(np.ones(2))


    def test_rank_1_fails_early():
        if dist.get_rank() == 1:
            raise AssertionError("rank 1 fails before the barrier")
        dist.barrier()  # rank 1 never comes: times out here, and the default group is out of step after it


    def test_after_it_1():
        dist.barrier()


    def test_after_it_2():
        dist.barrier()
"""


def test_a_failure_on_one_rank_is_said_at_once_and_an_out_of_step_group_ends_the_session(tmp_path):
    for helper in ("conftest.py", "matrix.py"):  # the MPI suite's own fixtures: the in-step check between tests
        shutil.copy(ROOT / "tests" / "mpi" / helper, tmp_path / helper)
    res = run_suite(tmp_path, "test_oos.py", OUT_OF_STEP, HPCDIST_WAIT="poll", HPCDIST_TIMEOUT="2")
    out = res.output
    assert not res.timed_out, out
    assert res.returncode == 124, out  # the timeout poisoned the processes: they end with MPI_Abort(124)
    assert "exit codes by rank: [2, 2]" in out, out  # both sessions ended early (pytest.exit), not by a timeout
    assert "rank 1: a peer left (rank 0: the default group fails after test_oos.py::test_rank_1_fails_early" in out
    said = "rank 1 of 2: test_oos.py::test_rank_1_fails_early failed (call): AssertionError: rank 1 fails before"
    assert said in out, out  # rank 1's failure, on the terminal as it happens (its log is shown only at the end)
    assert "rank 0 of 2: test_oos.py::test_rank_1_fails_early failed (call): hpcdist" in out, out  # the timeout
    assert "ending the session" in out, out
    assert "test_oos.py::test_after_it_2" not in out, out  # no cascade of failures after the first


def test_a_launch_past_its_limit_reports_where_each_rank_waits_and_leaves_nothing_running(tmp_path):
    """tests/integration/mpirun.py's own promise, on which every fault test's report of a hang rests: a launch that
    outlives its limit is reported with its processes (mpiexec, Hydra's proxy, the ranks: state and kernel wait)
    and each rank's Python traceback (faulthandler), and every one of them is gone afterwards, though Hydra starts
    its proxy in a session of its own."""
    from mpirun import _processes, run_mpi

    script = """
import time
from mpi4py import MPI
if MPI.COMM_WORLD.Get_rank() == 1:
    time.sleep(600)  # RANK 1 WAITS HERE
MPI.COMM_WORLD.Barrier()  # RANK 0 WAITS HERE
"""
    r = run_mpi(2, script, tmp_path, limit=12)
    assert r.timed_out, r.output
    report = r.stderr[r.stderr.index("--- processes of the launch") :]
    assert "mpiexec" in report and "hydra_pmi_proxy" in report and report.count("script_") >= 3, report
    tracebacks = r.stderr.split("--- processes of the launch")[0]
    for line in (5, 6):  # the sleep and the barrier, each rank's own frame, a whole block not torn by the other's
        head = r"Current thread 0x[0-9a-f]+ \(most recent call first\):\n"
        frame = head + rf'  File "[^"\n]*script_{abs(hash(script)) % 10**8}\.py", line {line} in <module>\n\n'
        assert re.search(frame, tracebacks), r.stderr
    lingering = [cmd for pid, _f, _w, cmd in _processes(1) if str(tmp_path) in cmd]
    assert not lingering, lingering
