"""Timing shared by the benchmark scripts of this folder (imported as ``_timing`` from their directory).

Every script times a call the same way: all ranks start together (a
barrier), each runs the call ``iters`` times, and a measurement is the
slowest rank's time per call; with ``rounds`` the best round of each rank
is kept first, which takes most of the noise of a shared machine out.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any


def per_call(fn: Callable[[], object], iters: int, comm: Any, rounds: int = 1) -> float:
    """Seconds per call of ``fn``: each rank's best of ``rounds`` rounds of ``iters`` calls, the slowest rank's."""
    from mpi4py import MPI

    best = float("inf")
    for _ in range(rounds):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        best = min(best, (time.perf_counter() - t0) / iters)
    return float(comm.allreduce(best, op=MPI.MAX))


def iterations(nbytes: int, small: int) -> int:
    """Calls per measurement for a message of ``nbytes``: ``small`` up to 64 KiB, fewer for larger ones."""
    if nbytes <= 64 << 10:
        return small
    if nbytes <= 1 << 20:
        return max(3, small // 10)
    if nbytes <= 8 << 20:
        return max(3, small // 60)
    return max(3, small // 250)


def vs_raw(t: float, raw: float, digits: int = 2) -> str:
    """Table cells of a time ``t`` beside raw mpi4py's ``raw`` (seconds): ``" µs | added µs | raw / t |"``."""
    return f" {t * 1e6:.2f} | {(t - raw) * 1e6:+.2f} | {raw / t:.{digits}f} |"
