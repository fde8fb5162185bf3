"""Device-side array helpers for the GPU engines (CuPy arrays).

The reduction arithmetic (half floats in float32, PREMUL_SUM, AVG) is shared
with the host engine in :mod:`hpcdist.buffers.reduction` and re-exported
here; the packing helpers allocate with CuPy. Kernels run on CuPy's current
stream: callers enter the array's stream first (``with stream:``).
"""

from __future__ import annotations

from typing import Any

from ..buffers.adapters import Buf
from ..buffers.packing import pack as _pack
from ..buffers.packing import unpack
from ..buffers.reduction import finish_reduce, narrow_into, order_keys, premultiply, prepare, scale_average, widen
from .streams import require_cupy

__all__ = [
    "empty",
    "finish_reduce",
    "narrow_into",
    "order_keys",
    "pack",
    "premultiply",
    "prepare",
    "scale_average",
    "unpack",
    "widen",
]


def empty(n: int, dtype: Any) -> Any:
    return require_cupy().empty(n, dtype=dtype)


def pack(bufs: list[Buf], dtype: Any) -> Any:
    """The arrays of ``bufs`` concatenated into one new CuPy array."""
    return _pack(bufs, dtype, require_cupy())
