"""Array adapters for GPU memory: CuPy, ``__cuda_array_interface__``, DLPack on CUDA, torch CUDA.

Registered into :mod:`hpcdist.buffers.adapters` when this module is imported
(cheaply: the probes look at ``sys.modules`` and attributes and import
nothing). Every adapter returns a :class:`~hpcdist.buffers.adapters.Buf`
whose ``arr`` is a C-contiguous CuPy array sharing the user's memory (or a
contiguous copy with a ``writeback``), ``device="cuda"``, ``index`` its
ordinal. Building that array needs CuPy; without it the error says so.
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np

from ..buffers import adapters as _host
from ..buffers.adapters import TORCH_DEVICE_ADAPTERS, Buf, register_adapter
from ..buffers.dtypes import supported
from .streams import require_cupy

__all__ = ["DLPACK_CUDA_DEVICES", "register"]

#: DLPack device types that are CUDA device memory: kDLCUDA, kDLCUDAManaged
DLPACK_CUDA_DEVICES = frozenset({2, 13})


def _check_dtype(dtype: Any, argname: str) -> None:
    if not supported(np.dtype(dtype)):
        raise TypeError(
            f"{argname} has dtype {dtype}, which hpcdist cannot communicate; expected bool, (u)int8-64, "
            "float16/32/64, bfloat16 or complex64/128"
        )


_NAMES: dict[Any, str] = {}  # dtype -> its name, for the dtypes already checked (dtype.name is slow)


def _dtype_name(dtype: Any, argname: str) -> str:
    name = _NAMES.get(dtype)
    if name is None:
        _check_dtype(dtype, argname)
        name = _NAMES[dtype] = np.dtype(dtype).name
    return name


def _device_buf(arr: Any, obj: Any, argname: str, write: bool, dtype: str | None = None) -> Buf:
    """``arr`` (a CuPy array on the user's memory) -> Buf; copies when not C-contiguous."""
    name = dtype or _dtype_name(arr.dtype, argname)
    index = int(arr.device.id)
    if arr.flags.c_contiguous:
        return Buf(arr, obj, name, "cuda", None, index)
    cupy = sys.modules["cupy"]
    tmp = cupy.ascontiguousarray(arr)
    if not write:
        return Buf(tmp, obj, name, "cuda", None, index)
    _host.refuse_shared_elements(argname, tuple(arr.shape), tuple(arr.strides), arr.itemsize)

    def writeback(dst: Any = arr, src: Any = tmp) -> None:
        dst[...] = src

    return Buf(tmp, obj, name, "cuda", writeback, index)


def _not_host_kind(obj: Any) -> bool:
    return not isinstance(obj, np.ndarray) and not _host.is_torch(obj)


# ---------------------------------------------------------------- CuPy


def _is_cupy(obj: Any) -> bool:
    cupy = sys.modules.get("cupy")
    return cupy is not None and isinstance(obj, cupy.ndarray)


def _cupy(obj: Any, argname: str, write: bool) -> Buf:
    return _device_buf(obj, obj, argname, write)


# ---------------------------------------------------------------- __cuda_array_interface__ (Numba, ...)


def _has_cai(obj: Any) -> bool:
    return _not_host_kind(obj) and not _is_cupy(obj) and hasattr(obj, "__cuda_array_interface__")


def _cai(obj: Any, argname: str, write: bool) -> Buf:
    cai = obj.__cuda_array_interface__
    if not isinstance(cai, dict) or "data" not in cai or "typestr" not in cai:
        raise TypeError(f"{argname}: __cuda_array_interface__ must be a dict with 'data' and 'typestr', got {cai!r}")
    if write and cai["data"][1]:
        raise ValueError(
            f"{argname} is read-only (__cuda_array_interface__ data[1] is True), but this call writes into it"
        )
    _check_dtype(np.dtype(cai["typestr"]), argname)
    cupy = require_cupy(f"{argname}: arrays with __cuda_array_interface__ ({type(obj).__name__})")
    return _device_buf(cupy.asarray(obj), obj, argname, write)


# ---------------------------------------------------------------- DLPack (CUDA, else the host path)


def _has_dlpack_any(obj: Any) -> bool:
    return (
        _not_host_kind(obj) and not _is_cupy(obj) and hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__")
    )


def _dlpack(obj: Any, argname: str, write: bool) -> Buf:
    """Objects of one type may live on either device (JAX): dispatch on this one's."""
    kind = int(obj.__dlpack_device__()[0])
    if kind not in DLPACK_CUDA_DEVICES:
        return _host._dlpack(obj, argname, write)
    cupy = require_cupy(f"{argname}: DLPack arrays on CUDA ({type(obj).__name__})")
    return _device_buf(cupy.from_dlpack(obj), obj, argname, write)


# ---------------------------------------------------------------- torch CUDA tensors

_TORCH_BITS = {"bfloat16": "uint16"}  # no NumPy/CuPy dtype: the bits travel, the logical name stays


def _torch_cuda(obj: Any, argname: str, write: bool) -> Buf:
    """A torch CUDA tensor -> CuPy view of its memory (no stream sync, unlike ``cupy.asarray``)."""
    import torch

    cupy = require_cupy(f"{argname}: torch CUDA tensors")
    t = obj.detach()  # requires_grad tensors: same memory, no autograd
    if t.layout is not torch.strided:
        raise TypeError(f"{argname} is a {t.layout} tensor; only dense (strided) tensors can be communicated")
    logical = str(t.dtype).removeprefix("torch.")
    bits = _TORCH_BITS.get(logical, logical)
    try:
        np_dtype = np.dtype(bits)
    except TypeError:
        raise TypeError(f"{argname} has dtype {t.dtype}, which hpcdist cannot communicate") from None
    _check_dtype(np_dtype, argname)
    copied = not t.is_contiguous() or t.is_conj() or t.is_neg()
    if copied and write:  # an expanded view cannot hold one result per element: refused before any message
        size = np_dtype.itemsize
        _host.refuse_shared_elements(argname, tuple(t.shape), tuple(s * size for s in t.stride()), size)
    base = t.resolve_conj().resolve_neg().contiguous() if copied else t
    index = int(t.device.index)
    nbytes = base.numel() * np_dtype.itemsize
    mem = cupy.cuda.UnownedMemory(base.data_ptr(), nbytes, base, index)
    arr = cupy.ndarray(tuple(base.shape), np_dtype, cupy.cuda.MemoryPointer(mem, 0))
    if not copied or not write:
        return Buf(arr, obj, logical, "cuda", None, index)

    def writeback(dst: Any = obj, src: Any = base) -> None:
        # an inference tensor (made under torch.inference_mode()) takes in-place updates only in inference mode
        with torch.no_grad(), torch.inference_mode(dst.is_inference()):
            dst.copy_(src)

    return Buf(arr, obj, logical, "cuda", writeback, index)


_REGISTERED: list[bool] = []


def register() -> None:
    """Put the GPU adapters in the registry (idempotent; done when this module is imported)."""
    if _REGISTERED:
        return
    _REGISTERED.append(True)
    register_adapter("dlpack-any", _has_dlpack_any, _dlpack, first=True)
    register_adapter("cuda-array-interface", _has_cai, _cai, first=True)
    register_adapter("cupy", _is_cupy, _cupy, first=True)
    TORCH_DEVICE_ADAPTERS.setdefault("cuda", _torch_cuda)


register()
