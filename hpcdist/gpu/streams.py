"""CuPy on demand, the stream a device array belongs to, and the device checks.

Stream rule (as torch's): an operation on a device array is ordered on the
*current stream of the library that owns the array* — torch's current stream
for torch tensors, CuPy's for everything else. The MPI paths synchronize that
stream before MPI reads or writes the memory; the NCCL path enqueues on it.
"""

from __future__ import annotations

import sys
from collections.abc import Iterable
from typing import Any

from ..buffers.adapters import Buf, is_torch
from .device import bound_device_index

__all__ = ["check_devices", "require_cupy", "stream_for", "streams_of", "synchronize", "thread_local_capture_mode"]

_CAPTURE_MODE_THREAD_LOCAL = 1  # CUstreamCaptureMode: GLOBAL 0, THREAD_LOCAL 1, RELAXED 2


def require_cupy(what: str = "device arrays") -> Any:
    """``import cupy`` or a TypeError saying what needs it and how to install it."""
    try:
        import cupy
    except ImportError as exc:
        raise TypeError(
            f"{what} need CuPy, which hpcdist uses to handle GPU memory, but it cannot be imported ({exc}); "
            "install it with pip install 'hpcdist[gpu]' (cupy-cuda12x) or the cupy build matching your CUDA"
        ) from None
    return cupy


def stream_for(buf: Buf) -> Any:
    """The CuPy stream object of the current stream that owns ``buf``'s work."""
    cupy = require_cupy()
    if is_torch(buf.obj):
        torch = sys.modules["torch"]
        ptr = torch.cuda.current_stream(buf.index).cuda_stream
        return cupy.cuda.ExternalStream(ptr, buf.index)
    return cupy.cuda.get_current_stream()


def capturing(stream: Any) -> bool:
    """Whether ``stream`` is capturing a CUDA graph (what is enqueued now runs at each replay, not now).

    A stream that cannot tell (the legacy stream while another stream captures) counts as capturing."""
    try:
        return bool(stream.is_capturing())
    except AttributeError:  # a CuPy without graph capture
        return False
    except Exception:
        return True


def thread_local_capture_mode() -> bool:
    """Put the calling thread in CUDA's thread-local stream-capture mode; whether it worked.

    In the default global mode, a potentially unsafe CUDA call (an event
    query, say) made by *any* thread while another thread captures a graph in
    global mode (``torch.cuda.graph``'s default) invalidates that capture. A
    thread in thread-local mode is held to that only for its own captures, so
    a background thread that queries events (the NCCL watchdog) calls this
    once when it starts. The mode is the CUDA driver's, per thread, whichever
    runtime (CuPy's, torch's) makes the calls.
    """
    import ctypes

    try:
        driver = ctypes.CDLL("libcuda.so.1")
        mode = ctypes.c_int(_CAPTURE_MODE_THREAD_LOCAL)
        return int(driver.cuThreadExchangeStreamCaptureMode(ctypes.byref(mode))) == 0
    except (OSError, AttributeError):  # no driver library, or one older than CUDA 10.1
        return False


def streams_of(bufs: Iterable[Buf]) -> list[Any]:
    """The distinct streams of ``bufs`` (by pointer), in first-seen order."""
    seen: dict[int, Any] = {}
    for b in bufs:
        s = stream_for(b)
        seen.setdefault(int(s.ptr), s)
    return list(seen.values())


def synchronize(streams: Iterable[Any]) -> None:
    for s in streams:
        s.synchronize()


def check_devices(bufs: Iterable[Buf], pg: Any, what: str) -> int:
    """All of ``bufs`` on the current CUDA device (and the group's bound device); return it.

    Raises ValueError naming the array, its device and the current one, with
    the fix, before anything moves.
    """
    cupy = require_cupy()
    current = int(cupy.cuda.runtime.getDevice())
    bound = bound_device_index(getattr(pg, "bound_device_id", None))
    if bound is not None and bound != current:
        raise ValueError(
            f"{what}: group {pg.group_name!r} is bound to cuda:{bound} (init_process_group(device_id=...)) but the "
            f"current CUDA device is cuda:{current}; call torch.cuda.set_device({bound}) or "
            f"cupy.cuda.Device({bound}).use() first"
        )
    for b in bufs:
        if b.device != "cuda":
            raise ValueError(f"{what}: a {b.device} array was mixed with CUDA arrays; put all arrays on one device")
        if b.index != current:
            raise ValueError(
                f"{what}: {type(b.obj).__name__} on cuda:{b.index}, but this rank's current CUDA device is "
                f"cuda:{current}; make its device current first (torch.cuda.set_device({b.index}), "
                f"cupy.cuda.Device({b.index}).use(), or hpcdist.gpu.set_device_for_local_rank())"
            )
    return current
