"""The progress thread: completes the futures of asynchronous torch Works.

MPI moves a non-blocking operation forward only while some thread is inside
an MPI call. A torch ``Work`` whose future was asked for (DDP's gradient
buckets, communication hooks) is handed to this one thread per process,
which tests its requests until they complete and then completes the
``torch.futures.Future``, running its callbacks. So gradient all-reduces
progress while the main thread computes the backward pass, and a C++ caller
blocked in ``future.wait()`` (DDP's ``finalize_backward``) is released.

Ordering: futures complete strictly in the order they were handed over
(head of the queue first), so callbacks run in the same order on every rank.
A collective issued inside a callback (PowerSGD issues them, then waits)
runs to completion on this thread. MPI needs every rank to issue a group's
collectives in one order: that holds when a callback's collectives come
after everything the program issued before its future completed, as with
one DDP bucket per step; a hook whose callbacks issue collectives while the
program still issues others (PowerSGD with several buckets) can interleave
them differently on different ranks, exactly as with torch's own MPI and
gloo backends (docs/torch.md). Works the main thread waits on itself (no
future asked for) never come here: the blocking path has no thread hop.

Polling: the head is tested in hpcdist's wait loop (spin, then yield the CPU
between tests: a large message needs many tests to move, so no sleeping while
work is pending); an empty queue sleeps on a condition.
The thread needs ``MPI_THREAD_MULTIPLE``; with a lower thread level
:func:`available` is False and futures complete on the thread that asks for
them (no overlap, still correct).
"""

from __future__ import annotations

import collections
import threading
from typing import Any

__all__ = ["PROGRESS", "Progress", "available", "on_progress_thread"]

_THREAD_OK: list[bool] = []


def available() -> bool:
    """Whether MPI runs at ``MPI_THREAD_MULTIPLE`` (a second thread may call MPI)."""
    if not _THREAD_OK:
        from mpi4py import MPI

        _THREAD_OK.append(MPI.Query_thread() == MPI.THREAD_MULTIPLE)
    return _THREAD_OK[0]


class Progress:
    """One daemon thread completing handed-over works in hand-over order."""

    def __init__(self) -> None:
        self._cv = threading.Condition()
        self._queue: collections.deque[Any] = collections.deque()
        self._thread: threading.Thread | None = None
        self.ident = -1  # the thread's id once started (compared on every backend call)

    def submit(self, work: Any) -> None:
        """Hand ``work`` over (it has ``_complete_here()`` and ``_settle()``)."""
        with self._cv:
            self._queue.append(work)
            if self._thread is None:
                t = threading.Thread(target=self._run, name="hpcdist-torch-progress", daemon=True)
                self._thread = t
                t.start()
                self.ident = t.ident or -1
            self._cv.notify()

    def pending(self) -> int:
        with self._cv:
            return len(self._queue)

    def _run(self) -> None:
        self.ident = threading.get_ident()
        cv, queue = self._cv, self._queue
        while True:
            with cv:
                while not queue:
                    cv.wait()
                work = queue[0]
            work._complete_here()  # tests its requests until done or timed out (hpcdist's wait loop)
            with cv:
                queue.popleft()
            try:
                work._settle()
            except BaseException:  # pragma: no cover - a callback's error lands in its future
                pass


PROGRESS = Progress()


def on_progress_thread() -> bool:
    """True inside the progress thread (a future's callback)."""
    return threading.get_ident() == PROGRESS.ident
