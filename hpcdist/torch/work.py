"""The torch ``Work`` the backend returns: one hpcdist :class:`~hpcdist.work.Work` behind it.

``wait(timeout)`` tests the MPI requests on the calling thread until they
complete (no thread hop), or, once a future was asked for, waits for the
progress thread that owns them. ``get_future()`` gives a
``torch.futures.Future`` completed with the list of output tensors when the
MPI requests complete (DDP's communication hooks chain on it). An error of
the operation (a failed MPI call, a timeout) is raised by ``wait()``, set on
the future and kept for ``exception()``.

Exactly one thread tests a Work's requests: the waiter (under the Work's
lock) until ``get_future()`` hands it to the progress thread, then only that
thread.
"""

from __future__ import annotations

import threading
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from ..errors import DistError
from ..work import timeout_error
from . import progress

__all__ = ["HpcdistWork", "done_work", "finish_quietly"]


def _limit(timeout: Any, default_s: float) -> float:
    """Seconds to wait: ``timeout`` (timedelta or seconds), or the group's when absent/zero."""
    if timeout is None:
        return default_s
    secs = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    return default_s if secs <= 0 else secs


_work_init = dist._Work.__init__


class HpcdistWork(dist._Work):
    """torch ``Work`` over an hpcdist Work (None: already complete).

    ``result``: the list of output tensors (the future's value).
    """

    # Class-level defaults: a completed Work (the blocking path, once per call) sets two attributes only.
    _hw: Any = None
    _timeout_s = 0.0
    _done = True
    _exc: BaseException | None = None
    _fut: Any = None
    _owned: threading.Event | None = None  # set once the progress thread completed it
    _src_map: Any = None  # global rank -> group rank, for recv's source
    _lock: Any = None
    _then: list[Any] | None = None  # a barrier's: the group's earlier collectives, waited for after it

    def __init__(self, hwork: Any, result: list[Any], name: str, timeout_s: float, src_map: Any = None) -> None:
        _work_init(self)
        self._result = result
        self._name = name
        if hwork is not None:
            self._hw = hwork
            self._timeout_s = timeout_s
            self._done = False
            self._src_map = src_map
        self._lock = threading.Lock()

    # -- completion (one thread at a time) ------------------------------------------

    def _test(self) -> bool:
        """Test the requests once; True when complete (successfully or not)."""
        if self._done:
            return True
        with self._lock:
            return self._test_locked()

    def _test_locked(self) -> bool:
        if self._done:
            return True
        hw = self._hw
        try:
            ready = hw.is_completed()
        except BaseException as exc:  # an MPI error from MPI_Test
            self._exc, ready = exc, True
        if ready:
            if self._exc is None:
                self._exc = hw.exception()
            self._keep_source(hw)
            self._done = True
        return ready

    def _keep_source(self, hw: Any) -> None:
        if self._src_map is None:
            return
        try:
            src = hw.source_rank()  # defined once a receive completed
        except DistError:
            return
        self._source = self._src_map.get(src, src)

    def _complete_here(self) -> None:
        """On the progress thread: wait for the requests (or the timeout), keeping any error."""
        with self._lock:
            if not self._done:
                self._wait_locked(self._timeout_s)

    def _settle(self) -> None:
        """After completion on the progress thread: release waiters, complete the future (callbacks run)."""
        assert self._owned is not None
        self._owned.set()
        _complete(self._fut, self._result, self._exc)

    # -- torch's Work API -----------------------------------------------------------

    def wait(self, timeout: Any = None) -> bool:
        """Block until the operation completed; raise its error (DistTimeoutError after ``timeout``)."""
        if not self._done:
            limit = _limit(timeout, self._timeout_s)
            owned = self._owned
            if owned is not None:
                if not owned.wait(limit):  # the progress thread still owns the operation and bounds it by the
                    # group's timeout itself: nothing is left in flight by this caller (no poisoned exit)
                    raise timeout_error(self._name, limit, cancelled=True)
            else:
                with self._lock:
                    if not self._done:
                        self._wait_locked(limit)
        if self._exc is not None:
            raise self._exc
        if self._then is not None:
            earlier, self._then = self._then, None
            finish_quietly(earlier)
        return True

    def _wait_locked(self, limit: float) -> None:
        hw = self._hw
        try:
            hw.wait(limit)
        except BaseException as exc:
            self._exc = exc
        self._keep_source(hw)
        self._done = True

    def synchronize(self) -> None:
        self.wait()

    def block_current_stream(self) -> None:
        self.wait()

    def is_completed(self) -> bool:
        if not self._done:
            if self._owned is not None:
                if not self._owned.is_set():
                    return False
            elif not self._test():
                return False
        then = self._then
        if then is not None:  # a barrier: complete once the earlier collectives are too
            if not all(w.is_completed() for w in then):
                return False
            self._then = None
        return True

    def is_success(self) -> bool:
        if not self.is_completed():
            raise DistError(f"is_success() called on {self._name}, which has not completed; call wait() first")
        return self._exc is None

    def exception(self) -> Any:
        return self._exc

    def result(self) -> list[Any]:
        self.wait()
        return self._result

    def source_rank(self) -> int:
        """The group rank a receive from any source got its message from."""
        self.wait()
        src = getattr(self, "_source", -1)
        if src < 0:
            raise DistError("source_rank() is only defined for completed receives")
        return int(src)

    def _source_rank(self) -> int:
        return self.source_rank()

    def get_future(self) -> Any:
        """A ``torch.futures.Future`` completed with the output tensors when the operation completes."""
        settle_now = False
        with self._lock:
            if self._fut is None:
                self._fut = _new_future(self._result)
                if self._done:
                    settle_now = True
                elif progress.available() and not progress.on_progress_thread():
                    self._owned = threading.Event()
                    progress.PROGRESS.submit(self)
                else:  # no thread may call MPI beside this one: complete it here
                    self._wait_locked(self._timeout_s)
                    settle_now = True
        if settle_now:
            _complete(self._fut, self._result, self._exc)
        return self._fut

    def __repr__(self) -> str:
        return f"<hpcdist.torch.Work {self._name} {'completed' if self._done else 'pending'}>"


def _new_future(result: list[Any]) -> Any:
    devices: list[Any] = sorted(
        {str(t.device) for t in result if isinstance(t, torch.Tensor) and t.device.type == "cuda"}
    )
    return torch.futures.Future(devices=devices) if devices else torch.futures.Future()


def _complete(fut: Any, result: list[Any], exc: BaseException | None) -> None:
    if fut is None or fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


def done_work(result: list[Any], name: str) -> HpcdistWork:
    """A Work that is already complete (the blocking path ran the operation to the end)."""
    return HpcdistWork(None, result, name, 0.0)


def finish_quietly(works: list[HpcdistWork]) -> None:
    """Wait for ``works``, collectives started before a barrier that completed (every rank started them, so they
    complete promptly); an error stays with its Work, for its own ``wait()``."""
    for w in works:
        try:
            w.wait()
        except Exception:  # kept by the Work: raised by its own wait()
            pass
