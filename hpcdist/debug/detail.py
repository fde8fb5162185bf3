"""``DETAIL`` debug mode: check that every rank enters the same collective, and with sizes that agree.

The collectives call :func:`check_collective` (and, where sizes may differ
between ranks, :func:`check_traffic`) only while
:data:`hpcdist.debug.levels.DETAIL` is set.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np

from ..errors import DistError
from ..work import strand, timeout_error, wait_requests

__all__ = ["check_collective", "check_traffic"]


def check_collective(pg: Any, desc: str) -> None:
    """DETAIL mode: verify every rank of ``pg`` is entering the same collective (``desc``).

    One all-gather of a 64-bit fingerprint (op, dtype, root/op) before the
    collective; on a mismatch every rank raises a DistError that lists what
    each rank called, instead of hanging or exchanging wrong data.
    """
    mine = np.array([zlib.crc32(desc.encode())], dtype=np.int64)
    table = np.empty(pg._size, dtype=np.int64)
    req = pg._comm.Iallgather(mine, table)
    if not wait_requests([req], pg._timeout_s):
        strand([req], (mine, table))
        raise timeout_error((f"{desc} (debug DETAIL fingerprint check)", pg), pg._timeout_s)
    if (table == mine[0]).all():
        return
    descs = pg._comm.allgather(desc)
    calls = "; ".join(f"global rank {pg._ranks[r]}: {d}" for r, d in enumerate(descs))
    raise DistError(f"collective mismatch on {pg!r} (ranks must call the same collectives in the same order): {calls}")


def check_traffic(pg: Any, desc: str, sends: Sequence[Any], recvs: Sequence[Any]) -> None:
    """DETAIL mode: every pair of ranks agrees on how many items travel between them.

    For the collectives whose sizes may differ between ranks (``gather``, ``scatter``, ``all_gather``,
    ``reduce_scatter``, the all-to-alls): ``sends[j]`` is what this rank sends group rank ``j``,
    ``recvs[i]`` what it expects from group rank ``i`` (items; a row of several numbers for a call of
    several parts, as ``all_gather_coalesced``). Called after :func:`check_collective` passed, so every
    rank is in the same collective. One all-to-all of the counts and one all-reduce of a flag; on a
    mismatch every rank raises a DistError naming each pair that disagrees, before any data moves (MPI
    would truncate on some ranks, or leave part of an output unwritten and report nothing).
    """
    from mpi4py import MPI

    n = pg._size
    mine = np.ascontiguousarray(sends, dtype=np.int64).reshape(n, -1)
    want = np.ascontiguousarray(recvs, dtype=np.int64).reshape(n, -1)
    got = np.empty_like(want)
    if mine.shape != want.shape:
        raise ValueError(f"check_traffic: sends {mine.shape} and recvs {want.shape} differ in shape")
    what = f"{desc} (debug DETAIL size check)"
    req = pg._comm.Ialltoall(mine, got)
    if not wait_requests([req], pg._timeout_s):
        strand([req], (mine, got))
        raise timeout_error((what, pg), pg._timeout_s)
    bad = np.argwhere(got != want)
    flag = np.array([len(bad)], dtype=np.int64)
    anywhere = np.empty(1, dtype=np.int64)
    req = pg._comm.Iallreduce(flag, anywhere, MPI.MAX)
    if not wait_requests([req], pg._timeout_s):
        strand([req], (flag, anywhere))
        raise timeout_error((what, pg), pg._timeout_s)
    if anywhere[0] == 0:
        return
    part = " (part {})" if want.shape[1] > 1 else ""
    me, glob = pg._rank, pg._ranks
    lines = [
        f"group rank {i} (global {glob[i]}) sends {got[i, t]} items{part.format(t)} to group rank {me} "
        f"(global {glob[me]}), which expects {want[i, t]}"
        for i, t in bad.tolist()
    ]
    every = [line for lines_of_rank in pg._comm.allgather(lines) for line in lines_of_rank]
    shown = "; ".join(every[:16]) + (f"; and {len(every) - 16} more" if len(every) > 16 else "")
    raise DistError(f"{desc} on {pg!r}: the ranks disagree on the sizes they exchange (no data moved): {shown}")
