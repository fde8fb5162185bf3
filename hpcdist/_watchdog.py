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
        sys.stderr.write(
            f"hpcdist.DistTimeoutError: {desc} did not complete within {self.limit:g}s: a peer may have died, be "
            "stuck, or have called a different operation. Ending the job (MPI_Abort) because a blocking MPI call "
            "cannot be interrupted (HPCDIST_WAIT=block); use HPCDIST_WAIT=poll to get a catchable exception.\n"
        )
        sys.stderr.flush()
        time.sleep(0.5)  # let the launcher forward the message before MPI_Abort tears the job down
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(124)


WATCHDOG = Watchdog()
