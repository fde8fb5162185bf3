"""all_reduce_bucketed over the group matrix: mixed dtypes and sizes, tiny caps (many buckets), async."""

from __future__ import annotations

import numpy as np
import pytest
from mpi_arrays import cast, make, need, to_np, values

import hpcdist as dist
from hpcdist import ReduceOp

SPECS = [("float32", 5), ("int64", 3), ("float32", 40), ("float64", 1), ("float16", 7), ("int64", 30), ("float32", 2)]


def _arrays(kind: str, rank: int) -> list:
    return [make(kind, values(rank, n, dt, salt=i), dt) for i, (dt, n) in enumerate(SPECS)]


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("cap_mb", [25.0, 64 / (1 << 20)])  # one bucket per dtype; ~64-byte buckets
@pytest.mark.parametrize("async_op", [False, True])
def test_all_reduce_bucketed(group, members, kind, cap_mb, async_op):
    need(kind)
    xs = _arrays(kind, dist.get_rank())
    before = [to_np(x).copy() for x in xs]
    w = dist.all_reduce_bucketed(xs, op=ReduceOp.SUM, group=group, async_op=async_op, bucket_cap_mb=cap_mb)
    if not members:
        assert w is None
        assert all(np.array_equal(to_np(x), b) for x, b in zip(xs, before))
        return
    if async_op:
        assert w.wait() is True
    else:
        assert w is None
    for i, ((dt, n), x) in enumerate(zip(SPECS, xs)):
        want = cast(sum(values(r, n, dt, salt=i) for r in members), dt)
        assert np.array_equal(to_np(x).reshape(-1), want), (i, dt)


def test_bucketed_bad_cap():
    with pytest.raises(ValueError, match="bucket_cap_mb"):
        dist.all_reduce_bucketed([np.ones(2)], bucket_cap_mb=0)


@pytest.mark.parametrize("opname", ["SUM", "MAX", "AVG", "PREMUL_SUM"])
def test_bucketed_ops_and_shapes_match_numpy(group, members, opname):
    """One bucket of NumPy arrays of several shapes (n-D ones too), every op the bucket path supports."""
    if not members:
        return
    n = len(members)
    op = ReduceOp.PREMUL_SUM(0.5) if opname == "PREMUL_SUM" else getattr(ReduceOp, opname)
    shapes = [(7,), (3, 4), (1,), (2, 3, 5), (64,)]

    def inputs(rank: int) -> list[np.ndarray]:
        rng = np.random.default_rng(rank)
        return [rng.integers(-9, 9, size=s).astype(np.float64) for s in shapes]

    xs = inputs(dist.get_rank())
    dist.all_reduce_bucketed(xs, op=op, group=group)
    stack = [np.stack([inputs(r)[i] for r in members]) for i in range(len(shapes))]
    for x, st in zip(xs, stack):
        want = {"SUM": st.sum(0), "MAX": st.max(0), "AVG": st.sum(0) / n, "PREMUL_SUM": (st * 0.5).sum(0)}[opname]
        assert x.shape == st.shape[1:] and np.array_equal(x, want), (opname, x, want)


def test_bucketed_read_only_array_is_refused_before_anything_moves(group, members):
    if not members:
        return
    xs = [np.ones(3), np.ones(4)]
    xs[1].flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        dist.all_reduce_bucketed(xs, group=group)
    assert np.array_equal(xs[0], np.ones(3))  # nothing was reduced


@pytest.mark.parametrize("symmetric", [False, True])
def test_bucket_views_are_reduced_by_one_all_reduce_of_their_buffer(group, members, symmetric):
    if not members:
        return
    shapes = [(3,), (2, 4), 5, (1, 1, 2)]
    flat, views = dist.bucket_views(shapes, np.float64, symmetric=symmetric, group=group)
    assert dist.symmetric_memory.is_symmetric(flat, group) == symmetric
    assert [v.shape for v in views] == [(3,), (2, 4), (5,), (1, 1, 2)] and flat.size == 3 + 8 + 5 + 2
    assert all(np.shares_memory(v, flat) for v in views) and not flat.any()
    rank = dist.get_rank()
    for i, v in enumerate(views):
        v[...] = rank + i  # written in place, as gradients would be
    dist.all_reduce(flat, group=group)
    for i, v in enumerate(views):
        assert np.all(v == sum(r + i for r in members)), (i, v)
    with pytest.raises(ValueError, match="negative"):
        dist.bucket_views([(2, -1)])
