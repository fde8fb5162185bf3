"""Debugging aids: ``monitored_barrier``, ``breakpoint``, debug levels.

``monitored_barrier`` is a barrier that says *who* did not arrive: rank 0 of
the group collects a token from every other rank with a timeout and raises
:class:`~hpcdist.errors.DistTimeoutError` naming the missing ranks (the
first, or all with ``wait_all_ranks=True``); the other ranks then time out
waiting for rank 0's release.
"""

from __future__ import annotations

import enum
import sys
import time
from datetime import timedelta
from typing import Any

import numpy as np

from . import config
from .errors import DistTimeoutError
from .group import resolve_group
from .p2p import internal_tag
from .work import wait_requests

__all__ = [
    "DebugLevel",
    "breakpoint",
    "get_debug_level",
    "monitored_barrier",
    "set_debug_level",
    "set_debug_level_from_env",
]


class DebugLevel(enum.IntEnum):
    """torch's ``DebugLevel``."""

    OFF = 0
    INFO = 1
    DETAIL = 2


_LEVEL: list[DebugLevel] = []
#: DETAIL[0]: check every collective's fingerprint across the group (read on the hot path)
DETAIL = [False]


def get_debug_level() -> DebugLevel:
    """The debug level (``HPCDIST_DEBUG`` / ``TORCH_DISTRIBUTED_DEBUG`` unless set)."""
    if not _LEVEL:
        set_debug_level_from_env()
    return _LEVEL[0]


def set_debug_level(level: DebugLevel) -> None:
    """OFF, INFO or DETAIL; DETAIL checks that every rank calls the same collective (costs one exchange)."""
    _LEVEL[:] = [DebugLevel(level)]
    DETAIL[0] = _LEVEL[0] is DebugLevel.DETAIL


def set_debug_level_from_env() -> None:
    set_debug_level(DebugLevel[config.debug_level()])


def check_collective(pg: Any, desc: str) -> None:
    """DETAIL mode: verify every rank of ``pg`` is entering the same collective (``desc``).

    One all-gather of a 64-bit fingerprint (op, dtype, root/op) before the
    collective; on a mismatch every rank raises a DistError that lists what
    each rank called, instead of hanging or exchanging wrong data.
    """
    import zlib

    from .errors import DistError
    from .work import timeout_error

    mine = np.array([zlib.crc32(desc.encode())], dtype=np.int64)
    table = np.empty(pg._size, dtype=np.int64)
    if not wait_requests([pg._comm.Iallgather(mine, table)], pg._timeout_s):
        raise timeout_error((f"{desc} (debug DETAIL fingerprint check)", pg), pg._timeout_s)
    if (table == mine[0]).all():
        return
    descs = pg._comm.allgather(desc)
    calls = "; ".join(f"global rank {pg._ranks[r]}: {d}" for r, d in enumerate(descs))
    raise DistError(f"collective mismatch on {pg!r} (ranks must call the same collectives in the same order): {calls}")


def _seconds(timeout: Any) -> float:
    """A timedelta, or seconds as a number (torch accepts both)."""
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, (int, float)) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise TypeError(f"timeout must be a datetime.timedelta or seconds, got {type(timeout).__name__} ({timeout!r})")
    if not seconds > 0:
        raise ValueError(f"timeout must be positive, got {timeout!r}")
    return seconds


def monitored_barrier(
    group: Any = None, timeout: timedelta | float | None = None, wait_all_ranks: bool = False
) -> None:
    """A barrier that names the ranks that did not arrive within ``timeout``.

    ``timeout`` is a ``timedelta`` or a number of seconds (as torch accepts);
    default: the group's timeout.

    SPMD: every rank of the group calls it. Raises DistTimeoutError on rank 0
    naming the missing global rank(s), and on the others when rank 0 does not
    release them.
    """
    pg = resolve_group(group, "monitored_barrier")
    if pg is None:
        return
    limit = pg._timeout_s if timeout is None else _seconds(timeout)
    comm = pg._comm
    pg._monitored_seq += 1  # on the group: a re-created group starts from 0 on every rank
    seq = pg._monitored_seq
    token_tag, release_tag = internal_tag("monitored_barrier"), internal_tag("monitored_release")
    if pg._size == 1:
        return
    if pg._rank != 0:
        token = np.array([seq], dtype=np.int64)
        sreq = comm.Isend(token, 0, token_tag)
        got = np.zeros(1, dtype=np.int64)
        while True:
            rreq = comm.Irecv(got, 0, release_tag)
            if not wait_requests([rreq], limit):
                rreq.Cancel()
                rreq.Wait()
                raise DistTimeoutError(
                    f"monitored_barrier: rank {pg._ranks[0]} (rank 0 of the group) did not release global rank "
                    f"{pg._ranks[pg._rank]} within {limit:g}s; look at rank 0's error for the ranks that failed "
                    "to arrive"
                )
            if int(got[0]) >= seq:
                break
        sreq.Wait()
        return
    deadline = time.monotonic() + limit
    bufs = {r: np.zeros(1, dtype=np.int64) for r in range(1, pg._size)}
    reqs = {r: comm.Irecv(bufs[r], r, token_tag) for r in bufs}
    arrived: set[int] = set()
    while len(arrived) < len(bufs) and time.monotonic() < deadline:
        progressed = False
        for r, req in list(reqs.items()):
            if req.Test():
                progressed = True
                if int(bufs[r][0]) == seq:
                    arrived.add(r)
                    del reqs[r]
                else:  # a token of an earlier, failed barrier: discard and wait again
                    reqs[r] = comm.Irecv(bufs[r], r, token_tag)
        if not progressed:
            time.sleep(0.0002)
            if not wait_all_ranks and reqs and time.monotonic() >= deadline:
                break
    missing = sorted(set(bufs) - arrived)
    if missing:
        for req in reqs.values():
            req.Cancel()
            req.Wait()
        names = [pg._ranks[r] for r in missing]
        who = names if wait_all_ranks else names[:1]
        err = DistTimeoutError(
            f"monitored_barrier: global rank{'s' if len(who) > 1 else ''} {', '.join(map(str, who))} "
            f"failed to pass monitored_barrier within {limit:g}s"
            + ("" if wait_all_ranks else " (pass wait_all_ranks=True to list every missing rank)")
        )
        err.missing_ranks = who  # type: ignore[attr-defined]  # the global ranks named (hpcdist.torch words them)
        raise err
    release = np.array([seq], dtype=np.int64)
    sends = [comm.Isend(release, r, release_tag) for r in bufs]
    wait_requests(sends, limit)


def breakpoint(rank: int = 0, skip: int = 0, timeout_s: float = 3600) -> None:
    """Drop into pdb on ``rank`` (with its terminal); the other ranks wait at a barrier.

    SPMD: every rank calls it. ``skip`` calls are ignored first.
    """
    from ._init import get_rank

    key = "__hpcdist_breakpoint_count"
    count = globals().get(key, 0)
    globals()[key] = count + 1
    if count < skip:
        return
    from . import collectives

    if get_rank() == rank:
        import pdb

        try:
            sys.stdin = open("/dev/tty")  # noqa: SIM115 - the debugger keeps it
        except OSError:
            pass
        print(f"hpcdist.breakpoint(): rank {rank} is in pdb; type 'c' to continue", file=sys.stderr, flush=True)
        pdb.Pdb().set_trace(sys._getframe(1))
    collectives.barrier(timeout=timedelta(seconds=timeout_s))
