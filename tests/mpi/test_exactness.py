"""Results that must be exact, and torch's documented layouts (issue #10: defect 8 and torch's own suite).

Every expectation is computed independently with Python integers or NumPy
from what each rank contributed.
"""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as dist
from hpcdist import ReduceOp


def _trunc_div(a: int, b: int) -> int:
    q = abs(a) // b
    return q if a >= 0 else -q


@pytest.mark.parametrize("dtype", ["int64", "int32", "uint64", "int8"])
@pytest.mark.parametrize("async_op", [False, True])
def test_integer_avg_is_the_exact_sum_divided_truncating(group, members, dtype, async_op):
    if not members:
        return
    info = np.iinfo(dtype)
    big = info.max // 8  # int64: 2**60 - 1, far above 2**53 where float64 rounds

    def contribution(r: int) -> list[int]:
        vals = [big - 3 * r, 2 * r + 1, 7]
        if info.min < 0:
            vals += [-big + 5 * r, -(2 * r + 1), -7]
        return vals

    mine = contribution(dist.get_rank())
    x = np.array(mine, dtype=dtype)
    work = dist.all_reduce(x, op=ReduceOp.AVG, group=group, async_op=async_op)
    if async_op:
        work.wait()
    n = len(members)
    expected = [_trunc_div(sum(contribution(r)[i] for r in members), n) for i in range(len(mine))]
    assert x.tolist() == expected


def test_integer_avg_reduce_scatter_and_reduce_are_exact(group, members):
    if not members:
        return
    n, g = len(members), dist.get_rank(group)
    big = 2**60 + 1
    x = np.array([big + dist.get_rank()] * n, dtype=np.int64)
    out = np.zeros(1, dtype=np.int64)
    dist.reduce_scatter_tensor(out, x, op=ReduceOp.AVG, group=group)
    assert out[0] == (big * n + sum(members)) // n
    y = np.array([-big - dist.get_rank()], dtype=np.int64)
    dist.reduce(y, dst=members[0], op=ReduceOp.AVG, group=group)
    if g == 0:
        assert y[0] == _trunc_div(-big * n - sum(members), n)
