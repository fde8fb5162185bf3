"""Device-side twins of the host reduction helpers, written for CuPy arrays.

half floats are reduced in float32 (bfloat16 bits widened exactly, rounded
back to nearest even, NaN kept NaN), PREMUL_SUM multiplies first, AVG
divides after (integers truncate toward zero). Kernels run on CuPy's current
stream: callers enter the array's stream first (``with stream:``).
"""

from __future__ import annotations

from typing import Any

from ..buffers.adapters import Buf
from ..buffers.dtypes import HALF_DTYPES
from ..ops import ResolvedOp
from .streams import require_cupy

__all__ = [
    "empty",
    "finish_reduce",
    "narrow_into",
    "pack",
    "premultiply",
    "prepare",
    "scale_average",
    "unpack",
    "widen",
]


def widen(arr: Any, dtype: str) -> Any:
    cp = require_cupy()
    if dtype == "bfloat16":
        return (arr.astype(cp.uint32) << 16).view(cp.float32)
    return arr.astype(cp.float32)


def narrow_into(dst: Any, wide: Any, dtype: str) -> None:
    cp = require_cupy()
    if dtype == "bfloat16":
        u = cp.ascontiguousarray(wide, dtype=cp.float32).view(cp.uint32)
        rounded = ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype(cp.uint16)
        quiet = ((u >> 16) | 0x0040).astype(cp.uint16)
        dst[...] = cp.where(cp.isnan(wide), quiet, rounded).reshape(dst.shape)
    else:
        dst[...] = wide.astype(cp.float16).reshape(dst.shape)


def scale_average(arr: Any, n: int) -> None:
    cp = require_cupy()
    if arr.dtype.kind in "fc":
        arr /= n
    else:
        cp.copyto(arr, cp.trunc(arr / n), casting="unsafe")


def premultiply(arr: Any, factor: Any) -> None:
    cp = require_cupy()
    cp.multiply(arr, factor, out=arr, casting="unsafe")


def prepare(buf: Buf, rop: ResolvedOp, copy: bool) -> Any:
    """The device array to reduce: widened (half floats), premultiplied, or a copy."""
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
    if rop.average:
        scale_average(work, n)
    if dst.dtype in HALF_DTYPES:
        narrow_into(dst.arr, work, dst.dtype)
    elif work is not dst.arr:
        dst.arr[...] = work.reshape(dst.arr.shape)
    if dst.writeback is not None:
        dst.writeback()


def empty(n: int, dtype: Any) -> Any:
    return require_cupy().empty(n, dtype=dtype)


def pack(bufs: list[Buf], dtype: Any) -> Any:
    cp = require_cupy()
    if not bufs:
        return cp.empty(0, dtype=dtype)
    return cp.concatenate([b.arr.reshape(-1) for b in bufs])


def unpack(flat: Any, outs: list[Buf]) -> None:
    pos = 0
    for o in outs:
        n = o.arr.size
        o.arr.reshape(-1)[...] = flat[pos : pos + n]
        pos += n
        if o.writeback is not None:
            o.writeback()
