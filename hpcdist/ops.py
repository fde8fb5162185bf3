"""Reduction operations: :class:`ReduceOp` with torch's names, mapped to MPI.

``ReduceOp.SUM``, ``PRODUCT``, ``MIN``, ``MAX``, ``BAND``, ``BOR``, ``BXOR``,
``AVG`` and ``PREMUL_SUM`` are members of :class:`RedOpType` (an ``IntEnum``
with torch's values). ``ReduceOp.PREMUL_SUM(factor)`` (or
``_make_nccl_premul_sum(factor)``) gives a sum that multiplies every input by
``factor`` first.

MPI has no AVG or PREMUL_SUM: hpcdist runs a SUM and scales (AVG divides by
the group size; integer AVG truncates toward zero, as NCCL does).
"""

from __future__ import annotations

import enum
import math
import numbers
from typing import Any

import numpy as np

__all__ = ["BITS_ONLY", "RedOpType", "ReduceOp", "ResolvedOp", "reduce_op", "resolve_op", "supports_complex"]


class RedOpType(enum.IntEnum):
    """The kinds of reduction, with torch's numeric values."""

    SUM = 0
    AVG = 1
    PRODUCT = 2
    MIN = 3
    MAX = 4
    BAND = 5
    BOR = 6
    BXOR = 7
    PREMUL_SUM = 8
    UNUSED = 9

    def __call__(self, factor: Any) -> _PremulSum:
        """``ReduceOp.PREMUL_SUM(factor)``: a SUM of inputs multiplied by factor."""
        if self is not RedOpType.PREMUL_SUM:
            raise TypeError(f"only ReduceOp.PREMUL_SUM takes a factor; ReduceOp.{self.name} is not callable")
        return _PremulSum(factor)


class _PremulSum:
    """A PREMUL_SUM bound to its factor (a Python scalar or a one-element array)."""

    __slots__ = ("factor",)

    def __init__(self, factor: Any) -> None:
        if isinstance(factor, bool) or not isinstance(factor, (int, float, complex, np.number)):
            numel = getattr(factor, "numel", None)  # a torch tensor's size is a method: ask numel() first
            size = numel() if callable(numel) else getattr(factor, "size", None)
            item = factor.item() if size == 1 else None  # type: ignore[union-attr]
            if isinstance(item, bool) or not isinstance(item, (int, float, complex)):
                raise TypeError(
                    "PREMUL_SUM factor must be a number or a one-element array of numbers, got "
                    f"{type(factor).__name__}" + ("" if size in (None, 1) else f" of {size} elements")
                )
            factor = item
        self.factor = factor

    op = RedOpType.PREMUL_SUM

    def __repr__(self) -> str:
        return f"ReduceOp.PREMUL_SUM({self.factor!r})"

    def __eq__(self, other: object) -> bool:
        return other is RedOpType.PREMUL_SUM or (isinstance(other, _PremulSum) and other.factor == self.factor)

    def __hash__(self) -> int:
        return hash(("premul", self.factor))


class ReduceOp:
    """torch.distributed's ``ReduceOp``: ``ReduceOp.SUM`` etc. are :class:`RedOpType` members."""

    RedOpType = RedOpType
    SUM = RedOpType.SUM
    AVG = RedOpType.AVG
    PRODUCT = RedOpType.PRODUCT
    MIN = RedOpType.MIN
    MAX = RedOpType.MAX
    BAND = RedOpType.BAND
    BOR = RedOpType.BOR
    BXOR = RedOpType.BXOR
    PREMUL_SUM = RedOpType.PREMUL_SUM
    UNUSED = RedOpType.UNUSED

    def __new__(cls, op: Any = 0) -> Any:  # ReduceOp(ReduceOp.MAX) -> MAX
        return RedOpType(op)


class reduce_op:
    """Deprecated alias of :class:`ReduceOp` kept for old torch code."""

    SUM = RedOpType.SUM
    PRODUCT = RedOpType.PRODUCT
    MIN = RedOpType.MIN
    MAX = RedOpType.MAX


def _make_nccl_premul_sum(factor: Any) -> _PremulSum:
    """torch's private constructor of a PREMUL_SUM op, kept for compatibility."""
    return _PremulSum(factor)


_NO_COMPLEX = {RedOpType.MAX, RedOpType.MIN, RedOpType.PRODUCT, RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR}
_BITWISE = {RedOpType.BAND, RedOpType.BOR, RedOpType.BXOR}
_MINMAX = {RedOpType.MIN, RedOpType.MAX}


def supports_complex(reduceOp: Any) -> bool:
    """Whether ``reduceOp`` is defined on complex numbers (False for MAX, MIN, PRODUCT, bitwise)."""
    op = reduceOp.op if isinstance(reduceOp, _PremulSum) else RedOpType(reduceOp)
    return op not in _NO_COMPLEX


class ResolvedOp:
    """An op checked against one dtype: what MPI runs plus the scaling around it."""

    __slots__ = ("average", "direct", "kind", "mpi_name", "ordered", "plain", "premul")

    def __init__(
        self,
        kind: RedOpType,
        mpi_name: str,
        premul: Any = None,
        average: bool = False,
        half: bool = False,
        ordered: bool = False,
    ) -> None:
        self.kind = kind
        self.mpi_name = mpi_name  # attribute of mpi4py.MPI: "SUM", "PROD", ...
        self.premul = premul
        self.average = average
        # MIN/MAX of floats: MPI runs them on integer keys of the bits (:func:`hpcdist.buffers.reduction.order_keys`),
        # on which a NaN wins; MPI's own MIN/MAX compare with ``<`` and lose a NaN, or worse (sharp-bits.md)
        self.ordered = ordered
        self.plain = premul is None and not average and not ordered  # MPI's op alone gives the answer
        # ... on the array itself (``half``: a float16/bfloat16 array, reduced in float32 instead)
        self.direct = self.plain and not half


_MPI_NAME = {
    RedOpType.SUM: "SUM",
    RedOpType.AVG: "SUM",
    RedOpType.PREMUL_SUM: "SUM",
    RedOpType.PRODUCT: "PROD",
    RedOpType.MIN: "MIN",
    RedOpType.MAX: "MAX",
    RedOpType.BAND: "BAND",
    RedOpType.BOR: "BOR",
    RedOpType.BXOR: "BXOR",
}
# bool arrays: torch reduces them as logical ops
_BOOL_NAME = {
    RedOpType.SUM: "LOR",
    RedOpType.MAX: "LOR",
    RedOpType.BOR: "LOR",
    RedOpType.PRODUCT: "LAND",
    RedOpType.MIN: "LAND",
    RedOpType.BAND: "LAND",
    RedOpType.BXOR: "LXOR",
}
_HALF = ("float16", "bfloat16")
#: the floating dtypes whose MIN/MAX run on ordered integer keys (longdouble: MPI's own, see sharp-bits.md)
_ORDERED = frozenset({"float16", "bfloat16", "float32", "float64"})
#: (op, dtype name) -> ResolvedOp: what resolve_op checked once (collectives look it up first, on the hot path)
CACHE: dict[tuple[Any, str], ResolvedOp] = {}


def _premul_factor(factor: Any, dtype: str, argname: str) -> Any:
    """A PREMUL_SUM factor as an array of ``dtype`` takes it; ValueError for one it cannot (checked before any
    message moves, where NumPy would drop an imaginary part, truncate a fraction or overflow mid-call)."""
    if isinstance(factor, (complex, np.complexfloating)) and not dtype.startswith("complex"):
        if factor.imag != 0:
            raise ValueError(
                f"{argname}=ReduceOp.PREMUL_SUM({factor!r}) has an imaginary part, but the array is real "
                f"(dtype {dtype}); use a real factor or a complex array"
            )
        factor = factor.real
    if dtype.startswith(("int", "uint")):
        lo, hi = _INT_RANGE.get(dtype) or _INT_RANGE.setdefault(
            dtype, (int(np.iinfo(dtype).min), int(np.iinfo(dtype).max))
        )
        whole = isinstance(factor, (int, np.integer)) or (math.isfinite(factor) and factor == int(factor))
        if not whole or not lo <= int(factor) <= hi:
            raise ValueError(
                f"{argname}=ReduceOp.PREMUL_SUM({factor!r}) on an integer array (dtype {dtype}) needs a whole factor "
                f"between {lo} and {hi}; a fraction would truncate each product (NCCL refuses integer "
                "PREMUL_SUM): convert the array to a floating dtype"
            )
        factor = int(factor)
    return factor


#: integer dtype name -> (min, max), filled as met (np.iinfo costs microseconds)
_INT_RANGE: dict[str, tuple[int, int]] = {}


#: plain numbers, which compare and hash equal to RedOpType members (True == 1 == AVG, 3 + 0j == Fraction(3) ==
#: MIN) but are no ReduceOp; the concrete types first (the common ones), the ABC for the rest (Fraction, Decimal)
NUMBERS = (bool, int, float, complex, np.number, numbers.Number)


#: torch dtypes without a NumPy dtype that hpcdist moves as their bits (a view of their memory as unsigned integers
#: of their size) but never reduces: no arithmetic of theirs runs here (reductions raise ValueError, naming the
#: conversion to reduce instead). gloo moves them only point to point (its collectives refuse them: "Invalid
#: scalar type"), except complex32, which torch.distributed hands gloo as float16 pairs.
BITS_ONLY = frozenset(
    {
        "float8_e4m3fn",
        "float8_e5m2",
        "float8_e4m3fnuz",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
        "float4_e2m1fn_x2",
        "complex32",
    }
)


def resolve_op(op: Any, dtype: str, argname: str = "op") -> ResolvedOp:
    """Check ``op`` against the logical dtype name; return how to run it.

    Raises TypeError for a value that is no ReduceOp, ValueError for an op the
    dtype does not support (bitwise ops on floats, MIN/MAX on complex).
    """
    if isinstance(op, NUMBERS) and type(op) is not RedOpType:  # True == AVG == 1.0 as dict keys: refuse first
        raise TypeError(
            f"{argname} must be a ReduceOp (e.g. ReduceOp.SUM), got {op!r}: a {type(op).__name__} is no ReduceOp "
            "(was it meant for another argument, such as async_op?)"
        )
    key = (op, dtype)
    try:
        hit = CACHE.get(key)  # checked once per (op, dtype): the hot path is this lookup
    except TypeError:  # unhashable: no ReduceOp
        raise TypeError(f"{argname} must be a ReduceOp (e.g. ReduceOp.SUM), got {op!r}") from None
    if hit is not None:
        return hit
    if isinstance(op, _PremulSum):  # never cached: the factor varies call by call
        base = resolve_op(RedOpType.SUM, dtype, argname)
        if dtype == "bool":
            raise ValueError(f"{argname}=PREMUL_SUM is not defined for bool arrays")
        return ResolvedOp(RedOpType.PREMUL_SUM, base.mpi_name, premul=_premul_factor(op.factor, dtype, argname))
    try:
        kind = RedOpType(op)
    except (ValueError, TypeError):
        raise TypeError(f"{argname} must be a ReduceOp (e.g. ReduceOp.SUM), got {op!r}") from None
    if kind is RedOpType.PREMUL_SUM:
        raise ValueError(f"{argname}=ReduceOp.PREMUL_SUM needs a factor: use ReduceOp.PREMUL_SUM(factor)")
    if kind is RedOpType.UNUSED:
        raise ValueError(f"{argname}=ReduceOp.UNUSED is not a reduction")
    if dtype in BITS_ONLY:
        convert = "torch.view_as_real(tensor), float16 pairs" if dtype == "complex32" else "tensor.float()"
        raise ValueError(
            f"{argname}=ReduceOp.{kind.name} cannot reduce {dtype}: hpcdist moves {dtype} tensors as their bits only "
            f"(send/recv, broadcast, gathers, scatters, all_to_all); reduce a converted copy ({convert}) instead"
        )
    floating = dtype.startswith(("float", "bfloat", "complex"))
    if kind in _BITWISE and floating:
        raise ValueError(
            f"{argname}=ReduceOp.{kind.name} is bitwise and needs an integer or bool array, got dtype {dtype}"
        )
    if dtype.startswith("complex") and kind in _NO_COMPLEX:
        raise ValueError(f"{argname}=ReduceOp.{kind.name} is not defined for complex dtype {dtype}")
    if dtype == "bool":
        if kind is RedOpType.AVG:
            raise ValueError(f"{argname}=ReduceOp.AVG is not defined for bool arrays")
        resolved = ResolvedOp(kind, _BOOL_NAME[kind])
    else:
        resolved = ResolvedOp(
            kind,
            _MPI_NAME[kind],
            average=kind is RedOpType.AVG,
            half=dtype in _HALF,
            ordered=kind in _MINMAX and dtype in _ORDERED,
        )
    CACHE[key] = resolved
    return resolved
