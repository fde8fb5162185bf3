"""The array-adapter registry: any supported array -> a :class:`Buf`.

A :class:`Buf` is what the backends see: ``arr`` is a C-contiguous array of
the library that owns the memory (a NumPy array for host memory, a CuPy-like
device array for GPU memory) that the communication reads or writes;
``dtype`` is the *logical* dtype name (``"bfloat16"`` for torch's bf16, whose
bits travel as uint16); ``writeback`` copies ``arr`` back into the user's
object when ``arr`` had to be a contiguous copy.

Adapters are registered with :func:`register_adapter`, tried in order of
registration, and cached per Python type, so the hot path is one dict lookup.
Host adapters: NumPy arrays, torch CPU tensors (zero-copy, torch optional),
anything with ``__array_interface__``, the buffer protocol or DLPack.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from .dtypes import BITS_ONLY, EXPECTED, dtype_info, supported

__all__ = [
    "TORCH_DEVICE_ADAPTERS",
    "Buf",
    "adapt",
    "adapt_list",
    "apart",
    "is_slot",
    "is_torch",
    "overlaps",
    "register_adapter",
    "tensor_array",
    "torch_bits",
]


class Buf:
    """One array as the backends see it (see module docstring)."""

    __slots__ = ("arr", "device", "dtype", "index", "obj", "writeback")

    def __init__(
        self,
        arr: Any,
        obj: Any,
        dtype: str,
        device: str = "cpu",
        writeback: Callable[[], None] | None = None,
        index: int = -1,
    ) -> None:
        self.arr = arr  # C-contiguous array MPI/NCCL reads or writes
        self.obj = obj  # the user's object
        self.dtype = dtype  # logical dtype name ("bfloat16" travels as uint16)
        self.device = device  # device type: "cpu" or "cuda"
        self.writeback = writeback  # copies arr into obj when arr is a copy
        self.index = index  # device ordinal (-1 for host memory)

    @property
    def size(self) -> int:
        return int(self.arr.size)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(self.arr.shape)

    def __repr__(self) -> str:
        where = self.device if self.index < 0 else f"{self.device}:{self.index}"
        return f"Buf({type(self.obj).__name__}, dtype={self.dtype}, shape={self.shape}, device={where})"


Adapter = Callable[[Any, str, bool], Buf]
Probe = Callable[[Any], bool]

_ADAPTERS: list[tuple[str, Probe, Adapter]] = []
#: torch tensors share one Python type across devices: device type -> adapter
TORCH_DEVICE_ADAPTERS: dict[str, Adapter] = {}
_BY_TYPE: dict[type, Adapter] = {}


def register_adapter(name: str, probe: Probe, adapter: Adapter, *, first: bool = False) -> None:
    """Register ``adapter(obj, argname, write) -> Buf`` for objects where ``probe(obj)``.

    ``first=True`` puts it before the generic ones (device adapters do).
    A name registered twice raises ValueError.
    """
    if not callable(probe) or not callable(adapter):
        raise TypeError(f"register_adapter({name!r}): probe and adapter must be callable")
    if any(n == name for n, _, _ in _ADAPTERS):
        raise ValueError(f"an array adapter named {name!r} is already registered")
    entry = (name, probe, adapter)
    if first:
        _ADAPTERS.insert(0, entry)
    else:
        _ADAPTERS.append(entry)
    _BY_TYPE.clear()


def _lookup(obj: Any) -> Adapter | None:
    t = type(obj)
    hit = _BY_TYPE.get(t)
    if hit is not None:
        return hit
    for _name, probe, adapter in _ADAPTERS:
        try:
            ok = probe(obj)
        except Exception:
            ok = False
        if ok:
            _BY_TYPE[t] = adapter
            return adapter
    return None


_ndarray = np.ndarray


def _address(arr: Any) -> int:
    """The first byte of a Buf's array: NumPy's array interface, a device array's ``data.ptr`` (CuPy)."""
    if isinstance(arr, np.ndarray):
        return int(arr.__array_interface__["data"][0])
    return int(arr.data.ptr)


def overlaps(a: Any, b: Any) -> bool:
    """Whether two Buf arrays (C-contiguous, host or device) share any byte of memory."""
    if isinstance(a, np.ndarray) and isinstance(b, np.ndarray):
        return bool(np.may_share_memory(a, b))  # contiguous arrays: their byte ranges meet
    if not a.nbytes or not b.nbytes:
        return False
    pa, pb = _address(a), _address(b)
    return pa < pb + b.nbytes and pb < pa + a.nbytes


def is_slot(big: Any, small: Any, index: int) -> bool:
    """Whether ``small`` is exactly slot ``index`` of ``big`` (slots of ``small``'s size, the same dtype).

    The in-place forms torch allows: an all-gather's input that is this rank's
    slot of the output, a reduce-scatter's output that is this rank's chunk of
    the input. Host or device arrays (C-contiguous, as in a :class:`Buf`).
    """
    if not overlaps(big, small):
        return False
    return bool(_address(small) == _address(big) + index * small.nbytes and big.dtype == small.dtype)


def apart(inp: Buf, out: Buf, slot: tuple[bool, int] | None = None) -> Buf:
    """``inp``, or a copy of it where it shares memory with ``out``.

    MPI forbids aliased send and receive buffers (MPICH asserts and aborts, or
    reduces wrong data), NCCL's only aliased forms are the in-place ones, and a
    path that works in chunks would read input it has already written over.
    ``slot=(out_is_big, index)`` keeps the in-place form (:func:`is_slot`) as
    it is: the engines handle it. A device array is copied on its library's
    current stream: the caller orders that copy before the operation reads it.
    """
    if not overlaps(inp.arr, out.arr):
        return inp
    if slot is not None:
        big, small = (out.arr, inp.arr) if slot[0] else (inp.arr, out.arr)
        if is_slot(big, small, slot[1]):
            return inp
    return Buf(inp.arr.copy(), inp.obj, inp.dtype, inp.device, None, inp.index)


def adapt(obj: Any, argname: str, write: bool) -> Buf:
    """Adapt ``obj`` (argument ``argname``); ``write``: the call writes into it."""
    if type(obj) is _ndarray:  # the hot path: a contiguous NumPy array of a plain dtype
        flags = obj.flags
        if flags.c_contiguous and (flags.writeable or not write):
            info = dtype_info(obj.dtype)
            if info is not None:
                return Buf(obj, obj, info[2])
    adapter = _BY_TYPE.get(type(obj)) or _lookup(obj)
    if adapter is None:
        raise TypeError(
            f"{argname} must be an array (NumPy, torch tensor, CuPy, or any object with the buffer protocol, "
            f"__array_interface__, __cuda_array_interface__ or DLPack), got {type(obj).__name__}"
        )
    return adapter(obj, argname, write)


def adapt_list(objs: Any, argname: str, write: bool) -> list[Buf]:
    """Adapt every element of a list/tuple argument."""
    if not isinstance(objs, (list, tuple)):
        raise TypeError(f"{argname} must be a list of arrays, got {type(objs).__name__}")
    return [adapt(o, f"{argname}[{i}]", write) for i, o in enumerate(objs)]


# ---------------------------------------------------------------- NumPy (host)


_EXPECTED = f"expected {EXPECTED}"


def _check_dtype(arr: np.ndarray, argname: str) -> None:
    if not supported(arr.dtype):
        dt = arr.dtype
        hint = ""
        if dt.byteorder not in "=|" and supported(dt.newbyteorder("=")):
            hint = " (a byte-swapped dtype: pass arr.astype(arr.dtype.newbyteorder('=')))"
        raise TypeError(f"{argname} has dtype {dt}, which hpcdist cannot communicate; {_EXPECTED}{hint}")


def self_overlaps(shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> bool:
    """Whether two elements of an array of ``shape`` and byte ``strides`` share memory (a stride-0 axis from
    ``expand``/``broadcast_to``, or an ``as_strided`` view). Asked of strided outputs only (host and device): a
    quick test that passes any slice or transpose of an array; an exact one (element offsets, sorted) for the
    rest."""
    axes = sorted((abs(s), n) for s, n in zip(strides, shape, strict=True) if n > 1)
    span = itemsize  # bytes one block of the axes so far covers
    for stride, n in axes:
        if stride < span:
            if stride == 0:  # expand / broadcast_to: every element of the axis is one
                return True
            break
        span = stride * (n - 1) + span
    else:
        return False
    if 0 in shape:
        return False
    offsets = np.zeros((), dtype=np.int64)
    for stride, n in zip(strides, shape, strict=True):
        offsets = np.add.outer(offsets, np.arange(n, dtype=np.int64) * stride)
    ends = np.sort(offsets, axis=None)
    return bool((np.diff(ends) < itemsize).any())


def refuse_shared_elements(argname: str, shape: tuple[int, ...], strides: tuple[int, ...], itemsize: int) -> None:
    """ValueError, before any message, for an output whose elements share memory (:func:`self_overlaps`)."""
    if self_overlaps(shape, strides, itemsize):
        raise ValueError(
            f"{argname} has elements that share memory (strides {strides} for shape {shape}: an expanded or "
            "broadcast view, or an overlapping as_strided view), but this call writes its result into it; "
            "pass an array that owns its elements (tensor.clone(), arr.copy())"
        )


def _host_buf(arr: np.ndarray, obj: Any, argname: str, write: bool, dtype: str | None = None) -> Buf:
    if write and not arr.flags.writeable:
        raise ValueError(f"{argname} is read-only, but this call writes its result into it; pass a writable array")
    if arr.flags.c_contiguous:
        return Buf(arr, obj, dtype or arr.dtype.name)
    _check_dtype(arr, argname)
    tmp = np.ascontiguousarray(arr)
    if not write:
        return Buf(tmp, obj, dtype or arr.dtype.name)
    refuse_shared_elements(argname, arr.shape, arr.strides, arr.itemsize)

    def writeback(dst: np.ndarray = arr, src: np.ndarray = tmp) -> None:
        np.copyto(dst, src)

    return Buf(tmp, obj, dtype or arr.dtype.name, writeback=writeback)


def _numpy(obj: Any, argname: str, write: bool) -> Buf:
    if not supported(obj.dtype):
        _check_dtype(obj, argname)
    if type(obj) is _ndarray:  # the common case: no subclass checks
        return _host_buf(obj, obj, argname, write)
    ma = sys.modules.get("numpy.ma")
    if ma is not None and isinstance(obj, ma.MaskedArray):  # its mask would be ignored: masked values reduced too
        raise TypeError(
            f"{argname} is a NumPy masked array; hpcdist communicates data, not masks: pass arr.filled(value) or "
            "arr.data, and the mask separately"
        )
    # a subclass (np.matrix, np.memmap) as a plain view of its memory: the engines reshape, slice and
    # concatenate, which np.matrix answers in two dimensions (results were wrong or raised mid-call)
    return _host_buf(obj.view(_ndarray), obj, argname, write)


def _is_numpy(obj: Any) -> bool:
    return isinstance(obj, np.ndarray)


# ---------------------------------------------------------------- torch (CPU)


def is_torch(obj: Any) -> bool:
    """Whether ``obj`` is a torch tensor (without importing torch)."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


#: torch dtype -> the NumPy dtype name of its buffer, for dtypes hpcdist communicates (checked once)
_TORCH_DTYPE_NAMES: dict[Any, str] = {}

#: ``torch.Tensor`` once a tensor was adapted (None before: nothing here imports torch)
_TENSOR: list[Any] = [None]


def tensor_array(obj: Any) -> np.ndarray | None:
    """A NumPy view of ``obj``'s memory when it is a plain ``torch.Tensor`` that torch's ``.numpy()`` hands
    out (on the CPU, dense, not requiring grad, no lazy conjugate or negative bit, a dtype NumPy has), else None.

    For the lanes of :mod:`hpcdist.collectives`, which then check the view as a NumPy array; whatever is
    refused here takes the general path (the adapter), which accepts it or raises the argument error.
    Before any tensor was adapted it is None for every object (the adapter sets :data:`_TENSOR`).
    """
    if type(obj) is not _TENSOR[0]:
        return None
    try:
        return obj.numpy()  # type: ignore[no-any-return]
    except Exception:  # grad, sparse, conj/neg, another device, bfloat16: the adapter says what to do
        return None


def _torch(obj: Any, argname: str, write: bool) -> Buf:
    torch = sys.modules["torch"]  # imported: obj is a torch tensor
    _TENSOR[0] = torch.Tensor

    if not obj.is_cpu:  # (is_cpu: one attribute; device.type builds a string per call)
        device_adapter = TORCH_DEVICE_ADAPTERS.get(obj.device.type)
        if device_adapter is None:
            raise TypeError(_device_message(obj, argname))
        return device_adapter(obj, argname, write)
    t = obj.detach() if obj.requires_grad else obj  # .numpy() refuses only tensors that require grad
    if t.layout is not torch.strided:  # sparse layouts included
        raise TypeError(f"{argname} is a {t.layout} tensor; only dense (strided) tensors can be communicated")
    if t.is_conj() or t.is_neg():  # lazy views whose memory does not hold their values (torch refuses .numpy())
        kind, bit = ("conjugate", "conj") if t.is_conj() else ("negative", "neg")
        raise TypeError(
            f"{argname} is a lazy {kind} view (tensor.is_{bit}() is True): its memory does not hold its values; "
            f"pass tensor.resolve_{bit}() (a copy holding them)"
        )
    tdtype = t.dtype
    try:  # a view of the tensor's own memory, whatever its strides (torch's strides are never negative)
        contiguous = t.is_contiguous()
        arr = t.view(torch.int16).numpy().view(np.uint16) if tdtype is torch.bfloat16 else t.numpy()
    except TypeError:  # torch has no NumPy dtype for it: float8, complex32 (moved as bits), quantized, ...
        arr = _bits(t, tdtype, argname)
    except RuntimeError:  # a tensor whose memory torch does not hand out: nested, or a subclass such as DTensor
        raise TypeError(_opaque_message(t, argname)) from None
    dtype = _TORCH_DTYPE_NAMES.get(tdtype)
    if dtype is None:  # first tensor of this dtype: check it once (NumPy's dtype.name costs µs per call)
        if tdtype is torch.bfloat16:
            dtype = "bfloat16"
        elif (name := str(tdtype).removeprefix("torch.")) in BITS_ONLY:
            dtype = name  # its bits travel (torch_bits), its name stays
        else:
            _check_dtype(arr, argname)
            dtype = arr.dtype.name
        _TORCH_DTYPE_NAMES[tdtype] = dtype
    if contiguous:
        return Buf(arr, obj, dtype)
    # a strided view: MPI moves a contiguous copy, written back through NumPy (torch's copy_ refused inference
    # tensors outside inference mode, after the data had moved)
    return _host_buf(arr, obj, argname, write, dtype)


#: a tensor's element size -> the signed torch dtype its bits are viewed as (torch has no uint16-64 views on every
#: version) and the NumPy dtype they travel as
_BITS_VIEW = {1: ("int8", np.uint8), 2: ("int16", np.uint16), 4: ("int32", np.uint32), 8: ("int64", np.uint64)}


def torch_bits(t: Any) -> np.ndarray | None:
    """A NumPy view of the bits of a CPU tensor of a dtype NumPy lacks that hpcdist moves as bits
    (:data:`~hpcdist.ops.BITS_ONLY`: float8, float4_e2m1fn_x2, complex32), as unsigned integers of its element
    size (the tensor's strides kept); None for any other tensor."""
    view = _BITS_VIEW.get(t.element_size()) if str(t.dtype).removeprefix("torch.") in BITS_ONLY else None
    if view is None:
        return None
    torch = sys.modules["torch"]
    return t.view(getattr(torch, view[0])).numpy().view(view[1])  # type: ignore[no-any-return]


def _bits(t: Any, tdtype: Any, argname: str) -> np.ndarray:
    """:func:`torch_bits`, or TypeError naming ``argname`` for any other dtype NumPy lacks."""
    arr = torch_bits(t)
    if arr is None:
        raise TypeError(f"{argname} has dtype {tdtype}, which hpcdist cannot communicate; {_EXPECTED}") from None
    return arr


def _device_message(obj: Any, argname: str) -> str:
    """The error for a torch tensor on a device no adapter serves."""
    if obj.device.type == "meta":
        return f"{argname} is a torch tensor on the meta device: it has no data to communicate; pass a CPU tensor"
    return (
        f"{argname} is a torch tensor on {obj.device}; hpcdist moves CPU tensors and, with its GPU "
        "support (the 'gpu' extra: cupy), CUDA tensors; move it to the CPU or install cupy"
    )


def _opaque_message(t: Any, argname: str) -> str:
    """The error for a CPU tensor whose memory torch does not expose (``.numpy()`` raised RuntimeError)."""
    if t.is_nested:
        return f"{argname} is a nested tensor; communicate its components (tensor.unbind()) or a padded dense tensor"
    hint = "; pass its local shard (tensor.to_local())" if hasattr(t, "to_local") else "; pass a plain torch.Tensor"
    return (
        f"{argname} is a {type(t).__name__}, a tensor subclass whose memory torch does not expose to other "
        f"libraries{hint}"
    )


# ---------------------------------------------------------------- generic host protocols


def _has_array_interface(obj: Any) -> bool:
    return hasattr(obj, "__array_interface__")


def _array_interface(obj: Any, argname: str, write: bool) -> Buf:
    if write and isinstance(obj, np.generic):  # np.asarray copies a NumPy scalar: the result would be lost
        raise TypeError(
            f"{argname} is a NumPy scalar ({type(obj).__name__}), which cannot be written in place, but this call "
            "writes its result into it; pass an array (np.array(x))"
        )
    arr = np.asarray(obj)
    _check_dtype(arr, argname)
    return _host_buf(arr, obj, argname, write)


def _has_buffer(obj: Any) -> bool:
    try:
        memoryview(obj).release()
    except TypeError:
        return False
    return True


def _buffer(obj: Any, argname: str, write: bool) -> Buf:
    view = memoryview(obj)
    arr = np.asarray(view)
    if view.readonly:
        arr.flags.writeable = False
    _check_dtype(arr, argname)
    return _host_buf(arr, obj, argname, write)


def _has_dlpack(obj: Any) -> bool:
    return hasattr(obj, "__dlpack__") and hasattr(obj, "__dlpack_device__") and obj.__dlpack_device__()[0] == 1


def _dlpack(obj: Any, argname: str, write: bool) -> Buf:
    arr = np.from_dlpack(obj)
    _check_dtype(arr, argname)
    return _host_buf(arr, obj, argname, write)


register_adapter("numpy", _is_numpy, _numpy)
register_adapter("torch", is_torch, _torch)
register_adapter("dlpack-host", _has_dlpack, _dlpack)
register_adapter("array-interface", _has_array_interface, _array_interface)
register_adapter("buffer", _has_buffer, _buffer)
