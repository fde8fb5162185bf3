"""The watchdog of blocking MPI calls (``HPCDIST_WAIT=block``).

A blocking MPI call cannot be interrupted from Python. In ``block`` mode
hpcdist makes blocking operations call the blocking MPI routine (the fastest
path) and arms this watchdog around it: a daemon thread that, when a call
outlives its group's timeout, prints a :class:`~hpcdist.errors.DistTimeoutError`
message naming the operation and the group and ends the job with
``MPI_Abort`` — like NCCL's watchdog in torch. It never hangs forever, but
the error cannot be caught; ``HPCDIST_WAIT=poll`` raises it in the calling
thread instead (at some cost in speed). ``block`` is the default.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any

__all__ = ["Watchdog", "WATCHDOG"]


class Watchdog:
    """One daemon thread watching the one blocking call in flight."""

    def __init__(self) -> None:
        self.deadline = 0.0  # monotonic deadline of the call in flight; 0: none
        self.what: Any = None
        self.limit = 0.0
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def arm(self, limit: float, what: Any) -> None:
        if self._thread is None:
            self._start()
        self.what = what
        self.limit = limit
        self.deadline = time.monotonic() + limit

    def disarm(self) -> None:
        self.deadline = 0.0

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                t = threading.Thread(target=self._run, name="hpcdist-watchdog", daemon=True)
                t.start()
                self._thread = t

    def _run(self) -> None:
        while True:
            deadline = self.deadline
            if deadline and time.monotonic() > deadline and self.deadline == deadline:
                self._fire()
                return
            time.sleep(0.05 if not deadline else min(0.5, max(0.01, (deadline - time.monotonic()) / 2)))

    def _fire(self) -> None:
        what = self.what
        desc = what if isinstance(what, str) else f"{what[0]} on {what[1]!r}"
        abort_job(
            f"hpcdist.DistTimeoutError: {desc} did not complete within {self.limit:g}s: a peer may have died, be "
            "stuck, or have called a different operation. Ending the job (MPI_Abort) because a blocking MPI call "
            "cannot be interrupted (HPCDIST_WAIT=block); use HPCDIST_WAIT=poll to get a catchable exception.\n",
            124,
        )


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
