"""One shared-memory segment of a node communicator, and its counter barrier.

Layout (one MPI-3 shared window, allocated by the node communicator's rank
0, mapped by every rank)::

    [ control: one 64-byte line per rank, holding that rank's step counter ]
    [ set 0: slot 0 | slot 1 | ... | slot n-1 ]   each slot ``slot_bytes``
    [ set 1: ... ]
    [ set 2: ... ]

**Synchronization.** Every rank owns one int64 counter, alone on its cache
line. :meth:`Segment.sync` is a barrier: the rank raises its counter to its
next step and waits until every other counter reached that step. All ranks
run the same sequence of syncs (the algorithms are deterministic functions of
the sizes, which agree on every rank), so equal step numbers mean the same
point of the program. Memory order: ``MPI_Win_sync`` (a full memory barrier
in MPICH and Open MPI) runs before the counter store (release: the data
written before it is visible first) and after the wait (acquire). The counter
itself is one aligned 8-byte store and load (``memoryview`` of format ``q``),
which x86-64 and AArch64 perform atomically, so a reader never sees a torn
value. Waits spin briefly, then yield the CPU (oversubscribed nodes), then
sleep 1 ms, and raise :class:`~hpcdist.errors.DistTimeoutError` after the
group's timeout; after that the segment is *broken* (its counters are out of
step) and every later use raises at once.

**Sets rotate by step.** The set an algorithm first writes in the interval
after sync step ``t`` is set ``t % 3``; an algorithm may touch it during that
interval and the two after it, never later. A rank can only be two intervals
ahead of the slowest (it cannot pass a sync the slowest has not reached), so
three sets make every reuse safe, within one operation (pipelined chunks) and
across consecutive operations, with no extra sync.
"""

from __future__ import annotations

import os
import time
from typing import Any

import numpy as np

from ...errors import DistTimeoutError
from ...work import timeout_error, wait_requests

__all__ = ["NSETS", "Segment"]

NSETS = 3
_LINE = 64  # bytes per rank counter: one cache line each (no false sharing)
_SPIN = 64  # polls before yielding the CPU
_YIELD_S = 10.0  # then yield this long, then sleep 1 ms per poll
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


class Segment:
    """A shared segment of ``3 x size`` slots of ``slot_bytes`` over the node communicator ``comm``.

    Collective over ``comm`` (every rank constructs it, then frees it with
    :meth:`free`). ``what``: the (operation, group) named by timeout errors.
    """

    def __init__(self, comm: Any, slot_bytes: int, timeout_s: float, what: Any) -> None:
        from mpi4py import MPI

        self.comm = comm
        self.size = n = comm.Get_size()
        self.rank = comm.Get_rank()
        self.slot_bytes = int(slot_bytes)
        self.timeout_s = timeout_s
        self.what = what
        self.broken = False
        ctrl = -(-_LINE * n // 4096) * 4096  # the data starts page-aligned
        self.set_bytes = n * self.slot_bytes
        total = ctrl + NSETS * self.set_bytes
        if not wait_requests([comm.Ibarrier()], timeout_s):  # a missing peer: timeout, not a hang in Allocate
            raise timeout_error(what, timeout_s)
        self.win: Any = MPI.Win.Allocate_shared(total if self.rank == 0 else 0, 1, comm=comm)
        mem: Any = self.win.Shared_query(0)[0]
        self.mem = np.frombuffer(mem, dtype=np.uint8, count=total)
        self._ctrl = memoryview(mem)[:ctrl].cast("q")
        self.data = self.mem[ctrl:]
        self._mine = self.rank * (_LINE // 8)
        self._others = [r * (_LINE // 8) for r in range(n) if r != self.rank]
        self.win.Lock_all(MPI.MODE_NOCHECK)
        if self.rank == 0:
            self.mem[:ctrl] = 0
        self.win.Sync()
        comm.Barrier()
        self.win.Sync()  # acquire: every rank sees the zeroed counters
        self.step = 0

    # -- layout ------------------------------------------------------------

    def set_of(self, step: int) -> int:
        """The set first written in the interval after sync ``step``."""
        return step % NSETS

    def slot(self, set_: int, rank: int, dtype: Any, count: int) -> np.ndarray:
        """``count`` items of ``dtype`` at the start of ``rank``'s slot in ``set_``."""
        off = set_ * self.set_bytes + rank * self.slot_bytes
        dt = np.dtype(dtype)
        return self.data[off : off + count * dt.itemsize].view(dt)

    def whole(self, set_: int, dtype: Any, count: int) -> np.ndarray:
        """``count`` items of ``dtype`` over the whole of set ``set_`` (all slots, for one writer)."""
        off = set_ * self.set_bytes
        dt = np.dtype(dtype)
        return self.data[off : off + count * dt.itemsize].view(dt)

    # -- synchronization ------------------------------------------------------

    def sync(self) -> None:
        """Barrier over the node communicator through the counters (see module docstring)."""
        if self.broken:
            raise DistTimeoutError(
                f"{_desc(self.what)}: this group's shared-memory segment is out of step since an earlier timeout; "
                "create a new group (or set HPCDIST_SHM=0)"
            )
        win = self.win
        win.Sync()  # release: the data this rank wrote is visible before its counter
        step = self.step + 1
        self.step = step
        ctrl = self._ctrl
        ctrl[self._mine] = step
        for pos in self._others:
            if ctrl[pos] < step:
                self._wait(pos, step)
        win.Sync()  # acquire: read the peers' data only after seeing their counters

    def _wait(self, pos: int, step: int) -> None:
        ctrl = self._ctrl
        n = 0
        start = time.monotonic()
        deadline = start + self.timeout_s
        while ctrl[pos] < step:
            n += 1
            if n < _SPIN:
                continue
            now = time.monotonic()
            if now >= deadline:
                if ctrl[pos] >= step:
                    return
                self.broken = True
                raise timeout_error(self.what, self.timeout_s)
            if now - start < _YIELD_S:
                _yield()
            else:
                time.sleep(0.001)

    def free(self) -> None:
        """Release the window (collective over the node communicator, unless broken: then only unmapped)."""
        win, self.win = self.win, None
        if win is None:
            return
        self._ctrl.release()
        self.mem = self.data = np.empty(0, np.uint8)
        if self.broken:  # a peer is out of step: MPI_Win_free would wait for it forever
            return
        try:
            win.Unlock_all()
            win.Free()
        except Exception:  # pragma: no cover - teardown must not raise
            pass


def _desc(what: Any) -> str:
    return what if isinstance(what, str) else f"{what[0]} on {what[1]!r}"
