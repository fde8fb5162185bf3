"""dtype -> MPI datatype in one table, and the half-precision helpers.

MPI has no bfloat16 and (portably) no float16. For data movement hpcdist
sends their 16-bit patterns as ``MPI_UINT16_T``; for reductions it widens to
float32, reduces, and rounds once back to nearest-even. It never reduces
half floats as int16 (Heat's mistake).
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = ["HALF_DTYPES", "bf16_bits_to_f32", "f32_to_bf16_bits", "mpi_datatype", "widen", "narrow_into"]

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
        raise TypeError(
            f"dtype {dtype} has no MPI datatype: use bool, (u)int8-64, float16/32/64, bfloat16, complex64/128"
        )
    return info[1]


def supported(dtype: np.dtype) -> bool:
    """Whether arrays of this numpy dtype can be communicated."""
    return dtype_info(dtype) is not None


def bf16_bits_to_f32(bits: np.ndarray) -> np.ndarray:
    """bfloat16 bit patterns (uint16) -> float32 values (exact)."""
    return (bits.astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns, round to nearest even; NaN stays NaN."""
    u = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    rounded = ((u + (((u >> 16) & 1) + 0x7FFF)) >> 16).astype(np.uint16)
    nan = np.isnan(x)
    if nan.any():
        rounded[nan] = ((u[nan] >> 16) | 0x0040).astype(np.uint16)
    return rounded


def widen(arr: np.ndarray, dtype: str) -> np.ndarray:
    """A float32 copy of a float16/bfloat16 array for reduction."""
    if dtype == "bfloat16":
        return bf16_bits_to_f32(arr)
    return arr.astype(np.float32)


def narrow_into(dst: np.ndarray, wide: np.ndarray, dtype: str) -> None:
    """Round the float32 result back into the half-precision array ``dst``."""
    if dtype == "bfloat16":
        dst[...] = f32_to_bf16_bits(wide).reshape(dst.shape)
    else:
        dst[...] = wide.astype(np.float16).reshape(dst.shape)
