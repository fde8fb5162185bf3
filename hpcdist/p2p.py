"""Point-to-point: ``send``/``recv``/``isend``/``irecv``, ``P2POp``, ``batch_isend_irecv``.

SPMD contract: a send to rank ``d`` with tag ``t`` matches a receive on
``d`` from this rank (or any source) with tag ``t``, in posting order (MPI's
non-overtaking rule). A receive whose sender never comes raises
:class:`~hpcdist.errors.DistTimeoutError` after the group's timeout and is
cancelled, so the group stays usable. ``dst``/``src`` are global ranks,
``group_dst``/``group_src`` ranks in the group.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from .buffers.adapters import adapt
from .flight import END, attach
from .group import ProcessGroup, group_rank, resolve_group
from .work import Work, mpi_failure

__all__ = ["P2POp", "batch_isend_irecv", "irecv", "isend", "recv", "send"]

_TAG_UB: list[int] = []
_TAG_MAX: list[int] = []  # the largest user tag, once known
#: tags above the user's range, for hpcdist's own point-to-point traffic
_INTERNAL = {
    "objects": 1,
    "monitored_barrier": 2,
    "monitored_release": 3,
    "object_gather": 4,
    "object_scatter": 5,
    "group_sync": 6,
}
_RESERVED = 16


def _tag_ub() -> int:
    if not _TAG_UB:
        from mpi4py import MPI

        _TAG_UB.append(int(MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) or 32767))
    return _TAG_UB[0]


def internal_tag(name: str) -> int:
    """A tag reserved for hpcdist's own messages (never a user's)."""
    return _tag_ub() - _INTERNAL[name]


def _check_tag(tag: Any) -> int:
    if type(tag) is int and _TAG_MAX and 0 <= tag <= _TAG_MAX[0]:  # the hot path
        return tag
    if isinstance(tag, bool) or not isinstance(tag, (int, np.integer)):
        raise TypeError(f"tag must be an int, got {type(tag).__name__}")
    top = _tag_ub() - _RESERVED
    if not _TAG_MAX:
        _TAG_MAX.append(top)
    if not 0 <= tag <= top:
        raise ValueError(f"tag must be in 0..{top} (MPI_TAG_UB less hpcdist's reserved tags), got {tag}")
    return int(tag)


def _peer(pg: ProcessGroup, glob: Any, grp: Any, name: str, allow_any: bool, allow_self: bool = False) -> int:
    if allow_any and glob is None and grp is None:
        from mpi4py import MPI

        return int(MPI.ANY_SOURCE)
    r = group_rank(pg, glob, grp, name)
    if r == pg._rank and not allow_self:
        raise ValueError(
            f"{name}={pg._ranks[r]} is this process's own rank: sending to or receiving from yourself would "
            "deadlock; use a copy instead"
        )
    return r


def isend(
    tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None
) -> Work | None:
    """Start sending ``tensor`` to rank ``dst``; return a Work (None for a non-member).

    Do not modify ``tensor`` before the Work completed. The arguments are
    :func:`send`'s.

    Returns:
        A :class:`~hpcdist.work.Work` that completes when ``tensor`` may be reused; None on a non-member.
    """
    pg = resolve_group(group, "isend")
    if pg is None:
        return None
    t = _check_tag(tag)
    peer = _peer(pg, dst, group_dst, "dst", False)
    buf = adapt(tensor, "tensor", False)
    fr = pg._flight
    work = pg.engine(buf.device).send(buf, peer, t)
    if fr is not None:
        attach(fr.p2p("isend", buf.dtype, buf.arr.size, peer), work)
    return work


def irecv(
    tensor: Any, src: int | None = None, group: Any = None, tag: int = 0, group_src: int | None = None
) -> Work | None:
    """Start receiving into ``tensor`` from ``src`` (None: any rank); ``work.source_rank()`` tells who sent.

    ``tensor`` is written when the Work completes. The arguments are
    :func:`recv`'s.

    Returns:
        A :class:`~hpcdist.work.Work`; ``wait()`` raises DistTimeoutError when no sender comes within
        the group's timeout. None on a non-member.
    """
    pg = resolve_group(group, "irecv")
    if pg is None:
        return None
    t = _check_tag(tag)
    peer = _peer(pg, src, group_src, "src", True)
    buf = adapt(tensor, "tensor", True)
    fr = pg._flight
    work = pg.engine(buf.device).recv(buf, peer, t)
    if fr is not None:
        attach(fr.p2p("irecv", buf.dtype, buf.arr.size, peer), work)
    return work


def send(tensor: Any, dst: int | None = None, group: Any = None, tag: int = 0, group_dst: int | None = None) -> None:
    """Send ``tensor`` to rank ``dst``; returns when the buffer may be reused.

    Args:
        tensor: the data to send.
        dst: the destination, a global rank; give ``dst`` or ``group_dst``, not both.
        group: the process group (None: the default group); on a non-member nothing happens.
        tag: matches a send with a receive: an int in 0..MPI_TAG_UB less hpcdist's 16 reserved tags.
        group_dst: the destination as a rank of ``group``.
    """
    pg = resolve_group(group, "send")
    if pg is None:
        return
    t = _check_tag(tag)
    peer = _peer(pg, dst, group_dst, "dst", False)
    buf = adapt(tensor, "tensor", False)
    fr = pg._flight
    entry = None if fr is None else fr.p2p("send", buf.dtype, buf.arr.size, peer)
    pg.engine(buf.device).send_now(buf, peer, t)
    if entry is not None:
        entry[END] = True


def recv(tensor: Any, src: int | None = None, group: Any = None, tag: int = 0, group_src: int | None = None) -> int:
    """Receive into ``tensor`` from ``src`` (None: any rank); return the sender's global rank (-1 for a non-member).

    A sender that never comes raises DistTimeoutError after the group's
    timeout; the receive is cancelled and the group stays usable.

    Args:
        tensor: the array that receives the message (written in place).
        src: the source, a global rank, or None for any rank of the group; or give ``group_src``.
        group: the process group (None: the default group); on a non-member nothing happens.
        tag: matches a send with a receive: an int in 0..MPI_TAG_UB less hpcdist's 16 reserved tags.
        group_src: the source as a rank of ``group``.

    Returns:
        The sender's global rank; -1 on a non-member.
    """
    pg = resolve_group(group, "recv")
    if pg is None:
        return -1
    t = _check_tag(tag)
    peer = _peer(pg, src, group_src, "src", True)
    buf = adapt(tensor, "tensor", True)
    fr = pg._flight
    entry = None if fr is None else fr.p2p("recv", buf.dtype, buf.arr.size, peer)
    try:
        source = pg.engine(buf.device).recv_now(buf, peer, t)
    except Exception as exc:  # MPI_Test reported a failed receive (a message larger than ``tensor``): say so
        err = mpi_failure(("recv", pg), exc)
        if err is exc:
            raise
        raise err from exc
    if entry is not None:
        entry[END] = True
    return source


class P2POp:
    """One point-to-point operation for :func:`batch_isend_irecv`.

    Args:
        op: :func:`isend` or :func:`irecv` (or ``torch.distributed``'s, matched by name).
        tensor: the data to send, or the array that receives.
        peer: the other side, a global rank; or give ``group_peer``.
        group: the process group (None: the default group).
        tag: matches a send with a receive.
        group_peer: the other side as a rank of ``group``.
    """

    def __init__(
        self,
        op: Callable[..., Any],
        tensor: Any,
        peer: int | None = None,
        group: Any = None,
        tag: int = 0,
        group_peer: int | None = None,
    ) -> None:
        name = getattr(op, "__name__", "")
        if name not in ("isend", "irecv"):
            raise ValueError(f"P2POp's op must be hpcdist.isend or hpcdist.irecv, got {op!r}")
        if peer is None and group_peer is None:
            raise ValueError("P2POp needs peer (a global rank) or group_peer (a rank in group)")
        self.op = isend if name == "isend" else irecv
        self.tensor = tensor
        self.peer = peer
        self.group = group
        self.tag = tag
        self.group_peer = group_peer

    def __repr__(self) -> str:
        return f"P2POp({self.op.__name__}, peer={self.peer}, group_peer={self.group_peer}, tag={self.tag})"


def batch_isend_irecv(p2p_op_list: list[P2POp]) -> list[Work]:
    """Start every operation of the list; return their Works (wait on each).

    All operations are checked before any starts, so a bad entry raises
    with nothing sent. Engines that must post a batch together (NCCL) get it
    as one group call.

    Args:
        p2p_op_list: the operations, a non-empty list of :class:`P2POp`.

    Returns:
        One :class:`~hpcdist.work.Work` per operation of a group this rank is in, in list order.
    """
    if not isinstance(p2p_op_list, (list, tuple)) or not p2p_op_list:
        raise ValueError("p2p_op_list must be a non-empty list of P2POp")
    prepared = []
    for i, p in enumerate(p2p_op_list):
        if not isinstance(p, P2POp):
            raise TypeError(f"p2p_op_list[{i}] must be a P2POp, got {type(p).__name__}")
        pg = resolve_group(p.group, "batch_isend_irecv")
        if pg is None:
            continue
        is_send = p.op is isend
        # this rank may be a peer: the batch posts every operation before any is waited for (torch allows it on
        # NCCL, and a ring of one rank exchanges with itself)
        peer = _peer(pg, p.peer, p.group_peer, "peer", False, allow_self=True)
        tag = _check_tag(p.tag)
        buf = adapt(p.tensor, f"p2p_op_list[{i}].tensor", not is_send)
        prepared.append((pg, is_send, peer, tag, buf))
    # engines that must post a batch together (NCCL: one group call, else a ring deadlocks) get it whole
    batches: dict[int, tuple[Any, list[int], list[tuple[bool, Any, int, int]]]] = {}
    works: list[Any] = [None] * len(prepared)
    for i, (pg, is_send, peer, tag, buf) in enumerate(prepared):
        eng = pg.engine(buf.device)
        if eng.batches_p2p:
            entry = batches.setdefault(id(eng), (eng, [], []))
            entry[1].append(i)
            entry[2].append((is_send, buf, peer, tag))
        else:
            works[i] = eng.send(buf, peer, tag) if is_send else eng.recv(buf, peer, tag)
    for eng, idx, ops in batches.values():
        for i, w in zip(idx, eng.batch_p2p(ops)):
            works[i] = w
    for (pg, is_send, peer, _, buf), w in zip(prepared, works):
        fr = pg._flight
        if fr is not None and w is not None:
            attach(fr.p2p("isend" if is_send else "irecv", buf.dtype, buf.arr.size, peer), w)
    return [w for w in works if w is not None]
