"""``all_reduce`` of torch sparse COO tensors through the facade, as gloo does it (SUM only).

Rank ``r`` of a group holds entries that depend on ``r`` (some shared with other ranks, some its own, one
index twice: an uncoalesced input); the reference is the sum of every member's tensor made densely here, with
NumPy. The result is the coalesced sum, in place, on every member; other ops are refused before any message.
"""

from __future__ import annotations

import numpy as np
import pytest
from matrix import GROUP_KINDS, make_groups, members_of

import hpcdist as dist
from hpcdist import ReduceOp

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:Sparse invariant checks")

SHAPE = (6, 3)  # one sparse dimension, one dense


def me() -> int:
    return dist.get_rank()


def made(r: int):
    """Rank ``r``'s sparse tensor: rows 0 and r % 6 (twice), and row (r + 1) % 6; values from ``r``."""
    rows = torch.tensor([[0, r % 6, (r + 1) % 6, r % 6]])
    values = torch.arange(12, dtype=torch.float64).reshape(4, 3) + 100 * r
    return torch.sparse_coo_tensor(rows, values, SHAPE)


def dense(r: int) -> np.ndarray:
    """The same tensor made densely with NumPy (duplicates added)."""
    out = np.zeros(SHAPE)
    values = np.arange(12, dtype=np.float64).reshape(4, 3) + 100 * r
    for k, row in enumerate([0, r % 6, (r + 1) % 6, r % 6]):
        out[row] += values[k]
    return out


@pytest.fixture(scope="module")
def groups():
    return make_groups()


@pytest.mark.parametrize("kind", GROUP_KINDS)
@pytest.mark.parametrize("asynchronous", [False, True])
def test_the_sum_of_every_members_entries(groups, kind, asynchronous):
    g = groups[kind]
    members = members_of(g)
    t = made(me())
    w = dist.all_reduce(t, group=g, async_op=asynchronous)
    if not members:  # a non-member: nothing happens
        assert w is None and np.array_equal(t.to_dense().numpy(), dense(me()))
        return
    if asynchronous:
        assert w.is_completed() and w.wait() is True and w.result() == [t]
    else:
        assert w is None
    assert t.is_sparse and t.is_coalesced()
    np.testing.assert_array_equal(t.to_dense().numpy(), sum(dense(r) for r in members))


@pytest.mark.parametrize("op", [ReduceOp.MAX, ReduceOp.AVG, ReduceOp.PREMUL_SUM(2.0)], ids=["MAX", "AVG", "PREMUL"])
def test_other_ops_are_refused_before_any_message(op):
    t = made(me())
    with pytest.raises(ValueError, match=r"all_reduce of a sparse tensor supports ReduceOp\.SUM only"):
        dist.all_reduce(t, op=op)
    np.testing.assert_array_equal(t.to_dense().numpy(), dense(me()))
    x = np.ones(2)
    dist.all_reduce(x)  # nothing moved: the next collective matches
    assert np.all(x == dist.get_world_size())
