"""What NCCL can reduce: dtype and op tables, and the plan for one reduction.

Pure Python (NCCL's enum values from ``nccl.h``), so the checks run and are
tested without a GPU. Data movement (broadcast, gathers, all-to-all, p2p)
sends bytes and works for every dtype; reductions need an NCCL type:

* no 16-bit integers, no long double: TypeError with the fix;
* complex is reduced as pairs of floats, so SUM/AVG/PREMUL_SUM only;
* no bitwise ops: BAND/BOR/BXOR raise, except on bool where BAND/BOR are
  MIN/MAX (as are PRODUCT/SUM, torch's bool semantics); bool BXOR raises;
* AVG is ncclAvg from NCCL 2.10 (else SUM then divide); PREMUL_SUM scales the
  inputs first (CuPy does not expose ncclRedOpCreatePreMulSum).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...ops import RedOpType, ResolvedOp

__all__ = ["NCCL_BYTE", "NCCL_DTYPES", "NCCL_OPS", "NcclReduction", "nccl_reduction"]

#: ncclDataType_t by logical dtype name
NCCL_DTYPES: dict[str, int] = {
    "int8": 0,
    "uint8": 1,
    "int32": 2,
    "uint32": 3,
    "int64": 4,
    "uint64": 5,
    "float16": 6,
    "float32": 7,
    "float64": 8,
    "bfloat16": 9,
    "bool": 1,
}
#: complex dtypes travel as twice as many of these
_COMPLEX = {"complex64": "float32", "complex128": "float64"}
#: ncclRedOp_t
NCCL_OPS: dict[str, int] = {"sum": 0, "prod": 1, "max": 2, "min": 3, "avg": 4}
NCCL_BYTE = 1  # ncclUint8: what data movement sends
AVG_VERSION = 21000  # NCCL 2.10.0 added ncclAvg and ncclBfloat16

_BY_KIND = {
    RedOpType.SUM: "sum",
    RedOpType.AVG: "avg",
    RedOpType.PREMUL_SUM: "sum",
    RedOpType.PRODUCT: "prod",
    RedOpType.MIN: "min",
    RedOpType.MAX: "max",
}
_BOOL = {
    RedOpType.SUM: "max",
    RedOpType.MAX: "max",
    RedOpType.BOR: "max",
    RedOpType.PRODUCT: "min",
    RedOpType.MIN: "min",
    RedOpType.BAND: "min",
}
_FIX = "use backend='cpu:mpi,cuda:mpi' (CUDA-aware or staged MPI) for this group, or another dtype"


@dataclass(frozen=True)
class NcclReduction:
    """How NCCL runs one reduction: its datatype and op, elements per array element, scaling around it."""

    datatype: int
    op: int
    per_element: int  # 2 for complex (pairs of floats)
    premul: Any = None  # multiply the inputs by this first
    divide_after: bool = False  # AVG on NCCL < 2.10: SUM, then divide by the group size


def nccl_reduction(dtype: str, rop: ResolvedOp, version: int, argname: str = "op") -> NcclReduction:
    """The plan for reducing ``dtype`` with ``rop``, or TypeError/ValueError naming what NCCL lacks."""
    kind = rop.kind
    base = _COMPLEX.get(dtype, dtype)
    dt = NCCL_DTYPES.get(base)
    if dt is None:
        raise TypeError(f"NCCL cannot reduce dtype {dtype} (it has no such type); {_FIX}")
    if dtype == "bfloat16" and version < AVG_VERSION:
        raise TypeError(f"NCCL {version} cannot reduce bfloat16 (needs NCCL >= 2.10); {_FIX}")
    if dtype == "bool":
        name = _BOOL.get(kind)
        if name is None:
            raise ValueError(f"{argname}=ReduceOp.{kind.name} on bool arrays is not supported by NCCL; {_FIX}")
        return NcclReduction(dt, NCCL_OPS[name], 1)
    name = _BY_KIND.get(kind)
    if name is None:
        raise ValueError(f"{argname}=ReduceOp.{kind.name} is bitwise; NCCL has no bitwise reductions; {_FIX}")
    per = 2 if dtype in _COMPLEX else 1
    if per == 2 and name not in ("sum", "avg"):
        raise ValueError(f"{argname}=ReduceOp.{kind.name} is not defined for complex dtype {dtype}")
    if name == "avg" and version < AVG_VERSION:
        return NcclReduction(dt, NCCL_OPS["sum"], per, rop.premul, True)
    return NcclReduction(dt, NCCL_OPS[name], per, rop.premul)
