"""The groups of the test matrix, shared by tests/mpi and tests/gpu.

Made collectively, in the same order on every rank:

* ``world``  — the default group;
* ``rev``    — every rank, in reversed order (group rank != global rank);
* ``head``   — the first ceil(n/2) ranks (others are not members: calls
  return None and do nothing);
* ``split``  — ``split_group`` into evens and odds (each rank in one).
"""

from __future__ import annotations

from typing import Any

import pytest

import hpcdist as dist

GROUP_KINDS = ["world", "rev", "head", "split"]


def make_groups(backend: Any = None) -> dict[str, Any]:
    """The matrix's groups by kind (``None`` is the default group), with ``backend`` (None: the world's)."""
    n = dist.get_world_size()
    evens, odds = list(range(0, n, 2)), list(range(1, n, 2))
    return {
        "world": None,
        "rev": dist.new_group(list(range(n - 1, -1, -1)), sort_ranks=False, backend=backend),
        "head": dist.new_group(list(range((n + 1) // 2)), backend=backend),
        "split": dist.split_group(split_ranks=[evens, odds] if odds else [evens], backend=backend),
    }


def members_of(group: Any) -> list[int]:
    """Global ranks of ``group`` in group-rank order ([] when this rank is not a member)."""
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        return []
    return dist.get_process_group_ranks(group)


def ring(members: list[int]) -> tuple[int, int, int]:
    """(this rank's index in ``members``, the next member, the previous one); skips groups of one."""
    if len(members) < 2:
        pytest.skip("needs a group of 2 or more ranks")
    n = len(members)
    gr = members.index(dist.get_rank())
    return gr, members[(gr + 1) % n], members[(gr - 1) % n]
