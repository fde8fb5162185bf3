"""The shared-memory algorithms, as functions of a :class:`~.segment.Segment`.

Each takes flat (1-D, C-contiguous) NumPy arrays and moves them through the
segment in chunks that fit its slots, pipelined over the three rotating sets
(one sync per chunk). They are the building blocks of the shared-memory
engine and of hierarchical engines (which call them on a node communicator's
segment). SPMD: every rank of the segment's communicator calls the same
function with arrays of the same sizes (the chunk schedule, hence the syncs,
depend on the sizes only).

Reductions are computed once per element, by the rank owning that slice of
the chunk, in rank order ``((x0 op x1) op x2) ...``; every rank copies the
same result out, so results are bitwise identical on every rank and from run
to run. float16/bfloat16 are widened to float32 when copied in and rounded
once when copied out; PREMUL_SUM multiplies while copying in; AVG divides the
owner's slice after the sum (integers truncate toward zero), as the MPI path.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from ...buffers.reduction import f32_to_bf16_bits, premultiply, scale_average
from .segment import Segment

__all__ = [
    "DIRECT_MAX",
    "UFUNCS",
    "all_gather",
    "all_reduce",
    "all_to_all",
    "broadcast",
    "reduce",
    "reduce_scatter",
    "work_dtype",
]

#: the MPI op name of a ResolvedOp -> the NumPy ufunc that computes it
UFUNCS: dict[str, Any] = {
    "SUM": np.add,
    "PROD": np.multiply,
    "MIN": np.minimum,
    "MAX": np.maximum,
    "BAND": np.bitwise_and,
    "BOR": np.bitwise_or,
    "BXOR": np.bitwise_xor,
    "LOR": np.logical_or,
    "LAND": np.logical_and,
    "LXOR": np.logical_xor,
}


def work_dtype(arr: np.ndarray, half: str | None) -> np.dtype:
    """The dtype reduced in the segment: float32 for half floats, else the array's."""
    return np.dtype(np.float32) if half else arr.dtype


def _load(slot: np.ndarray, src: np.ndarray, half: str | None, premul: Any) -> None:
    """Copy ``src`` into ``slot`` (widening half floats; bfloat16 bits exactly), then premultiply."""
    if half == "bfloat16":
        wide = slot.view(np.uint32)
        np.copyto(wide, src)
        np.left_shift(wide, 16, out=wide)
    else:
        np.copyto(slot, src)
    if premul is not None:
        premultiply(slot, premul)


def _store(dst: np.ndarray, res: np.ndarray, half: str | None) -> None:
    """Copy the (float32 for half floats) result ``res`` into ``dst``, rounding once."""
    if half == "bfloat16":
        dst[...] = f32_to_bf16_bits(res)
    else:
        np.copyto(dst, res, casting="unsafe")


def _two_stage(seg: Segment, chunks: int, write: Callable[[int, int], None], read: Callable[[int, int], None]) -> None:
    """Chunk ``c`` is written in one interval and read in the next; chunk ``c + 1``'s write overlaps ``c``'s read."""
    if chunks == 0:
        return
    sets = [seg.set_of(seg.step)]
    write(0, sets[0])
    seg.sync()
    for c in range(chunks):
        if c + 1 < chunks:
            sets.append(seg.set_of(seg.step))
            write(c + 1, sets[c + 1])
        read(c, sets[c])
        if c + 1 < chunks:
            seg.sync()


def _reduce_slice(seg: Segment, set_: int, dt: np.dtype, count: int, lo: int, hi: int, rows: int, ufunc: Any) -> Any:
    """Reduce ``[lo, hi)`` of the first ``count`` items over ``rows`` slots into slot 0, in rank order."""
    acc = seg.slot(set_, 0, dt, count)[lo:hi]
    for r in range(1, rows):
        ufunc(acc, seg.slot(set_, r, dt, count)[lo:hi], out=acc)
    return acc


def all_reduce(
    seg: Segment,
    src: np.ndarray,
    dst: np.ndarray,
    mpi_op: str,
    half: str | None = None,
    premul: Any = None,
    average: bool = False,
) -> None:
    """Reduce ``src`` over the segment's ranks into ``dst`` on every rank (``dst`` may be ``src``).

    Groups of up to :data:`DIRECT_MAX` ranks: :func:`reduce` on every rank
    (one copy in, one reduction straight into ``dst``, one sync per chunk);
    larger ones: :func:`_all_reduce_slices` (each rank reduces one slice).
    """
    if src.size == 0:
        return
    if seg.size <= DIRECT_MAX:
        reduce(seg, src, dst, mpi_op, half, premul, average)
    else:
        _all_reduce_slices(seg, src, dst, mpi_op, half, premul, average)


#: the largest group whose ranks each reduce whole chunks (more ranks: each reduces a slice)
DIRECT_MAX = 2


def reduce(
    seg: Segment,
    src: np.ndarray,
    dst: np.ndarray | None,
    mpi_op: str,
    half: str | None = None,
    premul: Any = None,
    average: bool = False,
) -> None:
    """Each rank copies its chunk into its slot; after one sync every rank that keeps a result reduces all
    slots, in rank order, straight into its ``dst`` (the same operations on the same bits: the same result).

    Per rank and element: one copy and one ``n``-way reduction; no
    intermediate result in the segment and no second sync per chunk.
    """
    n, me = seg.size, seg.rank
    dt = work_dtype(src, half)
    total = src.size
    k = seg.slot_bytes // dt.itemsize
    ufunc = UFUNCS[mpi_op]
    scratch = np.empty(min(k, total), dtype=dt) if (half and dst is not None) else None
    for lo in range(0, total, k):
        e = min(k, total - lo)
        set_ = seg.set_of(seg.step)
        _load(seg.slot(set_, me, dt, e), src[lo : lo + e], half, premul)
        seg.sync()
        if dst is None:
            continue
        out = dst[lo : lo + e] if scratch is None else scratch[:e]
        ufunc(seg.slot(set_, 0, dt, e), seg.slot(set_, 1, dt, e), out=out)
        for r in range(2, n):
            ufunc(out, seg.slot(set_, r, dt, e), out=out)
        if average:
            scale_average(out, n)
        if scratch is not None:
            _store(dst[lo : lo + e], out, half)


def _all_reduce_slices(
    seg: Segment,
    src: np.ndarray,
    dst: np.ndarray,
    mpi_op: str,
    half: str | None,
    premul: Any,
    average: bool,
) -> None:
    """Three stages per chunk (copy in, reduce this rank's slice in slot 0, copy out),
    pipelined so that a chunk's copy-in overlaps the previous one's reduction: one sync per chunk."""
    n, me = seg.size, seg.rank
    dt = work_dtype(src, half)
    total = src.size
    k = seg.slot_bytes // dt.itemsize
    chunks = -(-total // k)
    ufunc = UFUNCS[mpi_op]

    def write(c: int, set_: int) -> None:
        lo = c * k
        e = min(k, total - lo)
        _load(seg.slot(set_, me, dt, e), src[lo : lo + e], half, premul)

    sets = [seg.set_of(seg.step)]
    write(0, sets[0])
    seg.sync()
    for c in range(chunks):
        e = min(k, total - c * k)
        lo, hi = e * me // n, e * (me + 1) // n
        if hi > lo:
            acc = _reduce_slice(seg, sets[c], dt, e, lo, hi, n, ufunc)
            if average:
                scale_average(acc, n)
        if c + 1 < chunks:
            sets.append(seg.set_of(seg.step))
            write(c + 1, sets[c + 1])
        seg.sync()
        _store(dst[c * k : c * k + e], seg.slot(sets[c], 0, dt, e), half)


def broadcast(seg: Segment, arr: np.ndarray, root: int) -> None:
    """Copy ``arr`` of rank ``root`` into ``arr`` on every rank (the root fills whole sets)."""
    dt = arr.dtype
    total = arr.size
    k = seg.set_bytes // dt.itemsize
    me = seg.rank

    def write(c: int, set_: int) -> None:
        if me == root:
            lo = c * k
            e = min(k, total - lo)
            np.copyto(seg.whole(set_, dt, e), arr[lo : lo + e])

    def read(c: int, set_: int) -> None:
        if me != root:
            lo = c * k
            e = min(k, total - lo)
            np.copyto(arr[lo : lo + e], seg.whole(set_, dt, e))

    _two_stage(seg, -(-total // k), write, read)


def all_gather(seg: Segment, src: np.ndarray, outs: list[np.ndarray]) -> None:
    """Every rank's ``src`` (equal sizes) into ``outs[r]`` on every rank."""
    dt = src.dtype
    total = src.size
    k = seg.slot_bytes // dt.itemsize
    me = seg.rank

    def write(c: int, set_: int) -> None:
        lo = c * k
        e = min(k, total - lo)
        np.copyto(seg.slot(set_, me, dt, e), src[lo : lo + e])

    def read(c: int, set_: int) -> None:
        lo = c * k
        e = min(k, total - lo)
        for r, out in enumerate(outs):
            np.copyto(out[lo : lo + e], seg.slot(set_, r, dt, e))

    _two_stage(seg, -(-total // k), write, read)


def reduce_scatter(
    seg: Segment,
    ins: list[np.ndarray],
    dst: np.ndarray,
    mpi_op: str,
    half: str | None = None,
    premul: Any = None,
    average: bool = False,
) -> None:
    """Reduce ``ins[r]`` (one per rank, equal sizes) over the ranks into ``dst`` on rank ``r``."""
    n, me = seg.size, seg.rank
    dt = work_dtype(dst, half)
    total = dst.size
    k = max(1, seg.slot_bytes // (n * dt.itemsize))
    ufunc = UFUNCS[mpi_op]

    def rows(set_: int, rank: int, e: int) -> np.ndarray:
        return seg.slot(set_, rank, dt, n * e).reshape(n, e)

    def write(c: int, set_: int) -> None:
        lo = c * k
        e = min(k, total - lo)
        mine = rows(set_, me, e)
        for j, src in enumerate(ins):
            _load(mine[j], src[lo : lo + e], half, premul)

    def read(c: int, set_: int) -> None:
        lo = c * k
        e = min(k, total - lo)
        acc = rows(set_, 0, e)[me]
        for r in range(1, n):
            ufunc(acc, rows(set_, r, e)[me], out=acc)
        if average:
            scale_average(acc, n)
        _store(dst[lo : lo + e], acc, half)

    _two_stage(seg, -(-total // k), write, read)


def all_to_all(
    seg: Segment, src: np.ndarray, scounts: list[int], dst: np.ndarray, rcounts: list[int], window: tuple[int, int]
) -> bool:
    """``src``'s block ``j`` (``scounts[j]`` items, in order) to rank ``j``'s ``dst`` at block ``me``; False: not done.

    First every rank posts its send counts in its slot (one sync), so every
    rank knows the whole count matrix and the same chunk schedule; when the
    largest rank's send buffer (bytes) is outside ``window`` (``[lo, hi)``) every
    rank returns False (the caller takes MPI: the decision is the same everywhere). Otherwise
    each rank streams its send buffer through its slot chunk by chunk and
    every rank copies out the pieces addressed to it.
    """
    n, me = seg.size, seg.rank
    dt = src.dtype
    set_ = seg.set_of(seg.step)
    seg.slot(set_, me, np.int64, n)[:] = scounts
    seg.sync()
    matrix = np.stack([seg.slot(set_, r, np.int64, n).copy() for r in range(n)])  # [sender, receiver]
    totals = matrix.sum(axis=1)
    if not window[0] <= int(totals.max()) * dt.itemsize < window[1]:
        return False
    starts = np.concatenate([np.zeros((n, 1), np.int64), np.cumsum(matrix, axis=1)[:, :-1]], axis=1)
    rdispl = [0]
    for c in rcounts[:-1]:
        rdispl.append(rdispl[-1] + c)
    k = seg.slot_bytes // dt.itemsize
    total = src.size

    def write(c: int, s: int) -> None:
        lo = c * k
        e = min(k, total - lo)
        if e > 0:
            np.copyto(seg.slot(s, me, dt, e), src[lo : lo + e])

    def read(c: int, s: int) -> None:
        lo, hi = c * k, (c + 1) * k
        for r in range(n):
            a, b = int(starts[r, me]), int(starts[r, me] + matrix[r, me])
            a, b = max(a, lo), min(b, hi)
            if b > a:
                off = rdispl[r] + a - int(starts[r, me])
                np.copyto(dst[off : off + b - a], seg.slot(s, r, dt, b - a, a - lo))

    _two_stage(seg, -(-int(totals.max()) // k), write, read)
    return True
