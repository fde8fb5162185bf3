"""A :class:`~hpcdist.work.Work` backed by a CUDA event (NCCL operations).

torch's stream semantics: the operation was enqueued on the current stream
when it was called; the event was recorded after it. ``wait()`` makes the
*current* stream (at the time of the call) wait on the event and returns
without blocking the host; ``is_completed()`` queries the event;
``synchronize()`` blocks the host until the event completed, raising
:class:`~hpcdist.errors.DistTimeoutError` after the timeout. Its future is
completed at once, as torch's NCCL futures are (a CUDA future: ``wait()``
and ``then()`` order the current stream after the operation).

A Work dropped before its operation is known to be complete hands its
arrays to :data:`_DROPPED` (as torch's ProcessGroupNCCL stashes a Work's
tensors): the memory of an array freed on the host goes back to its pool at
once, and the pool may give it to a new array on another stream while the
queued operation still writes it. :func:`release_dropped` lets go of them
oldest first once their events completed; the engine calls it on the calling
thread with each operation it enqueues outside a graph capture, and when it
closes. Nothing is kept for an operation captured in a CUDA graph (it runs at
each replay; its event must not be queried).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from ...errors import TIMEOUT_FIX, DistTimeoutError, timeout_message
from ...gpu.streams import require_cupy
from ...work import Future, Work, _as_list, _wait_limit, hold, unhold

__all__ = ["CudaEventWork", "release_dropped"]

# (event, arrays kept, result) of dropped Works whose operation may still run on the GPU, oldest first
_DROPPED: deque[tuple[Any, Any, Any]] = deque()


_RELEASING = threading.Lock()


def release_dropped() -> None:
    """Let go of the arrays of dropped Works whose operations completed, oldest first (on the calling thread).

    Returns at once while another thread does it (only the one that asked an entry's event may remove it)."""
    if not _RELEASING.acquire(False):
        return
    try:
        while _DROPPED:
            try:
                done = _DROPPED[0][0].done
            except Exception:  # the event cannot be asked (a CUDA error): keep the arrays, as for one still running
                return
            if not done:
                return
            _DROPPED.popleft()
    finally:
        _RELEASING.release()


class CudaEventWork(Work):
    """The Work of one enqueued NCCL operation (see module docstring)."""

    __slots__ = ("_captured", "_event", "_index", "_torch")

    def __init__(
        self,
        event: Any,
        keep: Any,
        timeout_s: float,
        name: Any,
        result: Any,
        index: int,
        torch_stream: bool,
        source: int = -1,
        captured: bool = False,
    ) -> None:
        super().__init__((), None, keep, timeout_s, name, result)
        self._event = event
        self._index = index
        self._torch = torch_stream
        self._source = source
        self._captured = captured
        hold(self, event)  # CuPy's Event.__del__ destroys the event: never in this Work's garbage (see hold)

    def __del__(self) -> None:
        # _keep is cleared once the event was seen complete; until then the GPU may still use the arrays
        try:
            event = unhold(self, self._event)
            if self._keep is not None and not self._captured:
                _DROPPED.append((event, self._keep, self._result))
        except Exception:  # pragma: no cover - at interpreter shutdown, when the module is gone already
            pass

    @classmethod
    def combine(cls, works: Sequence[Work], name: Any, timeout_s: float, result: Any = None) -> Work:
        """NCCL parts enqueued on one stream (all torch's or all CuPy's): the last part's event covers them all.

        Its result is the list of the parts' results, as for every combined
        Work; parts of both libraries' streams combine as any Works do.
        """
        parts = [w for w in works if isinstance(w, CudaEventWork)]
        if len(parts) != len(works) or len({p._torch for p in parts}) != 1:
            merged = Work._merged(works, name, timeout_s, _MergedWithDevice, result)
            merged._device_parts = parts  # type: ignore[attr-defined]  # a _MergedWithDevice
            return merged
        last = parts[-1]
        captured = any(p._captured for p in parts)
        results = [p._result for p in parts] if result is None else result
        return type(last)(last._event, parts, timeout_s, name, results, last._index, last._torch, -1, captured)

    def _current_stream(self) -> Any:
        cupy = require_cupy()
        if self._torch:
            import torch

            return cupy.cuda.ExternalStream(torch.cuda.current_stream(self._index).cuda_stream, self._index)
        return cupy.cuda.get_current_stream()

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Make the current stream wait for the operation; True. Does not block the host.

        ``timeout`` is checked as :meth:`Work.wait` checks it (TypeError or
        ValueError before anything happens) and otherwise unused: nothing
        waits on the host (torch's NCCL ``Work.wait`` hands it to its watchdog).
        """
        if timeout is not None:
            _wait_limit(timeout, self._timeout_s)
        if self._exc is not None:
            raise self._exc
        self._current_stream().wait_event(self._event)
        if not self._done:
            self._done = True
            fut = self._future
            if fut is not None:
                fut._set(_as_list(self._result), None)  # a list of the outputs, as for every Work
        return True

    def block_current_stream(self) -> None:
        self.wait()

    def synchronize(self, timeout: timedelta | float | None = None) -> None:
        """Block the host until the operation completed on the GPU."""
        limit = self._timeout_s if timeout is None else _wait_limit(timeout, self._timeout_s)
        deadline = time.monotonic() + limit
        delay = 0.00002
        while not self._event.done:
            if time.monotonic() >= deadline:
                exc = DistTimeoutError(
                    timeout_message(self._name, limit, where=" (NCCL)", on=" on the GPU", then="; " + TIMEOUT_FIX)
                )
                self._exc = exc
                raise exc
            time.sleep(delay)
            delay = min(delay * 2, 0.002)
        self._keep = None
        self.wait()

    def is_completed(self) -> bool:
        if self._exc is not None:
            return True
        if self._event.done:
            self._keep = None
            if not self._done:
                self.wait()
            return True
        return False

    def _finish(self) -> None:  # Work.combine() finishes its parts this way
        self.wait()

    def get_future(self) -> Future:
        """A future completed at once with the outputs, as torch's NCCL futures: its ``wait()`` and ``then()``
        make the current stream wait for the operation (``value()`` does not)."""
        if self._future is None:
            fut = self._future = _CudaFuture(self)
            if self._exc is not None:
                fut._set(None, self._exc)
            else:
                fut._set(_as_list(self._result), None)
        return self._future

    def __repr__(self) -> str:
        state = "completed" if self._event.done else "enqueued"
        return f"<hpcdist.Work {self._name} (NCCL) {state}>"


class _CudaFuture(Future):
    """The future of an NCCL Work: complete at enqueue; waiting (or chaining) orders the current stream after it."""

    __slots__ = ()

    def wait(self) -> Any:
        if self._work is not None and self._exc is None:
            self._work.wait()  # the current stream waits for the event; the host does not block
        return super().wait()

    def then(self, callback: Callable[[Future], Any]) -> Future:
        if self._work is not None and self._exc is None:
            self._work.wait()  # the callback's GPU work is ordered after the operation
        return super().then(callback)


class _MergedWithDevice(Work):
    """A combined Work with NCCL parts among others (host parts, or parts on both libraries' streams): it is
    complete when its requests and its parts' events are; ``synchronize()`` blocks the host for all of them."""

    __slots__ = ("_device_parts",)
    _device_parts: list[CudaEventWork]

    def is_completed(self) -> bool:
        pending = self._exc is None and not self._done
        if pending and not all(p._exc is not None or p._event.done for p in self._device_parts):
            return False
        return super().is_completed()

    def synchronize(self, timeout: timedelta | float | None = None) -> None:  # type: ignore[override]
        for p in self._device_parts:
            p.synchronize(timeout)
        self.wait(timeout)
