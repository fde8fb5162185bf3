"""DETAIL mode compares the sizes ranks exchange where they may differ between ranks (issue: silent truncation).

``gather``, ``scatter``, ``all_gather``, ``reduce_scatter``, ``all_to_all(_single)`` and
``all_gather_coalesced`` allow uneven sizes, so their DETAIL fingerprint holds op, dtype and root only.
A pair of ranks that disagree on how many items travel between them made MPI truncate on some ranks,
or leave part of an output unwritten with no error at all (an ``Iscatterv`` whose root slot is larger
than the receiver's array). DETAIL now checks every pair first: each case below makes the last group
rank disagree with its peers on one pair, and every member must raise ``DistError`` naming exactly the
pairs that disagree, with no data moved, the group usable afterwards. Uneven sizes that agree pass
and give NumPy's answer. Run over the matrix's groups.
"""

from __future__ import annotations

import numpy as np
import pytest
from matrix import members_of

import hpcdist as dist
from hpcdist.debug import DebugLevel, get_debug_level, set_debug_level

K = 3  # the items every pair agrees on; the disagreeing pair has K + 1 on one side
SENTINEL = -7.0


@pytest.fixture
def detail():
    before = get_debug_level()
    set_debug_level(DebugLevel.DETAIL)
    yield
    set_debug_level(before)


def _place(group):
    members = members_of(group)
    if not members:
        pytest.skip("not a member of this group")
    if len(members) < 2:
        pytest.skip("needs a group of 2 or more ranks")
    return members, members.index(dist.get_rank())


def _pair(members, src, dst, sent, expected):
    return (
        f"group rank {src} (global {members[src]}) sends {sent} items to group rank {dst} "
        f"(global {members[dst]}), which expects {expected}"
    )


def _pair_part(members, src, dst, part, sent, expected):
    return (
        f"group rank {src} (global {members[src]}) sends {sent} items (part {part}) to group rank {dst} "
        f"(global {members[dst]}), which expects {expected}"
    )


def _expect_mismatch(call, pairs, outputs, group):
    """``call`` raises DistError naming exactly ``pairs`` on this rank; ``outputs`` are untouched; group usable."""
    with pytest.raises(dist.DistError) as info:
        call()
    msg = str(info.value)
    assert "disagree on the sizes they exchange" in msg, msg
    for pair in pairs:
        assert pair in msg, (pair, msg)
    assert msg.count(" sends ") == len(pairs), msg
    for out in outputs:
        assert np.all(out == SENTINEL), "data moved before the size check"
    x = np.ones(2)
    dist.all_reduce(x, group=group)
    assert np.all(x == len(members_of(group)))


def _full(n):
    return np.full(n, SENTINEL)


def test_all_gather_sizes_that_disagree(detail, group):
    members, gr = _place(group)
    n, bad = len(members), len(members) - 1
    mine = K + 1 if gr == bad else K
    outs = [_full(K + 1 if (r == bad and gr == bad) else K) for r in range(n)]
    pairs = [_pair(members, bad, r, K + 1, K) for r in range(n - 1)]
    _expect_mismatch(lambda: dist.all_gather(outs, np.ones(mine), group=group), pairs, outs, group)


def test_gather_slot_that_disagrees(detail, group):
    members, gr = _place(group)
    n, bad = len(members), len(members) - 1
    inp = np.ones(K + 1 if gr == bad else K)
    outs = [_full(K) for _ in range(n)] if gr == 0 else None
    pairs = [_pair(members, bad, 0, K + 1, K)]
    call = lambda: dist.gather(inp, outs, group=group, group_dst=0)  # noqa: E731
    _expect_mismatch(call, pairs, outs or [], group)


def test_scatter_slot_larger_than_the_receiver(detail, group):
    """The case MPI reported nowhere: a root slot larger than the receiver's array."""
    members, gr = _place(group)
    n, bad = len(members), len(members) - 1
    out = _full(K)
    ins = [np.ones(K + 1 if r == bad else K) for r in range(n)] if gr == 0 else None
    pairs = [_pair(members, 0, bad, K + 1, K)]
    _expect_mismatch(lambda: dist.scatter(out, ins, group=group, group_src=0), pairs, [out], group)


def test_reduce_scatter_input_that_disagrees(detail, group):
    members, gr = _place(group)
    n, bad = len(members), len(members) - 1
    out = _full(K)
    ins = [np.ones(K + 1 if (r == bad and gr != bad) else K) for r in range(n)]
    pairs = [_pair(members, i, bad, K + 1, K) for i in range(n - 1)]
    _expect_mismatch(lambda: dist.reduce_scatter(out, ins, group=group), pairs, [out], group)


def test_all_to_all_pair_that_disagrees(detail, group):
    members, gr = _place(group)
    n, bad = len(members), len(members) - 1
    ins = [np.ones(K + 1 if (gr == 0 and j == bad) else K) for j in range(n)]
    outs = [_full(K) for _ in range(n)]
    pairs = [_pair(members, 0, bad, K + 1, K)]
    _expect_mismatch(lambda: dist.all_to_all(outs, ins, group=group), pairs, outs, group)


def test_all_to_all_single_splits_that_disagree(detail, group):
    members, gr = _place(group)
    n, bad = len(members), len(members) - 1
    send = [K + 1 if (gr == 0 and j == bad) else K for j in range(n)]
    out = _full(K * n)
    pairs = [_pair(members, 0, bad, K + 1, K)]
    call = lambda: dist.all_to_all_single(out, np.ones(sum(send)), [K] * n, send, group=group)  # noqa: E731
    _expect_mismatch(call, pairs, [out], group)


def test_all_to_all_single_split_smaller_than_the_receiver_expects(detail, group):
    """The other direction: group rank 0 sends the last one fewer items than it expects. MPI completes it without
    an error, leaving the end of the receiver's slot unwritten."""
    members, gr = _place(group)
    n, bad = len(members), len(members) - 1
    send = [K - 1 if (gr == 0 and j == bad) else K for j in range(n)]
    out = _full(K * n)
    pairs = [_pair(members, 0, bad, K - 1, K)]
    call = lambda: dist.all_to_all_single(out, np.ones(sum(send)), [K] * n, send, group=group)  # noqa: E731
    _expect_mismatch(call, pairs, [out], group)


def test_all_gather_coalesced_part_that_disagrees(detail, group):
    members, gr = _place(group)
    n, bad = len(members), len(members) - 1
    first, second = np.ones(2), np.ones(K + 1 if gr == bad else K)
    outs = [[_full(2), _full(K + 1 if (r == bad and gr == bad) else K)] for r in range(n)]
    pairs = [_pair_part(members, bad, r, 1, K + 1, K) for r in range(n - 1)]
    arrays = [a for lst in outs for a in lst]
    _expect_mismatch(lambda: dist.all_gather_coalesced(outs, [first, second], group=group), pairs, arrays, group)


def test_uneven_sizes_that_agree_pass(detail, group):
    """Uneven but consistent sizes: no false alarm, and NumPy's answer."""
    members = members_of(group)
    if not members:
        pytest.skip("not a member of this group")
    n, gr = len(members), members.index(dist.get_rank())
    mine = np.arange(gr + 1, dtype=np.float64) + 10 * gr
    outs = [_full(r + 1) for r in range(n)]
    dist.all_gather(outs, mine, group=group)
    for r in range(n):
        np.testing.assert_array_equal(outs[r], np.arange(r + 1) + 10 * r)
    # all_to_all_single: rank i sends i + j + 1 items to rank j, each item 100 i + j
    send = [gr + j + 1 for j in range(n)]
    recv = [i + gr + 1 for i in range(n)]
    inp = np.concatenate([np.full(c, 100.0 * gr + j) for j, c in enumerate(send)])
    out = _full(sum(recv))
    dist.all_to_all_single(out, inp, recv, send, group=group)
    np.testing.assert_array_equal(out, np.concatenate([np.full(c, 100.0 * i + gr) for i, c in enumerate(recv)]))
