"""Array kinds a checkpoint stores: host copies on save, in-place fills on load.

One registry entry per array kind (NumPy, torch, CuPy): a test for the kind,
``to_host`` (a C-contiguous NumPy array in a dtype HDF5 stores, plus the
logical dtype name) and ``fill`` (copy a host array into the target in place).
bfloat16 (torch's, or ml_dtypes' NumPy dtype) is stored as uint16 with the
logical name ``"bfloat16"`` in the metadata and the dataset's attributes;
torch's float8 dtypes, float4_e2m1fn_x2 and complex32 (which NumPy lacks) as
their bits, unsigned integers of their element size, with their logical name.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ..buffers.adapters import torch_bits
from ..ops import BITS_ONLY

__all__ = ["ArrayKind", "find_kind", "is_array", "logical_dtype", "to_host", "fill"]

#: NumPy dtype kinds HDF5 stores as they are: bool, signed/unsigned ints, floats, complex
_NATIVE_KINDS = "biufc"


@dataclass(frozen=True)
class ArrayKind:
    """How one array type moves to host memory and back."""

    name: str
    test: Callable[[Any], bool]
    to_host: Callable[[Any, bool], tuple[np.ndarray, str]]
    fill: Callable[[Any, np.ndarray], None]
    dtype_of: Callable[[Any], str]


_KINDS: list[ArrayKind] = []


def register(kind: ArrayKind) -> None:
    """Add an array kind (tested in registration order)."""
    if any(k.name == kind.name for k in _KINDS):
        raise ValueError(f"array kind {kind.name!r} is registered already")
    _KINDS.append(kind)


def find_kind(obj: Any) -> ArrayKind | None:
    for k in _KINDS:
        if k.test(obj):
            return k
    return None


def is_array(obj: Any) -> bool:
    return find_kind(obj) is not None


def logical_dtype(obj: Any) -> str:
    kind = find_kind(obj)
    if kind is None:
        raise TypeError(f"not an array: {type(obj).__name__}")
    return kind.dtype_of(obj)


def to_host(obj: Any, copy: bool) -> tuple[np.ndarray, str]:
    """(C-contiguous host array in a storable dtype, logical dtype name); a copy when ``copy``."""
    kind = find_kind(obj)
    if kind is None:
        raise TypeError(f"not an array: {type(obj).__name__}")
    return kind.to_host(obj, copy)


def fill(target: Any, host: np.ndarray) -> None:
    """Copy ``host`` (stored dtype) into ``target`` in place."""
    kind = find_kind(target)
    if kind is None:
        raise TypeError(f"not an array: {type(target).__name__}")
    kind.fill(target, host)


# ------------------------------------------------------------------ NumPy


def _np_dtype_name(dt: np.dtype) -> str:
    if dt.name == "bfloat16":  # ml_dtypes
        return "bfloat16"
    if dt.kind not in _NATIVE_KINDS or dt.fields is not None:
        raise TypeError(
            f"dtype {dt} cannot be checkpointed: use bool, int, uint, float16/32/64, bfloat16 or complex arrays"
        )
    return dt.name


def _c_order(arr: np.ndarray) -> np.ndarray:
    """``arr`` if C-contiguous, else a C-contiguous copy (0-d stays 0-d, unlike np.ascontiguousarray)."""
    return arr if arr.flags.c_contiguous else arr.copy(order="C")


def _np_storable(arr: np.ndarray) -> np.ndarray:
    if arr.dtype.name == "bfloat16":
        return arr.view(np.uint16)
    if arr.dtype.byteorder == ">":
        return arr.astype(arr.dtype.newbyteorder("="))
    return arr


def _np_to_host(arr: np.ndarray, copy: bool) -> tuple[np.ndarray, str]:
    name = _np_dtype_name(arr.dtype)
    out = np.array(arr, order="C", copy=True) if copy else _c_order(arr)
    return _np_storable(out), name


def _np_fill(target: np.ndarray, host: np.ndarray) -> None:
    if not target.flags.writeable:
        raise ValueError("a read-only NumPy array in the state cannot be loaded into")
    dst = target.view(np.uint16) if target.dtype.name == "bfloat16" else target
    dst[...] = host


register(
    ArrayKind(
        "numpy",
        lambda x: isinstance(x, np.ndarray),
        _np_to_host,
        _np_fill,
        lambda x: _np_dtype_name(x.dtype),
    )
)

# ------------------------------------------------------------------ torch


def _is_torch(x: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(x, torch.Tensor)


def _torch_dtype_name(t: Any) -> str:
    import torch

    if t.dtype == torch.bfloat16:
        return "bfloat16"
    name = str(t.dtype).replace("torch.", "")
    if name in BITS_ONLY:
        return name
    try:
        return _np_dtype_name(np.dtype(name))
    except TypeError:
        raise TypeError(f"torch dtype {t.dtype} cannot be checkpointed") from None


def _torch_to_host(t: Any, copy: bool) -> tuple[np.ndarray, str]:
    import torch

    name = _torch_dtype_name(t)
    t = t.detach()
    if t.is_cuda:
        host = t.to("cpu", copy=True)  # synchronous: the copy is complete on return
    else:
        host = t.clone(memory_format=torch.contiguous_format) if copy else t.contiguous()
    if host.dtype == torch.bfloat16:
        return host.view(torch.int16).numpy().view(np.uint16), name
    bits = torch_bits(host)
    if bits is not None:
        return bits, name
    return host.resolve_conj().resolve_neg().numpy(), name


def _torch_fill(target: Any, host: np.ndarray) -> None:
    import torch

    src = torch.from_numpy(_c_order(host))
    if src.dtype != target.dtype:  # bfloat16, float8, ...: stored as their bits (the dtypes were checked equal)
        src = src.view(target.dtype)
    with torch.no_grad():
        target.copy_(src)


register(ArrayKind("torch", _is_torch, _torch_to_host, _torch_fill, _torch_dtype_name))

# ------------------------------------------------------------------ CuPy


def _is_cupy(x: Any) -> bool:
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(x, cupy.ndarray)


def _cupy_to_host(x: Any, copy: bool) -> tuple[np.ndarray, str]:
    import cupy

    name = _np_dtype_name(x.dtype)
    host = cupy.asnumpy(cupy.ascontiguousarray(x))  # synchronous device-to-host copy
    return _np_storable(host), name


def _cupy_fill(target: Any, host: np.ndarray) -> None:
    import cupy

    target[...] = cupy.asarray(host.view(target.dtype) if host.dtype != target.dtype else host)


register(ArrayKind("cupy", _is_cupy, _cupy_to_host, _cupy_fill, lambda x: _np_dtype_name(x.dtype)))
