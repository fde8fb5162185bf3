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
