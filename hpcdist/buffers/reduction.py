"""The arithmetic around a reduction, written once for NumPy and CuPy arrays.

MPI and NCCL cannot reduce half floats portably: hpcdist widens them to
float32 (bfloat16 bits exactly), reduces, and rounds once back to nearest
even (NaN stays NaN). PREMUL_SUM multiplies the inputs first; AVG divides the
sum (integers truncate toward zero, as NCCL does). MIN and MAX of floats run
on integer keys of the bits (:func:`order_keys`), so that a NaN on any rank
wins, whatever order MPI combines the ranks in. Every function picks the
array's own module (``numpy`` or ``cupy``), so the host engine and the device
engines share this code; device callers enter the array's stream first.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..ops import RedOpType, ResolvedOp
from .adapters import Buf
from .dtypes import HALF_DTYPES

__all__ = [
    "array_module",
    "bf16_bits_to_f32",
    "f32_to_bf16_bits",
    "finish_reduce",
    "from_order_keys",
    "narrow_into",
    "order_keys",
    "premultiply",
    "prepare",
    "scale_average",
    "widen",
]


def array_module(arr: Any) -> Any:
    """``cupy`` for CuPy arrays, else ``numpy`` (never imports CuPy)."""
    if type(arr).__module__.startswith("cupy"):
        return sys.modules["cupy"]
    return np


def bf16_bits_to_f32(bits: Any) -> Any:
    """bfloat16 bit patterns (uint16) -> float32 values (exact)."""
    xp = array_module(bits)
    wide = bits.astype(xp.uint32)
    wide <<= 16  # in place: a 0-d array stays a (writable) array, where ``<<`` would return a NumPy scalar
    return wide.view(xp.float32)


def f32_to_bf16_bits(x: Any) -> Any:
    """float32 -> bfloat16 bit patterns, round to nearest even; NaN stays a (quiet) NaN."""
    xp = array_module(x)
    u = xp.ascontiguousarray(x, dtype=xp.float32).view(xp.uint32)
    rounded = ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype(xp.uint16)
    quiet = ((u >> 16) | 0x0040).astype(xp.uint16)
    return xp.where(xp.isnan(x), quiet, rounded)


def widen(arr: Any, dtype: str) -> Any:
    """A float32 copy of a float16/bfloat16 array, for reduction."""
    if dtype == "bfloat16":
        return bf16_bits_to_f32(arr)
    return arr.astype(array_module(arr).float32)


def narrow_into(dst: Any, wide: Any, dtype: str) -> None:
    """Round the float32 result once, back into the half-precision array ``dst``."""
    if dtype == "bfloat16":
        dst[...] = f32_to_bf16_bits(wide).reshape(dst.shape)
    else:
        dst[...] = wide.astype(array_module(wide).float16).reshape(dst.shape)


def scale_average(arr: Any, n: int) -> None:
    """AVG after the SUM: divide in place; integers exactly, truncating toward zero (as NCCL's ``ncclAvg``).

    Integer division of the exact sum, never through float64 (which rounds
    int64 values above 2**53).
    """
    kind = arr.dtype.kind
    if kind in "fc":
        arr /= n
        return
    xp = array_module(arr)
    quotient = xp.floor_divide(arr, n)
    if kind == "i":  # floor -> toward zero: one up where a negative sum left a remainder
        quotient += ((arr - quotient * n) != 0) & (arr < 0)
    xp.copyto(arr, quotient, casting="unsafe")


def premultiply(arr: Any, factor: Any) -> None:
    """PREMUL_SUM before the SUM: multiply in place."""
    array_module(arr).multiply(arr, factor, out=arr, casting="unsafe")


#: floating dtype name -> (signed integer dtype of its width, its largest value, its smallest, bits of +inf, bits
#: of the quiet NaN, the array's item type: bfloat16 travels as uint16)
_FORMATS = {
    name: (np.dtype(i), int(np.iinfo(i).max), int(np.iinfo(i).min), inf, qnan, np.dtype(item))
    for name, i, inf, qnan, item in (
        ("float16", np.int16, 0x7C00, 0x7E00, np.float16),
        ("bfloat16", np.int16, 0x7F80, 0x7FC0, np.uint16),
        ("float32", np.int32, 0x7F800000, 0x7FC00000, np.float32),
        ("float64", np.int64, 0x7FF0000000000000, 0x7FF8000000000000, np.float64),
    )
}


def order_keys(arr: Any, dtype: str, kind: Any) -> Any:
    """Signed integer keys of the floats ``arr`` (a new flat array): their integer order is the floats' order
    (-inf < ... < -0.0 < +0.0 < ... < +inf), with every NaN made the winner of ``kind`` (MIN or MAX): the
    largest key for MAX, the smallest for MIN. MPI's integer MIN/MAX on the keys is exact, so every rank gets
    the same bits in any order of combining, and :func:`from_order_keys` gives the floats back (a NaN as the
    quiet NaN).

    The key of a float with sign bit clear is its bits; with the sign bit set, the bits of its magnitude
    inverted (``~magnitude``: below every positive key, larger magnitudes lower).
    """
    itype, top, low, inf, qnan, _ = _FORMATS[dtype]
    bits = arr.reshape(-1).view(itype)
    keys = bits & top  # the magnitude
    nan = keys > inf
    keys ^= bits >> (8 * itype.itemsize - 1)  # 0 for a positive number, -1 (inverts) for a negative one
    array_module(keys).copyto(keys, qnan if kind == RedOpType.MAX else low, where=nan)
    return keys


def from_order_keys(keys: Any, dtype: str, kind: Any) -> Any:
    """The floats of :func:`order_keys`' keys (after MIN or MAX), in place; returned as the array's item type."""
    itype, top, low, _, qnan, item = _FORMATS[dtype]
    if kind == RedOpType.MIN:  # MIN's NaN key (the smallest) back to the quiet NaN, whose key is itself
        array_module(keys).copyto(keys, qnan, where=keys == low)
    flip = keys >> (8 * itype.itemsize - 1)
    flip &= top
    keys ^= flip  # a negative key: its magnitude back under the sign bit
    return keys.view(item)


def prepare(buf: Buf, rop: ResolvedOp, copy: bool) -> Any:
    """The array to reduce: integer keys (MIN/MAX of floats), widened (half floats), premultiplied, or a copy
    (``copy``), else ``buf.arr``."""
    if rop.ordered:
        return order_keys(buf.arr, buf.dtype, rop.kind)
    if buf.dtype in HALF_DTYPES:
        work = widen(buf.arr, buf.dtype)
    elif copy or rop.premul is not None:
        work = buf.arr.copy()
    else:
        work = buf.arr
    if rop.premul is not None:
        premultiply(work, rop.premul)
    return work


def finish_reduce(dst: Buf, work: Any, rop: ResolvedOp, n: int) -> None:
    """After the reduction: floats back from keys, AVG scaling, rounding back, copy into ``dst`` and its
    write-back."""
    if rop.ordered:
        work = from_order_keys(work, dst.dtype, rop.kind)
    elif rop.average:
        scale_average(work, n)
    if dst.dtype in HALF_DTYPES and not rop.ordered:
        narrow_into(dst.arr, work, dst.dtype)
    elif work is not dst.arr:
        dst.arr[...] = work.reshape(dst.arr.shape)
    if dst.writeback is not None:
        dst.writeback()
