"""dtype -> MPI datatype in one table, and the half-precision helpers.

MPI has no bfloat16 and (portably) no float16. For data movement hpcdist
sends their 16-bit patterns as ``MPI_UINT16_T``; for reductions it widens to
float32, reduces, and rounds once back to nearest-even (:mod:`.reduction`).
It never reduces half floats as int16 (Heat's mistake).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..ops import BITS_ONLY

__all__ = ["BITS_ONLY", "EXPECTED", "HALF_DTYPES", "dtype_info", "mpi_datatype", "supported"]

#: the host dtypes hpcdist communicates, as errors name them
EXPECTED = (
    "bool, (u)int8-64, float16/32/64, longdouble, bfloat16 or complex64/128 (and torch's float8, float4_e2m1fn_x2 "
    "and complex32 CPU tensors, moved but not reduced)"
)

#: logical dtypes that MPI cannot reduce natively
HALF_DTYPES = frozenset({"float16", "bfloat16"})


_TABLE: dict[np.dtype, Any] = {}


def _build() -> None:
    from mpi4py import MPI

    pairs = {
        np.bool_: MPI.C_BOOL,
        np.int8: MPI.INT8_T,
        np.uint8: MPI.UINT8_T,
        np.int16: MPI.INT16_T,
        np.uint16: MPI.UINT16_T,
        np.int32: MPI.INT32_T,
        np.uint32: MPI.UINT32_T,
        np.int64: MPI.INT64_T,
        np.uint64: MPI.UINT64_T,
        np.float16: MPI.UINT16_T,  # bits only: reductions widen first
        np.float32: MPI.FLOAT,
        np.float64: MPI.DOUBLE,
        np.longdouble: MPI.LONG_DOUBLE,
        np.complex64: MPI.C_FLOAT_COMPLEX,
        np.complex128: MPI.C_DOUBLE_COMPLEX,
    }
    for t, mt in pairs.items():
        if mt != MPI.DATATYPE_NULL:
            _TABLE[np.dtype(t)] = mt


#: id(dtype) -> (dtype, MPI datatype, dtype name); holds the dtype so its id cannot be reused
_FAST: dict[int, tuple[np.dtype, Any, str]] = {}


def dtype_info(dtype: np.dtype) -> tuple[np.dtype, Any, str] | None:
    """``(dtype, MPI datatype, name)`` for a supported dtype, else None. O(1) on the hot path."""
    hit = _FAST.get(id(dtype))
    if hit is not None and hit[0] is dtype:
        return hit
    if not _TABLE:
        _build()
    mt = _TABLE.get(dtype)
    if mt is None:
        return None
    entry = (dtype, mt, dtype.name)
    if len(_FAST) < 256:
        _FAST[id(dtype)] = entry
    return entry


def mpi_datatype(dtype: np.dtype) -> Any:
    """The MPI datatype that moves (and, except half floats, reduces) ``dtype``."""
    info = dtype_info(dtype)
    if info is None:
        raise TypeError(f"dtype {dtype} has no MPI datatype: use {EXPECTED}")
    return info[1]


def supported(dtype: np.dtype) -> bool:
    """Whether arrays of this numpy dtype can be communicated."""
    return dtype_info(dtype) is not None
