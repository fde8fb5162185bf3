"""The watchdog of blocking MPI calls (``HPCDIST_WAIT=block``).

A blocking MPI call cannot be interrupted from Python. In ``block`` mode
hpcdist makes blocking operations call the blocking MPI routine (the fastest
path) and arms this watchdog around it: a daemon thread that, when a call
outlives its group's timeout, prints a :class:`~hpcdist.errors.DistTimeoutError`
message naming the operation and the group and ends the job with
``MPI_Abort`` — like NCCL's watchdog in torch. It never hangs forever, but
the error cannot be caught; ``HPCDIST_WAIT=poll`` raises it in the calling
thread instead (at some cost in speed). ``block`` is the default.

Each thread's call has its own deadline (docs/sharp-bits.md, "Threads"), and
a call that returns within a short grace period after its deadline is not
aborted.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

from .errors import timeout_message

_get_ident = threading.get_ident
_monotonic = time.monotonic

__all__ = ["Watchdog", "WATCHDOG"]


class Watchdog:
    """One daemon thread watching every blocking call in flight: one deadline per calling thread.

    A thread has at most one blocking MPI call in flight, so the slot of a
    call is its thread: ``arm`` returns the slot's entry and ``disarm``
    removes it. A call hung in one thread is aborted on time while other
    threads go on arming and disarming calls of their own.
    """

    def __init__(self, grace: float = 0.2) -> None:
        #: thread ident -> (monotonic deadline, limit in s, what is in flight)
        self.calls: dict[int, tuple[float, float, Any]] = {}
        self.grace = grace  # a call past its deadline is given this long to return before the job is ended
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def arm(self, limit: float, what: Any) -> None:
        if self._thread is None:
            self._start()
        self.calls[_get_ident()] = (_monotonic() + limit, limit, what)

    def disarm(self) -> None:
        self.calls.pop(_get_ident(), None)

    def call(self, limit: float, what: Any, fn: Any, args: tuple) -> None:
        """``fn(*args)`` armed for ``limit`` s (``arm``, call, ``disarm`` in one: the blocking hot path).

        Per call it stores one entry (a tuple) and removes it; nothing else is allocated.
        """
        if self._thread is None:
            self._start()
        ident = _get_ident()
        calls = self.calls
        calls[ident] = (_monotonic() + limit, limit, what)
        try:
            fn(*args)
        finally:
            del calls[ident]

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                t = threading.Thread(target=self._run, name="hpcdist-watchdog", daemon=True)
                t.start()
                self._thread = t

    def overdue(self, now: float) -> tuple[int, tuple[float, float, Any]] | None:
        """The first call in flight past its deadline at ``now``, as (thread ident, entry); else None."""
        for ident, entry in list(self.calls.items()):
            if now > entry[0]:
                return ident, entry
        return None

    def _run(self) -> None:
        while True:
            hit = self.overdue(_monotonic())
            if hit is not None:
                ident, entry = hit
                time.sleep(self.grace)  # a call that returns right at its deadline is not aborted
                if self.calls.get(ident) is entry:
                    self._fire(ident, entry)
                    return
                continue
            deadlines = [e[0] for e in list(self.calls.values())]
            left = min(deadlines) - _monotonic() if deadlines else 0.1
            time.sleep(min(0.1, max(0.005, left)))

    def _fire(self, ident: int, entry: tuple[float, float, Any]) -> None:
        _, limit, what = entry
        thread = next((t.name for t in threading.enumerate() if t.ident == ident), str(ident))
        then = (
            ". Ending the job (MPI_Abort) because a blocking MPI call cannot be interrupted (HPCDIST_WAIT=block); "
            "use HPCDIST_WAIT=poll to get a catchable exception."
        )
        message = timeout_message(what, limit, where=f" (in thread {thread!r})", then=then)
        abort_job(f"hpcdist.DistTimeoutError: {message}\n", 124)


def abort_job(text: str, code: int) -> None:
    """Print ``text`` to stderr and end the whole job with ``MPI_Abort(code)``.

    Flushes what the program printed first and gives the launcher a moment to
    forward the output. Aborts COMM_WORLD, or the world hpcdist joined over
    ports when this process was started without a launcher.
    """
    try:
        from .flight import on_abort

        on_abort(text)  # the flight recorder's dump (it names its file on stderr)
        sys.stdout.flush()
        sys.stderr.write(text)
        sys.stderr.flush()
        time.sleep(0.5)  # let the launcher forward the output before MPI_Abort tears the job down
    finally:
        from mpi4py import MPI

        from ._world import WORLD

        pg = WORLD.default_pg
        comm = pg._comm if pg is not None and MPI.COMM_WORLD.Get_size() == 1 else MPI.COMM_WORLD
        comm.Abort(code)


WATCHDOG = Watchdog()
