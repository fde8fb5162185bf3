"""``monitored_barrier``: a barrier that says *who* did not arrive.

Rank 0 of the group collects a token from every other rank with a timeout
and raises :class:`~hpcdist.errors.DistTimeoutError` naming the missing
ranks (the first, or all with ``wait_all_ranks=True``); the other ranks then
time out waiting for rank 0's release.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import numpy as np

from ..config import check_timeout
from ..errors import DistTimeoutError
from ..group import resolve_group
from ..p2p import internal_tag
from ..work import wait_requests

__all__ = ["monitored_barrier"]


def monitored_barrier(
    group: Any = None, timeout: timedelta | float | None = None, wait_all_ranks: bool = False
) -> None:
    """A barrier that names the ranks that did not arrive within ``timeout``.

    SPMD: every rank of the group calls it. Raises DistTimeoutError on rank 0
    naming the missing global rank(s), and on the others when rank 0 does not
    release them.

    Args:
        group: the group (None: the default group); on a non-member nothing happens.
        timeout: a ``timedelta`` or a number of seconds, as torch accepts (default: the group's
            timeout).
        wait_all_ranks: name every missing rank, not only the first.
    """
    pg = resolve_group(group, "monitored_barrier")
    if pg is None:
        return
    limit = pg._timeout_s if timeout is None else check_timeout(timeout, seconds=True).total_seconds()
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
