"""Single-copy node-local collectives: every rank reads its peers' arrays directly (:mod:`.cma`).

The segment carries only addresses and the counter barrier; the data moves
once, from a peer's array into this rank's (or into a small scratch buffer
that stays in cache), in the kernel. Per rank and element an all_reduce
does ``(n - 1) / n`` of a read for its slice, ``1 / n`` of a reduction and
``(n - 1) / n`` of a read of the others' results — about half the memory
traffic of the segment's algorithms (:mod:`.algorithms`: a copy in and a copy
out of everything).

SPMD: every rank of the segment calls the same function with arrays of the
same sizes; each begins by posting the addresses of its arrays in its slot
and syncing (the first sync also checks that every rank begun the same
operation of the same size: :meth:`Segment.begin`, so no rank reads past a
peer's array), and ends with a sync, so that no rank returns — and lets its
caller change or free the array — while a peer may still read it.

Reductions: the owner of each slice reduces it in rank order
``((x0 op x1) op x2) ...``, as :mod:`.algorithms` does (the same bits on every
rank, from run to run, and the same as the segment's path). Half floats and
PREMUL_SUM, converted on the way in, stay on the segment's path.
Arrays are flat and C-contiguous (the engine's :class:`~hpcdist.buffers.adapters.Buf`).
"""

from __future__ import annotations

import numpy as np

from ...buffers.reduction import scale_average
from ...errors import DistError, describe_op
from .algorithms import UFUNCS, _bounds, _reduce_ordered
from .cma import Reader
from .segment import Segment, interruptible

__all__ = ["CHUNK_BYTES", "all_gather", "all_reduce", "broadcast", "reduce_scatter"]

#: bytes per peer read into scratch before a reduction step: small enough to stay in the L2 cache
CHUNK_BYTES = 256 << 10


def _post(seg: Segment, addrs: list[int]) -> list[list[int]]:
    """Post this rank's ``addrs`` (one sync; it checks the operation's tags); every rank's, by rank."""
    return seg.exchange(addrs)


def _read(seg: Segment, rd: Reader, rank: int, remote: int, local: int, nbytes: int) -> None:
    """``rd.read`` of rank ``rank``'s memory; a failure (the peer exited, the OS refused) is a DistError naming the
    operation, and the segment is out of step from then on (the other ranks time out at the next sync)."""
    try:
        rd.read(rank, remote, local, nbytes)
    except OSError as e:
        seg.broken = "a direct read failed"
        raise DistError(
            f"{describe_op(seg.what)}: reading group rank {rank}'s array directly failed: {e}. The peer exited or "
            "the OS no longer allows it; the group's shared memory is out of step now: create a new group "
            "(HPCDIST_SHM_DIRECT=0 goes through the segment instead)"
        ) from e


def _others(seg: Segment) -> list[int]:
    """The other ranks, from the next one on (no two ranks start reading the same peer)."""
    n, me = seg.size, seg.rank
    return [(me + i) % n for i in range(1, n)]


def _reduce_from(
    seg: Segment,
    rd: Reader,
    addrs: list[int],
    mine: np.ndarray,
    out: np.ndarray,
    mpi_op: str,
    average: bool,
) -> None:
    """``out = mine(rank 0) op ... op mine(rank n-1)``, rank order: the peers' parts (at ``addrs[r]``, the same
    size as ``mine``) read chunk by chunk into scratch; ``out`` may be ``mine``."""
    n, me = seg.size, seg.rank
    isz = mine.itemsize
    k = max(1, CHUNK_BYTES // isz)
    tmps = rd.scratch(mine.dtype, n - 1, k)
    ufunc = UFUNCS[mpi_op]
    for lo in range(0, mine.size, k):
        e = min(k, mine.size - lo)
        parts: list[np.ndarray] = []
        for r in range(n):
            if r == me:
                parts.append(mine[lo : lo + e])
                continue
            t = tmps[len(parts) - (r > me)][:e]
            _read(seg, rd, r, addrs[r] + lo * isz, t.ctypes.data, e * isz)
            parts.append(t)
        piece = out[lo : lo + e]
        _reduce_ordered(parts, piece, ufunc)
        if average:
            scale_average(piece, n)


@interruptible
def all_reduce(seg: Segment, rd: Reader, x: np.ndarray, mpi_op: str, average: bool = False) -> None:
    """Reduce ``x`` over the segment's ranks, in place on every rank. Three syncs.

    Rank ``r`` reduces slice ``r`` of the array (reading the peers' slices ``r``),
    then, after a sync, reads every peer's reduced slice into its own array.
    """
    n, me = seg.size, seg.rank
    addrs = [a[0] for a in _post(seg, [x.ctypes.data])]
    b = _bounds(x.size, n)
    isz = x.itemsize
    mine = x[b[me] : b[me + 1]]
    if mine.size:
        _reduce_from(seg, rd, [a + b[me] * isz for a in addrs], mine, mine, mpi_op, average)
    seg.sync()  # every slice is reduced
    for r in _others(seg):
        if b[r + 1] > b[r]:
            _read(seg, rd, r, addrs[r] + b[r] * isz, x.ctypes.data + b[r] * isz, (b[r + 1] - b[r]) * isz)
    seg.sync()  # every peer has read this rank's slice


@interruptible
def broadcast(seg: Segment, rd: Reader, arr: np.ndarray, root: int) -> None:
    """Copy ``arr`` of rank ``root`` into ``arr`` on every rank. Two syncs."""
    addrs = _post(seg, [arr.ctypes.data])
    if seg.rank != root:
        _read(seg, rd, root, addrs[root][0], arr.ctypes.data, arr.nbytes)
    seg.sync()  # the root's array is read


@interruptible
def all_gather(seg: Segment, rd: Reader, src: np.ndarray, outs: list[np.ndarray]) -> None:
    """Every rank's ``src`` (equal sizes) into ``outs[r]`` on every rank. Two syncs."""
    me = seg.rank  # (src is outs[me] or apart from every output, outs apart from each other: the engine's care)
    addrs = _post(seg, [src.ctypes.data])
    if not np.may_share_memory(src, outs[me]):
        np.copyto(outs[me], src)
    for r in _others(seg):
        _read(seg, rd, r, addrs[r][0], outs[r].ctypes.data, src.nbytes)
    seg.sync()  # every peer has read this rank's src


@interruptible
def reduce_scatter(
    seg: Segment, rd: Reader, ins: list[np.ndarray], dst: np.ndarray, mpi_op: str, average: bool = False
) -> None:
    """Reduce ``ins[r]`` (one per rank, equal sizes) over the ranks into ``dst`` on rank ``r``. Two syncs.

    ``dst`` may be ``ins[rank]`` (the peers never read it), else it shares no memory with ``ins`` (the engine
    computes such an output aside).
    """
    me = seg.rank
    posted = _post(seg, [a.ctypes.data for a in ins])
    if dst.size:
        _reduce_from(seg, rd, [p[me] for p in posted], ins[me], dst, mpi_op, average)
    seg.sync()  # every peer has read this rank's rows
