"""Fixtures of the MPI test suite (run under ``mpiexec -n N`` by tests/mpi_pytest.py).

One session-wide ``init_process_group``; the groups of the matrix
(matrix.py: world, rev, head, split) are created once, collectively, in the
same order on every rank.
"""

from __future__ import annotations

import os
import tempfile
from datetime import timedelta

import pytest
from matrix import GROUP_KINDS, make_groups, members_of

import hpcdist as dist

_GROUPS: dict[str, object] = {}


def pytest_configure(config):
    # the timeout tests' flight recorder dumps go to the temporary directory, not the working tree
    os.environ.setdefault("HPCDIST_FLIGHT_DIR", os.path.join(tempfile.gettempdir(), "hpcdist-flight-tests"))
    if not dist.is_initialized():
        dist.init_process_group("mpi", timeout=timedelta(seconds=float(os.environ.get("HPCDIST_TIMEOUT", "60"))))
        _GROUPS.update(make_groups())


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
def _in_step():
    """Every test starts and ends with all ranks in step (a failing rank can't desynchronize the rest)."""
    dist.barrier()
    yield
    dist.barrier()
