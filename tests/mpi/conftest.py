"""Fixtures of the MPI test suite (run under ``mpiexec -n N`` by tests/mpi_pytest.py).

One session-wide ``init_process_group``; the groups of the matrix are created
once, collectively, in the same order on every rank:

* ``world``  — the default group;
* ``rev``    — every rank, in reversed order (group rank != global rank);
* ``head``   — the first ceil(n/2) ranks (others are not members: calls
  return None and do nothing);
* ``split``  — ``split_group`` into evens and odds (each rank in one).
"""

from __future__ import annotations

import os
from datetime import timedelta

import pytest

import hpcdist as dist

GROUP_KINDS = ["world", "rev", "head", "split"]
_GROUPS: dict[str, object] = {}


def pytest_configure(config):
    if not dist.is_initialized():
        dist.init_process_group("mpi", timeout=timedelta(seconds=float(os.environ.get("HPCDIST_TIMEOUT", "60"))))
        n = dist.get_world_size()
        _GROUPS["world"] = None
        _GROUPS["rev"] = dist.new_group(list(range(n - 1, -1, -1)), sort_ranks=False)
        _GROUPS["head"] = dist.new_group(list(range((n + 1) // 2)))
        evens, odds = list(range(0, n, 2)), list(range(1, n, 2))
        _GROUPS["split"] = dist.split_group(split_ranks=[evens, odds] if odds else [evens])


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
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        return []
    return dist.get_process_group_ranks(group)


@pytest.fixture(autouse=True)
def _in_step():
    """Every test starts and ends with all ranks in step (a failing rank can't desynchronize the rest)."""
    dist.barrier()
    yield
    dist.barrier()
