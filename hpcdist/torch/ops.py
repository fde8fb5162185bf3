"""torch's ``ReduceOp`` objects and tensor dtypes, checked and mapped to hpcdist's.

torch hands the backend ``opts.reduceOp``, a ``torch.distributed.ReduceOp``
whose ``.op`` is a ``RedOpType`` (same numeric values as hpcdist's) and, for
``PREMUL_SUM`` (``_make_nccl_premul_sum(factor)``), a ``.factor``. Every op
gloo supports (SUM, PRODUCT, MIN, MAX, BAND, BOR, BXOR) plus AVG and
PREMUL_SUM works; bitwise ops need integer or bool tensors, MIN/MAX/PRODUCT
and bitwise ops are undefined on complex tensors.

Dtypes: bool, uint8-64, int8-64, float16, bfloat16, float32, float64,
complex64, complex128 (gloo's plus uint16-64, float16/bfloat16 and complex),
and, moved but never reduced, the float8 dtypes, float4_e2m1fn_x2 and
complex32 (their bits travel: every operation but the reductions, which raise
ValueError; gloo moves the float8 dtypes point to point only). Anything else
raises TypeError naming the operation, the dtype and the list above, before
any message moves.
"""

from __future__ import annotations

from typing import Any

import torch

from ..ops import BITS_ONLY, RedOpType, ResolvedOp, resolve_op

__all__ = [
    "SUPPORTED_DTYPES",
    "BackendTypeError",
    "BackendValueError",
    "check_same_dtype",
    "check_tensors",
    "plain_op",
    "reduce_op",
    "torch_error",
]

SUPPORTED_DTYPES = (
    torch.bool,
    torch.uint8,
    torch.uint16,
    torch.uint32,
    torch.uint64,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
    *(d for d in (getattr(torch, name, None) for name in sorted(BITS_ONLY)) if d is not None),
)
_OK = frozenset(SUPPORTED_DTYPES)
_NAMES = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
_LOGICAL = {torch.bfloat16: "bfloat16", torch.float16: "float16", torch.bool: "bool"}


class BackendValueError(ValueError, RuntimeError):
    """A bad argument to a backend call: hpcdist's ValueError, and the RuntimeError gloo raises there."""


class BackendTypeError(TypeError, RuntimeError):
    """A bad dtype (or mixed dtypes) in a backend call: hpcdist's TypeError, and gloo's RuntimeError."""


def torch_error(exc: ValueError | TypeError) -> BaseException:
    """``exc`` (an argument check of hpcdist's, raised before any message moved) as a RuntimeError too, as
    torch's backends raise theirs (``except RuntimeError`` written for gloo catches it); message unchanged."""
    if isinstance(exc, RuntimeError):
        return exc
    new = (BackendValueError if isinstance(exc, ValueError) else BackendTypeError)(*exc.args)
    return new.with_traceback(exc.__traceback__)


def _dtype_error(opname: str, argname: str, t: Any) -> TypeError:
    return BackendTypeError(
        f"hpcdist backend: {opname}: {argname} has dtype {t.dtype}, which hpcdist cannot communicate; "
        f"supported dtypes: {_NAMES}"
    )


def check_tensors(opname: str, argname: str, tensors: Any) -> None:
    """Raise TypeError unless every tensor of ``tensors`` (a list, maybe nested once) has a supported dtype."""
    for t in tensors:
        if isinstance(t, (list, tuple)):
            for u in t:
                if u.dtype not in _OK:
                    raise _dtype_error(opname, argname, u)
        elif t.dtype not in _OK:
            raise _dtype_error(opname, argname, t)


def check_same_dtype(opname: str, argname: str, tensors: Any) -> None:
    """Raise :class:`BackendTypeError` unless every tensor of ``tensors`` has the first one's dtype (as gloo)."""
    for i, t in enumerate(tensors[1:], 1):
        if t.dtype != tensors[0].dtype:
            raise BackendTypeError(
                f"hpcdist backend: {opname}: {argname}[{i}] has dtype {t.dtype}, expected {tensors[0].dtype}; "
                "the tensors of one coalesced call must all have the same dtype"
            )


def _logical(dtype: Any) -> str:
    name = _LOGICAL.get(dtype)
    return name if name is not None else str(dtype).removeprefix("torch.")


#: (torch RedOpType, torch dtype) -> hpcdist op, for every pair but PREMUL_SUM once checked
_CACHE: dict[tuple[Any, Any], Any] = {}


def reduce_op(opname: str, op: Any, dtype: Any) -> Any:
    """torch's ``ReduceOp`` (or RedOpType) -> what :func:`hpcdist.all_reduce` takes as ``op``.

    Raises :class:`BackendValueError` (a ValueError and RuntimeError) naming the operation, the op, the dtype and what works.
    """
    kind = getattr(op, "op", op)
    value = int(kind)
    hit = _CACHE.get((kind, dtype))
    if hit is not None:
        return hit
    if value == RedOpType.PREMUL_SUM:
        factor = getattr(op, "factor", None)
        if factor is None:
            raise BackendValueError(
                f"hpcdist backend: {opname}: ReduceOp.PREMUL_SUM needs a factor (_make_nccl_premul_sum)"
            )
        if isinstance(factor, torch.Tensor):
            factor = factor.item()
        hop: Any = RedOpType.PREMUL_SUM(factor)
    else:
        hop = RedOpType(value)
    try:
        checked: ResolvedOp = resolve_op(hop, _logical(dtype), "op")
    except (ValueError, TypeError) as exc:
        raise BackendValueError(
            f"hpcdist backend: {opname} with ReduceOp.{RedOpType(value).name} on dtype {dtype}: {exc}. "
            "Supported: SUM, AVG, PREMUL_SUM on every dtype but bool (AVG/PREMUL_SUM; whole factors on integers); "
            "MIN, MAX, PRODUCT on real dtypes; BAND, BOR, BXOR on integer and bool dtypes; none on float8, float4 and "
            "complex32 (moved, not reduced)"
        ) from None
    del checked
    if value != RedOpType.PREMUL_SUM:
        _CACHE[(kind, dtype)] = hop
    return hop


def plain_op(op: Any, dtype: Any) -> Any:
    """The hot path's :func:`reduce_op`: the op for torch's ``ReduceOp`` ``op`` on ``dtype`` when that pair was
    resolved (so checked) before, else None (first use, PREMUL_SUM: call :func:`reduce_op`)."""
    return _CACHE.get((op.op, dtype))
