"""The arithmetic around a reduction, written once for NumPy and CuPy arrays.

MPI and NCCL cannot reduce half floats portably: hpcdist widens them to
float32 (bfloat16 bits exactly), reduces, and rounds once back to nearest
even (NaN stays NaN). PREMUL_SUM multiplies the inputs first; AVG divides the
sum (integers truncate toward zero, as NCCL does). Every function picks the
array's own module (``numpy`` or ``cupy``), so the host engine and the device
engines share this code; device callers enter the array's stream first.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..ops import ResolvedOp
from .adapters import Buf
from .dtypes import HALF_DTYPES

__all__ = [
    "array_module",
    "bf16_bits_to_f32",
    "f32_to_bf16_bits",
    "finish_reduce",
    "narrow_into",
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


def prepare(buf: Buf, rop: ResolvedOp, copy: bool) -> Any:
    """The array to reduce: widened (half floats), premultiplied, or a copy (``copy``), else ``buf.arr``."""
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
    """After the reduction: AVG scaling, rounding back, copy into ``dst`` and its write-back."""
    if rop.average:
        scale_average(work, n)
    if dst.dtype in HALF_DTYPES:
        narrow_into(dst.arr, work, dst.dtype)
    elif work is not dst.arr:
        dst.arr[...] = work.reshape(dst.arr.shape)
    if dst.writeback is not None:
        dst.writeback()
