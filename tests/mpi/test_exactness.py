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


# ---------------------------------------------------------------- layouts and dtypes as torch documents them


@pytest.mark.parametrize("k", [1, 2, 3, 4])
def test_all_gather_coalesced_fills_output_tensor_lists_rank_then_input(group, members, k):
    """torch: output_tensor_lists[rank][i] receives rank's input_tensor_list[i] (its docstring's example)."""
    if not members:
        return
    me = dist.get_rank()
    ins = [np.full(i + 1, 100 * me + i, dtype=np.int64) for i in range(k)]  # input i has i + 1 elements
    outs = [[np.full(i + 1, -1, dtype=np.int64) for i in range(k)] for _ in members]
    dist.all_gather_coalesced(outs, ins, group=group)
    for g, r in enumerate(members):
        for i in range(k):
            assert outs[g][i].tolist() == [100 * r + i] * (i + 1), (g, i)


def test_all_gather_coalesced_against_torch_gloo_layout_rule(group, members):
    """The same rule through all_gather: column i of output_tensor_lists equals all_gather of input i."""
    if not members:
        return
    me, n = dist.get_rank(), len(members)
    ins = [np.arange(3) + 10 * me, np.arange(2) * me]
    outs = [[np.empty(3, dtype=np.int64), np.empty(2, dtype=np.int64)] for _ in range(n)]
    dist.all_gather_coalesced(outs, ins, group=group)
    for i, inp in enumerate(ins):
        ref = [np.empty_like(inp) for _ in range(n)]
        dist.all_gather(ref, inp, group=group)
        assert all(np.array_equal(outs[g][i], ref[g]) for g in range(n))


def test_all_reduce_coalesced_mixes_complex64_with_float32_as_torch(group, members):
    if not members:
        return
    me = dist.get_rank()
    a = np.arange(3, dtype=np.float32) + me
    z = (np.arange(2) + 1j * (np.arange(2) + me)).astype(np.complex64)
    b = np.full(2, float(me), dtype=np.float32)
    dist.all_reduce_coalesced([a, z, b], group=group)
    assert np.array_equal(a, sum(np.arange(3, dtype=np.float32) + r for r in members))
    assert np.array_equal(z, sum((np.arange(2) + 1j * (np.arange(2) + r)).astype(np.complex64) for r in members))
    assert np.array_equal(b, np.full(2, float(sum(members)), dtype=np.float32))


def test_coalesced_and_all_to_all_errors_name_the_right_index(group, members):
    if not members:
        return
    with pytest.raises(TypeError, match=r"tensors\[2\]"):
        dist.all_reduce_coalesced([np.ones(2), np.ones(2), np.ones(2, dtype=np.int32)], group=group)
    n = len(members)
    if n >= 2:
        ins = [np.ones(1)] * (n - 1) + [np.ones(1, dtype=np.int32)]
        with pytest.raises(TypeError, match=rf"input_tensor_list\[{n - 1}\]"):
            dist.all_to_all([np.ones(1)] * n, ins, group=group)


# ---------------------------------------------------------------- small API differences torch's suite found


def test_backend_of_a_non_string_raises_value_error_as_torch():
    for bad in (None, 3, ["gloo"]):
        with pytest.raises(ValueError, match="backend must be a string"):
            dist.Backend(bad)


def test_monitored_barrier_accepts_float_seconds(group, members):
    if not members:
        return
    dist.monitored_barrier(group=group, timeout=30.0)
    dist.monitored_barrier(group=group, timeout=30)
    with pytest.raises(TypeError, match="timeout"):
        dist.monitored_barrier(group=group, timeout="30")


def test_get_backend_on_a_non_member_group_raises_without_warning(group, members):
    import warnings

    if members:
        assert dist.get_backend(group) == "mpi"
        return
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch raises ValueError and warns nothing
        with pytest.raises(ValueError, match="Invalid process group specified"):
            dist.get_backend(group)


def test_work_has_torchs_private_source_rank():
    n, me = dist.get_world_size(), dist.get_rank()
    if n < 2:
        return
    if me == 1:
        dist.send(np.ones(1), dst=0)
    elif me == 0:
        w = dist.irecv(np.empty(1))
        w.wait()
        assert w._source_rank() == w.source_rank() == 1
