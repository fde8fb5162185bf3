"""The watchdog of NCCL work, as torch's ProcessGroupNCCL has one.

An NCCL operation runs on the GPU after the call returned. When a peer never
comes, its kernel spins and whoever synchronizes next (``x.get()``,
``t.cpu()``, a later collective) hangs. So the NCCL engine notes each
operation here: a CUDA event recorded behind it on its stream, with the time
it was enqueued. Operations enqueued on one stream within ``bucket_s`` of the
first share one event, re-recorded behind the newest, which keeps the cost
per call near a microsecond and the queue short. A daemon thread looks, every
``poll_s`` seconds, at

* the oldest unfinished event of each stream: older than its group's timeout,
  it is reported as a :class:`~hpcdist.errors.DistTimeoutError` naming the
  operation and the group;
* ``ncclCommGetAsyncError`` of each engine with a communicator: an error is
  reported as a :class:`~hpcdist.errors.DistBackendError`;

and on a report aborts the NCCL communicators and ends the job with
``MPI_Abort`` (torch's default, ``TORCH_NCCL_ASYNC_ERROR_HANDLING=3``). The
error cannot be caught; ``HPCDIST_NCCL_WATCHDOG=0`` turns the watchdog off.

A host blocked in a CUDA call that holds the GIL (CuPy's ``x.get()`` does)
stops every Python thread, this one too. So the thread also keeps a guard
process informed of the deadline of the oldest pending operation; when that
deadline passes (plus a grace period) without word from the thread, the
guard prints the report and ends this process (SIGTERM, then SIGKILL), and
the launcher ends the job. The guard exits when this process does.

CUDA graphs: an operation enqueued while its stream captures runs at each
replay, so it is not noted. The thread's own event queries must not disturb a
capture that another thread runs in CUDA's default global mode (where any
thread's "unsafe" call invalidates it): the thread switches itself to
thread-local capture mode when it starts (``on_start``), as other libraries'
watchdog threads do. Should a look fail all the same (a CUDA error), the
thread says so once on stderr, disarms and closes its guard, and stops:
hangs on the GPU are then no longer caught, but nothing ends the job falsely.

Events, streams and engines are duck-typed (``record(stream)``/``done``;
``ptr``; ``async_error()``/``abort_nccl()``), so the bookkeeping is tested on
the CPU with plain objects.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any

from ...errors import timeout_message
from ...gpu.streams import thread_local_capture_mode

__all__ = ["Guard", "NcclWatchdog", "nccl_watchdog"]

_FREE_MAX = 64  # completed events kept for reuse


_GUARD = r"""
import json, os, select, signal, sys, time
parent, fd = int(sys.argv[1]), sys.stdin.fileno()
deadline, report, buf = None, "", b""
while True:
    wait = None if deadline is None else max(0.0, deadline - time.monotonic())
    if select.select([fd], [], [], wait)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            sys.exit(0)
        *lines, buf = (buf + chunk).split(b"\n")
        for line in lines:
            msg = json.loads(line)
            deadline, report = msg.get("deadline"), msg.get("report", "")
    elif deadline is not None and time.monotonic() >= deadline:
        sys.stderr.write(report)
        sys.stderr.flush()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            try:
                os.kill(parent, sig)
            except OSError:
                sys.exit(0)
            time.sleep(3.0)
        sys.exit(0)
"""


class Guard:
    """A small process that ends ``pid`` when a deadline it was given passes (see the module docstring)."""

    def __init__(self, pid: int | None = None, stderr: Any = None) -> None:
        self._proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _GUARD, str(os.getpid() if pid is None else pid)],
            stdin=subprocess.PIPE,
            stderr=stderr,
            text=True,
            close_fds=True,
        )
        self._sent: Any = None

    def arm(self, deadline: float | None, report: str = "") -> None:
        """End the process at monotonic time ``deadline`` with ``report`` on stderr; None disarms."""
        if deadline == self._sent:
            return
        stdin = self._proc.stdin
        assert stdin is not None
        try:
            stdin.write(json.dumps({"deadline": deadline, "report": report}) + "\n")
            stdin.flush()
        except (BrokenPipeError, ValueError):  # the guard is gone: the in-process watchdog still works
            return
        self._sent = deadline

    def close(self) -> None:
        if self._proc.stdin is not None:
            try:
                self._proc.stdin.close()
            except OSError:
                pass
        try:
            self._proc.wait(timeout=10.0)  # it exits at the end of its input (or ends its target within 3 s)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


def _timeout_report(what: Any, limit: float, how: str = "the job (MPI_Abort)") -> str:
    then = (
        f". Ending {how}, as torch's NCCL watchdog does; raise the timeout with "
        "init_process_group(timeout=...) if it is just slow, or set HPCDIST_NCCL_WATCHDOG=0."
    )
    return f"hpcdist.DistTimeoutError: {timeout_message(what, limit, where=' (NCCL)', on=' on the GPU', then=then)}\n"


class NcclWatchdog:
    """Pending NCCL work per stream, and the thread that ends the job when it is stuck."""

    def __init__(
        self,
        new_event: Callable[[], Any],
        clock: Callable[[], float] = time.monotonic,
        poll_s: float = 0.1,
        bucket_s: float = 0.001,
        on_start: Callable[[], Any] | None = None,
    ) -> None:
        self._new_event = new_event
        self._on_start = on_start
        self._clock = clock
        self.poll_s = poll_s
        self.bucket_s = bucket_s
        # stream key -> deque of [event, first enqueue time, what, limit]
        self._streams: dict[int, deque[list[Any]]] = {}
        self._engines: dict[int, Any] = {}
        self._free: list[Any] = []
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.oldest: tuple[float, Any, float] | None = None  # (deadline, what, limit) of the oldest pending work
        self.guard_grace_s = 2.0
        self.stopped: BaseException | None = None  # why the thread stopped watching, if it did

    def note(self, stream: Any, what: Any, limit: float, engine: Any) -> None:
        """An operation ``what`` (a str or ``(opname, group)``) was just enqueued on ``stream``."""
        now = self._clock()
        key = int(stream.ptr)
        with self._lock:
            q = self._streams.get(key)
            if q is None:
                q = self._streams[key] = deque()
            last = q[-1] if q else None
            if last is not None and now - last[1] < self.bucket_s and last[3] == limit:
                last[0].record(stream)  # the event now also covers this operation
            else:
                ev = self._free.pop() if self._free else self._new_event()
                ev.record(stream)
                q.append([ev, now, what, limit])
            self._engines[id(engine)] = engine
        if self._thread is None:
            self._start()

    def forget(self, engine: Any) -> None:
        """``engine`` is closing: stop asking its communicator for errors (returns once no question is under way)."""
        with self._lock:
            self._engines.pop(id(engine), None)

    def pending(self) -> int:
        with self._lock:
            return sum(len(q) for q in self._streams.values())

    def check(self) -> str | None:
        """One look: the report of stuck or failed work, or None (completed events are recycled)."""
        now = self._clock()
        with self._lock:
            queues = list(self._streams.values())
            engines = list(self._engines.values())
        oldest: tuple[float, Any, float] | None = None
        for q in queues:
            while True:
                with self._lock:
                    if not q:
                        break
                    ev, first, what, limit = q[0]
                    if ev.done:
                        q.popleft()
                        if len(self._free) < _FREE_MAX:
                            self._free.append(ev)
                        continue
                if now - first > limit:
                    return _timeout_report(what, limit)
                if oldest is None or first + limit < oldest[0]:
                    oldest = (first + limit, what, limit)
                break
        self.oldest = oldest
        for engine in engines:
            with self._lock:  # forget() (an engine closing) waits for this: never ask a destroyed communicator
                err = engine.async_error() if id(engine) in self._engines else None
            if err is not None:
                return f"hpcdist.DistBackendError: {err}. Ending the job (MPI_Abort).\n"
        return None

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                t = threading.Thread(target=self._run, name="hpcdist-nccl-watchdog", daemon=True)
                t.start()
                self._thread = t

    def _run(self) -> None:
        if self._on_start is not None:
            self._on_start()
        try:
            guard: Guard | None = self._new_guard()
        except OSError:  # no guard: a host blocked in CUDA with the GIL held is then not caught
            guard = None
        while True:
            time.sleep(self.poll_s)
            try:
                report = self.check()
            except Exception as exc:  # a look failed: stop watching rather than end the job on a stale deadline
                self._stop(guard, exc)
                return
            if report is not None:
                self._fire(report)
                return
            if guard is not None:
                oldest = self.oldest
                if oldest is None:
                    guard.arm(None)
                else:
                    how = "this process (the host is blocked in a CUDA call)"
                    guard.arm(oldest[0] + self.guard_grace_s, _timeout_report(oldest[1], oldest[2], how))

    def _new_guard(self) -> Guard:
        return Guard()

    def _stop(self, guard: Guard | None, exc: BaseException) -> None:
        self.stopped = exc
        sys.stderr.write(
            f"hpcdist: the NCCL watchdog stopped: a look at the pending NCCL work failed ({type(exc).__name__}: "
            f"{exc}); NCCL operations that never complete are no longer caught in this process\n"
        )
        sys.stderr.flush()
        if guard is not None:
            guard.arm(None)
            guard.close()

    def _fire(self, report: str) -> None:
        from ..._watchdog import abort_job

        with self._lock:
            engines = list(self._engines.values())
        for engine in engines:  # free the GPU of spinning NCCL kernels before the job ends
            try:
                engine.abort_nccl()
            except Exception:  # pragma: no cover - the job ends below regardless
                pass
        abort_job(report, 124 if "DistTimeoutError" in report else 1)


_WATCHDOG: list[NcclWatchdog] = []


def nccl_watchdog() -> NcclWatchdog:
    """The process's NCCL watchdog (created on first use; its thread starts with the first operation)."""
    if not _WATCHDOG:

        def new_event() -> Any:
            import cupy

            return cupy.cuda.Event(block=False, disable_timing=True)

        _WATCHDOG.append(NcclWatchdog(new_event, on_start=thread_local_capture_mode))
    return _WATCHDOG[0]
