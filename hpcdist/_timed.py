"""MPI steps of init and group creation bounded by a timeout, in both wait modes.

A blocking MPI call cannot be interrupted, so every step that waits for other
ranks is done with a non-blocking call polled against the timeout: a barrier
(``MPI_Ibarrier``), a small exchange (``MPI_Iallgather``/``MPI_Ibcast`` of a
JSON payload), and before the MPI calls that have no non-blocking form
(``MPI_Comm_split_type``: :func:`hpcdist.topology.split_shared`, ``MPI_Comm_split``,
``MPI_Comm_create_group``) a
polled barrier that proves every rank is there; those calls then run under
the watchdog as a backstop for a rank that dies between the two.

A timeout raises :class:`~hpcdist.errors.DistTimeoutError` naming the step,
this rank and how to fix it, and marks the process *poisoned*
(:func:`hpcdist._exit.poison`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any, NoReturn

import numpy as np

from ._exit import poison
from ._ranklist import MESSAGE_LIMIT, ranks_text
from ._watchdog import WATCHDOG
from .errors import DistTimeoutError
from .work import strand, wait_requests

__all__ = [
    "INIT_HINT",
    "guarded",
    "timed_allgather_json",
    "timed_barrier",
    "timed_bcast_json",
    "timed_members_barrier",
    "watched",
    "wait_or_raise",
]

#: What a rank stuck in init is told: who must call what.
INIT_HINT = (
    "every process of the job must call init_process_group; a process that never comes, crashed before it, or "
    "is still busy leaves the others waiting (raise timeout= if it is just slow)"
)


def _rank_note(comm: Any) -> str:
    return f"this is rank {comm.Get_rank()} of {comm.Get_size()}"


def wait_or_raise(comm: Any, reqs: list[Any], timeout_s: float, what: str, hint: str) -> None:
    """Poll ``reqs`` for ``timeout_s``; DistTimeoutError naming ``what`` and this rank otherwise (and poison)."""
    if wait_requests(reqs, timeout_s):
        return
    strand(reqs, None)  # a late peer may still make MPI use their buffers (the requests hold them): keep them
    _give_up(f"{what}: not every rank arrived within {timeout_s:g}s ({_rank_note(comm)}); {hint}")


def _give_up(msg: str) -> NoReturn:
    """Raise DistTimeoutError(msg); a peer is stuck, so exiting must abort rather than wait in MPI_Finalize."""
    poison(msg)
    raise DistTimeoutError(msg)


def timed_barrier(comm: Any, timeout_s: float, what: str, hint: str) -> None:
    """``MPI_Ibarrier`` polled against the timeout."""
    wait_or_raise(comm, [comm.Ibarrier()], timeout_s, what, hint)


def timed_allgather_json(comm: Any, obj: Any, timeout_s: float, what: str, hint: str) -> list[Any]:
    """Every rank's JSON-able ``obj``, in rank order: two polled ``MPI_Iallgather(v)``."""
    data = np.frombuffer(json.dumps(obj).encode(), dtype=np.uint8)
    n = comm.Get_size()
    lengths = np.empty(n, dtype=np.int64)
    wait_or_raise(comm, [comm.Iallgather(np.array([data.size], dtype=np.int64), lengths)], timeout_s, what, hint)
    displs = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    flat = np.empty(int(lengths.sum()), dtype=np.uint8)
    req = comm.Iallgatherv(data, [flat, (lengths.tolist(), displs.tolist())])
    wait_or_raise(comm, [req], timeout_s, what, hint)
    return [json.loads(flat[d : d + c].tobytes()) for d, c in zip(displs, lengths)]


def timed_bcast_json(comm: Any, obj: Any, root: int, timeout_s: float, what: str, hint: str) -> Any:
    """Root's JSON-able ``obj`` on every rank: two polled ``MPI_Ibcast`` (length, bytes)."""
    mine = json.dumps(obj).encode() if comm.Get_rank() == root else b""
    length = np.array([len(mine)], dtype=np.int64)
    wait_or_raise(comm, [comm.Ibcast(length, root)], timeout_s, what, hint)
    buf = np.frombuffer(mine, dtype=np.uint8).copy() if mine else np.empty(int(length[0]), dtype=np.uint8)
    wait_or_raise(comm, [comm.Ibcast(buf, root)], timeout_s, what, hint)
    return json.loads(buf.tobytes())


def watched(call: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """``call()`` (a blocking MPI call every rank is known to have reached) under the watchdog."""
    previous = WATCHDOG.arm(timeout_s, what)
    try:
        return call()
    finally:
        WATCHDOG.disarm(previous)


def guarded(call: Callable[[], Any], comm: Any, timeout_s: float, what: str, hint: str) -> Any:
    """A blocking MPI collective with no non-blocking form: a polled barrier first, then ``call()``.

    After the barrier every rank is known to be there, so ``call`` returns
    promptly; the watchdog ends the job should a rank die between the two.
    """
    timed_barrier(comm, timeout_s, what, hint)
    return watched(call, timeout_s, f"{what} ({_rank_note(comm)})")


def timed_members_barrier(comm: Any, members: list[int], timeout_s: float, what: str, hint: str) -> None:
    """A barrier of some ranks of ``comm`` only (ranks of ``comm``), polled; DistTimeoutError names the absent.

    The first member collects a token from each other member, then releases
    them; the others' error names the first member.
    """
    from .p2p import internal_tag

    me, lead, tag = comm.Get_rank(), members[0], internal_tag("group_sync")
    if len(members) == 1:
        return
    if me == lead:
        others = members[1:]
        bufs = [np.empty(1, dtype=np.int8) for _ in others]
        reqs = [comm.Irecv(b, m, tag) for b, m in zip(bufs, others)]
        if not wait_requests(reqs, timeout_s):
            absent = [m for m, r in zip(others, reqs) if not r.Test()]
            _cancel(reqs)
            _give_up(
                f"{what}: ranks {ranks_text(absent, MESSAGE_LIMIT)} of the {len(members)} members "
                f"({ranks_text(members, MESSAGE_LIMIT)}) did not arrive within {timeout_s:g}s "
                f"({_rank_note(comm)}); {hint}"
            )
        token = np.zeros(1, dtype=np.int8)
        wait_or_raise(comm, [comm.Isend(token, m, tag) for m in others], timeout_s, what, hint)
        return
    token, release = np.zeros(1, dtype=np.int8), np.empty(1, dtype=np.int8)
    sreq, rreq = comm.Isend(token, lead, tag), comm.Irecv(release, lead, tag)
    if not wait_requests([sreq, rreq], timeout_s):
        _cancel([rreq])
        strand([sreq], None)  # the token may still go to a late lead: keep its request (and buffer)
        _give_up(
            f"{what}: rank {lead} (the first of {members}) did not release this rank within {timeout_s:g}s "
            f"({_rank_note(comm)}): not every member arrived; {hint}"
        )


def _cancel(reqs: list[Any]) -> None:
    for req in reqs:
        try:
            if not req.Test():
                req.Cancel()
                req.Wait()
        except Exception:  # pragma: no cover - a request the MPI cannot cancel is left as it is
            pass
