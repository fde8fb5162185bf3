"""Fixtures of the MPI test suite (run under ``mpiexec -n N`` by tests/mpi_pytest.py).

One session-wide ``init_process_group``; the groups of the matrix
(matrix.py: world, rev, head, split) are created once, collectively, in the
same order on every rank.
"""

from __future__ import annotations

import os
import tempfile
import time
from datetime import timedelta

import pytest
from matrix import GROUP_KINDS, make_groups, members_of
from mpi4py import MPI

import hpcdist as dist

_GROUPS: dict[str, object] = {}
#: the harness's own communicator for meeting between tests (see ``_in_step``)
_STEP: list = [None]


def pytest_configure(config):
    # the timeout tests' flight recorder dumps go to the temporary directory, not the working tree
    os.environ.setdefault("HPCDIST_FLIGHT_DIR", os.path.join(tempfile.gettempdir(), "hpcdist-flight-tests"))
    if not dist.is_initialized():
        dist.init_process_group("mpi", timeout=timedelta(seconds=float(os.environ.get("HPCDIST_TIMEOUT", "60"))))
        _GROUPS.update(make_groups())
        _STEP[0] = MPI.COMM_WORLD.Dup()


def pytest_unconfigure(config):
    if dist.is_initialized():
        dist.destroy_process_group()


@pytest.fixture(params=GROUP_KINDS)
def group(request):
    """A group of the matrix (``GroupMember.NON_GROUP_MEMBER`` on non-members)."""
    return _GROUPS[request.param]


@pytest.fixture
def members(group):
    """Global ranks of ``group`` in group-rank order ([] when this rank is not a member)."""
    return members_of(group)


@pytest.fixture(autouse=True)
def _in_step(request):
    """Every test starts and ends with all ranks in step (a failing rank can't desynchronize the rest).

    The ranks meet on a communicator of the harness's own, which no test's
    collective can match: a test that fails early on one rank leaves the
    others to fail in their own collectives (by the group's timeout), and the
    next test starts in step. Then the default group is checked with a
    barrier. Where either fails, the tests after it would all fail (the group
    is out of step or broken), so the session ends there, naming the test:
    a rank leaves when its own check fails (and tells the others, who stop
    waiting for it), or after the group's timeout plus 30 s at the meeting.
    """
    _step(request.node.nodeid, "before")
    yield
    _step(request.node.nodeid, "after")


def _step(test: str, when: str) -> None:
    limit = _step_timeout()
    if not _meet(_STEP[0], limit):
        _leave(f"the ranks did not meet {when} {test} within {limit:g}s (a peer is stuck or gone)")
    try:
        dist.barrier()
    except Exception as exc:
        _leave(f"the default group fails {when} {test} ({type(exc).__name__}: {exc}); every test after it would fail")


#: tag of the notice a rank that ends its session sends its peers (they stop waiting for it at once)
_LEAVING = 77
_NOTICES: list = []  # the notices' requests and buffers, alive until the process ends


def _leave(why: str, tell: bool = True) -> None:
    """End this rank's session (pytest.exit); with ``tell``, send every peer the notice first."""
    comm = _STEP[0]
    text = f"rank {comm.Get_rank()}: {why}: ending the session"
    if tell:
        note = bytearray(text.encode())
        _NOTICES.append(note)
        _NOTICES.extend(comm.Isend(note, r, _LEAVING) for r in range(comm.Get_size()) if r != comm.Get_rank())
    pytest.exit(text, returncode=2)


def _step_timeout() -> float:
    """Longer than the group's timeout: a peer whose collective waits for a rank that failed early comes in time."""
    return float(os.environ.get("HPCDIST_TIMEOUT", "60")) + 30.0


def _meet(comm, timeout: float) -> bool:
    """A barrier on ``comm`` that gives up after ``timeout`` s (False), or at a peer's leaving notice (ends here)."""
    req = comm.Ibarrier()
    deadline = time.monotonic() + timeout
    delay = 1e-5
    status = MPI.Status()
    while not req.Test():
        if comm.Iprobe(MPI.ANY_SOURCE, _LEAVING, status):
            note = bytearray(status.Get_count(MPI.BYTE))
            comm.Recv(note, status.Get_source(), _LEAVING)
            _leave(f"a peer left ({note.decode(errors='replace')})", tell=False)
        if time.monotonic() > deadline:
            return False
        time.sleep(delay)
        delay = min(2 * delay, 0.01)
    return True
