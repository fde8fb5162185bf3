"""The integer keys MIN/MAX of floats run on (hpcdist.buffers.reduction.order_keys), against NumPy's order.

Every float16 and bfloat16 bit pattern, and a million random float32/float64 patterns plus the special
values: the keys sort as the floats compare (-0.0 just below +0.0), every NaN is MAX's largest key and MIN's
smallest, and the floats come back bit for bit (a NaN as the quiet NaN).
"""

from __future__ import annotations

import numpy as np
import pytest

from hpcdist.buffers.reduction import from_order_keys, order_keys
from hpcdist.ops import RedOpType

MIN, MAX = RedOpType.MIN, RedOpType.MAX
UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}


def _patterns(dtype: str) -> np.ndarray:
    """Bit patterns (unsigned) to test: all of them for 16-bit formats."""
    if dtype in ("float16", "bfloat16"):
        return np.arange(1 << 16, dtype=np.uint64).astype(np.uint16)
    width = np.dtype(dtype).itemsize
    rng = np.random.default_rng(7)
    rand = rng.integers(0, np.iinfo(UINT[width]).max, size=1_000_000, dtype=UINT[width], endpoint=True)
    specials = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -np.nan, 1.0, -1.0], dtype=dtype)
    tiny = np.array([np.finfo(dtype).smallest_subnormal, np.finfo(dtype).max], dtype=dtype)
    return np.concatenate([rand, specials.view(UINT[width]), tiny.view(UINT[width]), (-tiny).view(UINT[width])])


def _values(bits: np.ndarray, dtype: str) -> np.ndarray:
    """The floats of the patterns, as float64 (bfloat16: the upper half of a float32)."""
    wide = (bits.astype(np.uint32) << 16).view(np.float32) if dtype == "bfloat16" else bits.view(dtype)
    with np.errstate(invalid="ignore"):  # signalling NaNs
        return wide.astype(np.float64)


def _item(dtype: str, bits: np.ndarray) -> np.ndarray:
    """The patterns as the arrays hpcdist reduces hold them (bfloat16 travels as uint16)."""
    return bits if dtype == "bfloat16" else bits.view(dtype)


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_keys_sort_as_the_floats_compare_and_nan_wins(dtype):
    bits = _patterns(dtype)
    vals = _values(bits, dtype)
    nan = np.isnan(vals)
    for kind in (MIN, MAX):
        keys = order_keys(_item(dtype, bits), dtype, kind)
        assert keys.dtype.kind == "i" and keys.itemsize == bits.itemsize
        extreme = np.iinfo(keys.dtype).min if kind is MIN else None
        if kind is MIN:
            assert (keys[nan] == extreme).all()
            assert (keys[~nan] > extreme).all()
        else:
            assert np.unique(keys[nan]).size == 1 and (keys[~nan] < keys[nan][0]).all()
        order = np.argsort(keys[~nan], kind="stable")
        v, k = vals[~nan][order], keys[~nan][order]
        assert (np.diff(v) >= 0).all()  # non-decreasing floats along increasing keys
        ties = np.flatnonzero(np.diff(k) == 0)  # equal keys: equal patterns only (random draws repeat)
        assert (bits[~nan][order][ties] == bits[~nan][order][ties + 1]).all()
        zeros = v == 0  # -0.0 sorts before +0.0
        signs = np.signbit(v[zeros])
        assert (np.diff(signs.astype(int)) <= 0).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
def test_the_floats_come_back_bit_for_bit_and_nan_as_the_quiet_nan(dtype):
    bits = _patterns(dtype)
    nan = np.isnan(_values(bits, dtype))
    quiet = {"bfloat16": 0x7FC0}.get(dtype)
    if quiet is None:
        quiet = int(np.array([np.nan], dtype=dtype).view(UINT[bits.itemsize])[0])
    for kind in (MIN, MAX):
        back = from_order_keys(order_keys(_item(dtype, bits), dtype, kind), dtype, kind)
        assert back.dtype == _item(dtype, bits).dtype
        got = back.view(bits.dtype)
        assert np.array_equal(got[~nan], bits[~nan])
        assert (got[nan] == quiet).all()


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32", "float64"])
@pytest.mark.parametrize("kind", [MIN, MAX], ids=["MIN", "MAX"])
def test_integer_min_max_of_keys_is_numpys_nan_propagating_min_max(dtype, kind):
    """What MPI computes on the keys, in any order, is np.minimum/np.maximum of the floats."""
    rng = np.random.default_rng(int(kind) * 10 + len(dtype))
    bits = _patterns(dtype)
    for _ in range(20):
        stack = rng.choice(bits, size=(4, 257))
        keys = [order_keys(_item(dtype, row), dtype, kind) for row in stack]
        fold = np.minimum if kind is MIN else np.maximum
        for perm in ([0, 1, 2, 3], [3, 1, 0, 2]):
            red = keys[perm[0]].copy()
            for p in perm[1:]:
                red = fold(red, keys[p])
            got = _values(from_order_keys(red, dtype, kind).view(bits.dtype), dtype)
            want = fold.reduce(_values(stack, dtype), axis=0)
            assert np.array_equal(got, want, equal_nan=True)


def test_keys_are_a_copy_and_take_any_shape():
    x = np.array([[1.5, -2.0], [np.nan, -0.0]], dtype=np.float32)
    before = x.tobytes()
    keys = order_keys(x, "float32", MAX)
    assert keys.shape == (4,) and x.tobytes() == before
    assert not np.shares_memory(keys, x)
    back = from_order_keys(keys, "float32", MAX).reshape(2, 2)
    assert np.array_equal(back, x, equal_nan=True)
