"""all_reduce_bucketed over the group matrix: mixed dtypes and sizes, tiny caps (many buckets), async;
argument errors before any bucket moves; DETAIL mode catching lists that differ between ranks."""

from __future__ import annotations

import math
import re
from datetime import timedelta

import numpy as np
import pytest
from mpi_arrays import cast, make, need, to_np, values

import hpcdist as dist
from hpcdist import ReduceOp
from hpcdist.debug import DebugLevel, get_debug_level, set_debug_level
from hpcdist.errors import DistError
from hpcdist.group import resolve_group

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


@pytest.mark.parametrize("cap", [0, -1.0, math.inf, -math.inf, math.nan, True, "25", None])
def test_bucket_caps_must_be_finite_positive_numbers(cap):
    """Both functions that take a cap refuse the same values, by name, with the value given (not an
    OverflowError or a float conversion error from deep inside)."""
    xs = [np.ones(2), np.ones(3)]
    with pytest.raises(
        ValueError, match=rf"^bucket_cap_mb must be a finite number of MiB > 0, got {re.escape(repr(cap))}$"
    ):
        dist.all_reduce_bucketed(xs, bucket_cap_mb=cap)
    assert all(np.array_equal(x, np.ones(x.size)) for x in xs)
    with pytest.raises(
        ValueError, match=rf"^cap_bytes must be a finite number of bytes > 0, got {re.escape(repr(cap))}$"
    ):
        dist.bucket_indices([16, 24], ["f8", "f8"], cap)


def _ring(group):
    """The group's flight recorder (None when it is off): its ``n_coll`` counts the collectives started."""
    return resolve_group(group, "test")._flight


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("cap_mb", [1e-7, 1e-300, 10**400, np.int64(1 << 60)])
def test_bucketed_tiny_and_huge_caps(group, members, kind, async_op, cap_mb):
    """A cap below a byte is a cap of one byte: every array in a bucket of its own (one collective each); an
    int cap beyond float's range is one bucket per dtype. Results are NumPy's either way."""
    need(kind)
    if not members:
        return
    xs = _arrays(kind, dist.get_rank())
    ring = _ring(group)
    started = None if ring is None else ring.n_coll
    w = dist.all_reduce_bucketed(xs, group=group, async_op=async_op, bucket_cap_mb=cap_mb)
    if async_op:
        assert w.wait() is True
    for i, ((dt, n), x) in enumerate(zip(SPECS, xs)):
        want = cast(sum(values(r, n, dt, salt=i) for r in members), dt)
        assert np.array_equal(to_np(x).reshape(-1), want), (i, dt)
    if ring is not None:
        assert ring.n_coll - started == (len(SPECS) if cap_mb < 1 else len({dt for dt, _ in SPECS}))


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize("case", ["op", "dtype"])
def test_bucketed_argument_errors_come_before_any_bucket_moves(group, members, kind, async_op, case):
    """A later array whose dtype the op does not fit (BXOR on float32), or that hpcdist cannot communicate
    (a string array), is refused, by its name, before the earlier arrays' bucket is reduced."""
    need(kind)
    if not members:
        return
    if case == "op":  # BXOR is defined for int32, not for float32
        first, second, op = np.full(4, 3, np.int32), np.ones(4, np.float32), ReduceOp.BXOR
        err, match = ValueError, r"^op=ReduceOp.BXOR is bitwise and needs an integer or bool array, got dtype float32"
    else:
        first, second, op = np.full(4, 2.0, np.float32), np.array(["x"] * 4), ReduceOp.SUM
        err, match = TypeError, r"^tensors\[1\] has dtype <U1, which hpcdist cannot communicate"
    xs = [first, second]
    if kind == "torch":
        xs = [make("torch", first, str(first.dtype)), make("torch", second, "float32") if case == "op" else second]
    ring = _ring(group)
    started = None if ring is None else ring.n_coll
    with pytest.raises(err, match=match):
        dist.all_reduce_bucketed(xs, op=op, group=group, async_op=async_op)
    assert np.array_equal(to_np(xs[0]), to_np(first)), "the first array was reduced before the error"
    if ring is not None:
        assert ring.n_coll == started, "a collective started before the error"


@pytest.fixture
def fresh():
    """A new group of every rank, destroyed after the test (a mismatch DETAIL missed would leave it out of step)."""
    g = dist.new_group(timeout=timedelta(seconds=20))
    yield g
    if not g._destroyed:
        dist.destroy_process_group(g)


# the sizes of the arrays of rank 0 (and every other but the last) and of the last rank
MISMATCHES = {
    "sizes": ([4, 3], [5, 3]),  # one more item
    "split": ([3, 5], [5, 3]),  # the same items, split otherwise
    "many": (list(range(1, 11)), [2, 1, *range(3, 11)]),  # 10 arrays (shapes by checksum), two swapped
}


@pytest.mark.parametrize("fn", ["bucketed", "coalesced"])
@pytest.mark.parametrize(("kind", "async_op"), [("numpy", False), ("torch", False), ("numpy", True)])
@pytest.mark.parametrize("case", list(MISMATCHES))
def test_detail_mode_catches_lists_that_differ_between_ranks(fresh, fn, kind, async_op, case):
    """DETAIL mode compares the number of arrays, their items and shapes, on every path (NumPy buckets,
    torch/async ones through all_reduce_coalesced): every rank raises before any data moves, and the group
    stays usable (the next call gives NumPy's sums)."""
    need(kind)
    n, me = dist.get_world_size(), dist.get_rank()
    ours, last = MISMATCHES[case]
    call = dist.all_reduce_bucketed if fn == "bucketed" else dist.all_reduce_coalesced
    before = get_debug_level()
    set_debug_level(DebugLevel.DETAIL)
    try:
        if n > 1:
            sizes = last if me == n - 1 else ours
            xs = [make(kind, values(me, s, "float32", salt=i), "float32") for i, s in enumerate(sizes)]
            shapes = re.escape(repr([(s,) for s in last])) if len(last) <= 8 else "crc32 [0-9a-f]{8}"
            desc = rf"all_reduce_\w+\(float32, SUM, {len(last)} arrays, {sum(last)} items, shapes {shapes}\)"
            with pytest.raises(DistError, match=rf"collective mismatch .*global rank {n - 1}: {desc}"):
                w = call(xs, group=fresh, async_op=async_op)
                if w is not None:
                    w.wait()
        xs = [make(kind, values(me, s, "float32", salt=i), "float32") for i, s in enumerate(ours)]
        w = call(xs, group=fresh, async_op=async_op)
        if w is not None:
            assert w.wait() is True
    finally:
        set_debug_level(before)
    for i, (s, x) in enumerate(zip(ours, xs)):
        assert np.array_equal(to_np(x), cast(sum(values(r, s, "float32", salt=i) for r in range(n)), "float32")), i


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


@pytest.mark.parametrize("cap_mb", [1e-9, 25])  # every array in a bucket of its own; all in one bucket
def test_detail_mode_describes_a_bucket_alike_for_numpy_and_torch(cap_mb):
    """Even ranks pass contiguous NumPy arrays (the fast path), odd ranks torch tensors (the general path): both
    describe each bucket as ``all_reduce_bucketed`` with the same fields, so DETAIL mode sees no mismatch (it
    saw ``all_reduce``/``all_reduce_bucketed`` against ``all_reduce_coalesced``); the sums are NumPy's."""
    need("torch", "float32")
    before = get_debug_level()
    set_debug_level(DebugLevel.DETAIL)
    try:
        n, me = dist.get_world_size(), dist.get_rank()
        shapes = [(3,), (2, 2), (5,)]
        kind = "numpy" if me % 2 == 0 else "torch"
        arrays = [make(kind, values(me, math.prod(s), "float32", salt=i).reshape(s), "float32") for i, s in
                  enumerate(shapes)]  # fmt: skip
        dist.all_reduce_bucketed(arrays, bucket_cap_mb=cap_mb)
        for i, (a, s) in enumerate(zip(arrays, shapes, strict=True)):
            want = sum(values(r, math.prod(s), "float32", salt=i) for r in range(n)).reshape(s)
            assert np.array_equal(to_np(a), cast(want, "float32")), i
    finally:
        set_debug_level(before)
