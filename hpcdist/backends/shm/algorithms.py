"""The shared-memory algorithms, as functions of a :class:`~.segment.Segment`.

Each takes flat (1-D, C-contiguous) NumPy arrays and moves them through the
segment in chunks that fit its slots, pipelined over the three rotating sets
(one sync per chunk; two for all_reduce and reduce, whose chunks go in,
are reduced slice by slice, and come out). They are the building blocks of the shared-memory
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

from bisect import bisect_left, bisect_right
from collections.abc import Callable
from itertools import accumulate
from typing import Any

import numpy as np

from ...buffers.reduction import f32_to_bf16_bits, premultiply, scale_average
from ...errors import DistError
from .segment import Segment, interruptible

__all__ = [
    "UFUNCS",
    "all_reduce_list",
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


def _bounds(e: int, n: int) -> list[int]:
    """The slice starts of an ``e``-item chunk split over ``n`` ranks (slice ``r`` is ``[b[r], b[r + 1])``)."""
    return [e * r // n for r in range(n + 1)]


def _reduce_ordered(parts: list[np.ndarray], out: np.ndarray, ufunc: Any) -> None:
    """``out = ((parts[0] op parts[1]) op parts[2]) ...``: rank order, whatever ``out`` aliases.

    ``out`` may be ``parts[0]`` or ``parts[1]`` exactly (the ufunc reads each
    element before writing it); overlapping a later part, it is computed aside.
    """
    if len(parts) > 2 and any(np.may_share_memory(out, p) for p in parts[2:]):
        acc = ufunc(parts[0], parts[1])
        for p in parts[2:]:
            ufunc(acc, p, out=acc)
        np.copyto(out, acc)
        return
    ufunc(parts[0], parts[1], out=out)
    for p in parts[2:]:
        ufunc(out, p, out=out)


class _Pieces:
    """Several flat arrays of one dtype seen as their concatenation (nothing is copied)."""

    def __init__(self, arrays: list[np.ndarray]) -> None:
        self.arrays = arrays
        self.starts = list(accumulate((a.size for a in arrays), initial=0))
        self.size = self.starts[-1]
        self.dtype = arrays[0].dtype

    def _span(self, lo: int, hi: int) -> tuple[int, int]:
        """The indices ``[i, j)`` of the arrays that hold items of ``[lo, hi)``."""
        starts = self.starts
        return bisect_right(starts, lo) - 1, bisect_left(starts, hi)

    def _clip(self, i: int, lo: int, hi: int) -> np.ndarray:
        """Array ``i``'s part in items ``[lo, hi)`` (the whole array when it lies inside)."""
        s, e = self.starts[i], self.starts[i + 1]
        a = self.arrays[i]
        return a if lo <= s and e <= hi else a[max(lo, s) - s : min(hi, e) - s]

    def gather(self, out: np.ndarray, lo: int) -> None:
        """Items ``[lo, lo + out.size)`` of the concatenation into ``out`` (one ``concatenate``)."""
        hi = lo + out.size
        i, j = self._span(lo, hi)
        if j - i == 1:
            np.copyto(out, self._clip(i, lo, hi))
            return
        parts = self.arrays[i:j]  # the arrays inside whole; the first and last clipped
        parts[0], parts[-1] = self._clip(i, lo, hi), self._clip(j - 1, lo, hi)
        np.concatenate(parts, out=out)

    def scatter(self, res: np.ndarray, lo: int) -> None:
        """``res`` into items ``[lo, lo + res.size)`` of the arrays."""
        hi = lo + res.size
        i, j = self._span(lo, hi)
        starts, arrays, copyto = self.starts, self.arrays, np.copyto
        first = self._clip(i, lo, hi)
        copyto(first, res[: first.size])
        for k in range(i + 1, j - 1):  # the arrays inside whole
            at = starts[k] - lo
            copyto(arrays[k], res[at : starts[k + 1] - lo])
        if j - 1 > i:
            last = self._clip(j - 1, lo, hi)
            at = starts[j - 1] - lo
            copyto(last, res[at : at + last.size])


class _Reduction:
    """One reduction of ``src`` over the segment's ranks, chunk by chunk: every rank reduces one slice.

    Per chunk (at most a slot of the work dtype): :meth:`load` copies into this
    rank's slot what the other ranks reduce — all but this rank's own slice,
    whose part it reads from ``src`` itself, unless the items are converted on
    the way in (half floats widened, PREMUL_SUM multiplied: then all of it);
    after a sync :meth:`reduce_mine` reduces this rank's slice over the ranks in
    rank order into its slot's slice; after another sync :meth:`copy_out` copies
    the slices (every rank's result) out. Each element is computed by one rank,
    so every rank gets the same bits.
    """

    def __init__(
        self, seg: Segment, src: np.ndarray | _Pieces, mpi_op: str, half: str | None, premul: Any, average: bool
    ) -> None:
        self.seg, self.src, self.half, self.premul, self.average = seg, src, half, premul, average
        self.dt = dt = np.dtype(np.float32) if half else src.dtype
        self.k = seg.slot_bytes // dt.itemsize  # items per chunk: one slot
        self.items = seg.items(dt)
        self.n_set = seg.set_bytes // dt.itemsize  # items per set
        self.ufunc = UFUNCS[mpi_op]
        # this rank's part of its slice is read from src (one array, items not converted on the way in)
        self.direct = half is None and premul is None and isinstance(src, np.ndarray)

    def plan(self, c: int, set_: int) -> tuple[int, int, list[int], list[int]]:
        """Chunk ``c`` in ``set_``: its first item, its items, its slice bounds and every rank's slot start
        (an index into :meth:`Segment.items`)."""
        n, k = self.seg.size, self.k
        lo = c * k
        e = min(k, self.src.size - lo)
        base = set_ * self.n_set
        return lo, e, _bounds(e, n), [base + r * k for r in range(n)]

    def load(self, plan: tuple[int, int, list[int], list[int]]) -> None:
        src, me = self.src, self.seg.rank
        lo, e, b, slots = plan
        slot = self.items[slots[me] : slots[me] + e]
        if isinstance(src, _Pieces):
            src.gather(slot, lo)
            if self.premul is not None:
                premultiply(slot, self.premul)
            return
        if not self.direct:
            _load(slot, src[lo : lo + e], self.half, self.premul)
            return
        a, z = b[me], b[me + 1]
        if a > 0:
            np.copyto(slot[:a], src[lo : lo + a])
        if z < e:
            np.copyto(slot[z:], src[lo + z : lo + e])

    def reduce_mine(self, plan: tuple[int, int, list[int], list[int]]) -> None:
        me, items = self.seg.rank, self.items
        lo, _, b, slots = plan
        a, z = b[me], b[me + 1]
        if z == a:
            return
        parts = [items[at + a : at + z] for at in slots]
        out = parts[me]
        if self.direct and isinstance(self.src, np.ndarray):
            parts[me] = self.src[lo + a : lo + z]
        _reduce_ordered(parts, out, self.ufunc)
        if self.average:
            scale_average(out, len(slots))

    def copy_out(self, plan: tuple[int, int, list[int], list[int]], dst: np.ndarray | _Pieces) -> None:
        lo, _, b, slots = plan
        items, half, me, n = self.items, self.half, self.seg.rank, len(slots)
        for i in range(n):  # this rank's own slice first (in its cache), then the next ranks': no two ranks
            r = (me + i) % n  # read the same slot at once
            a, z, at = b[r], b[r + 1], slots[r]
            if z > a:
                if isinstance(dst, _Pieces):
                    dst.scatter(items[at + a : at + z], lo + a)
                elif half is None:
                    np.copyto(dst[lo + a : lo + z], items[at + a : at + z])
                else:
                    _store(dst[lo + a : lo + z], items[at + a : at + z], half)

    def run(self, dst: np.ndarray | _Pieces | None) -> None:
        """The whole reduction, results into ``dst`` (None: this rank keeps none); two syncs a chunk, pipelined:
        chunk ``c + 1``'s copy-in shares the interval of chunk ``c``'s copy-out."""
        seg = self.seg
        chunks = -(-self.src.size // self.k)
        plan = self.plan(0, seg.set_of(seg.step))
        self.load(plan)
        seg.sync()
        for c in range(chunks):
            self.reduce_mine(plan)
            seg.sync()
            last = c + 1 == chunks
            nxt = plan if last else self.plan(c + 1, seg.set_of(seg.step))
            if not last:
                self.load(nxt)
            if dst is not None:
                self.copy_out(plan, dst)
            if not last:
                seg.sync()
            plan = nxt


@interruptible
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

    A reduce-scatter and an all-gather inside the segment (:class:`_Reduction`):
    per rank and element, at most one copy in, ``1/n`` of a reduction and one
    copy out; two syncs a chunk.
    """
    if src.size:
        _Reduction(seg, src, mpi_op, half, premul, average).run(dst)


@interruptible
def all_reduce_list(
    seg: Segment, arrays: list[np.ndarray], mpi_op: str, premul: Any = None, average: bool = False
) -> None:
    """:func:`all_reduce` of the concatenation of ``arrays`` (flat, C-contiguous, one dtype, not half floats), each
    in place: the arrays are packed straight into the slots and the results copied straight back, with no flat
    buffer between (bucketed and coalesced all-reduces)."""
    src = _Pieces(arrays)
    if src.size:
        _Reduction(seg, src, mpi_op, None, premul, average).run(src)


@interruptible
def reduce(
    seg: Segment,
    src: np.ndarray,
    dst: np.ndarray | None,
    mpi_op: str,
    half: str | None = None,
    premul: Any = None,
    average: bool = False,
) -> None:
    """Reduce ``src`` over the segment's ranks into ``dst`` on the rank(s) that pass one (others pass None).

    As :func:`all_reduce` (every rank reduces one slice), but only the ranks
    with a ``dst`` copy the results out.
    """
    if src.size:
        _Reduction(seg, src, mpi_op, half, premul, average).run(dst)


@interruptible
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


@interruptible
def all_gather(seg: Segment, src: np.ndarray, outs: list[np.ndarray]) -> None:
    """Every rank's ``src`` (equal sizes) into ``outs[r]`` on every rank."""
    dt = src.dtype
    total = src.size
    k = seg.slot_bytes // dt.itemsize
    n, me = seg.size, seg.rank

    def write(c: int, set_: int) -> None:
        lo = c * k
        e = min(k, total - lo)
        np.copyto(seg.slot(set_, me, dt, e), src[lo : lo + e])

    def read(c: int, set_: int) -> None:
        lo = c * k
        e = min(k, total - lo)
        for i in range(n):  # this rank's own slot first, then the next ranks' (no two ranks read one slot at once)
            r = (me + i) % n
            np.copyto(outs[r][lo : lo + e], seg.slot(set_, r, dt, e))

    _two_stage(seg, -(-total // k), write, read)


@interruptible
def reduce_scatter(
    seg: Segment,
    ins: list[np.ndarray],
    dst: np.ndarray,
    mpi_op: str,
    half: str | None = None,
    premul: Any = None,
    average: bool = False,
) -> None:
    """Reduce ``ins[r]`` (one per rank, equal sizes) over the ranks into ``dst`` on rank ``r``.

    Per chunk every rank copies the rows the others reduce into its slot (its
    own row too when items are converted on the way in: half floats, PREMUL_SUM),
    then, after one sync, reduces its row in rank order, reading its own part
    from ``ins[rank]`` itself (``dst`` may be that array).
    """
    n, me = seg.size, seg.rank
    dt = work_dtype(dst, half)
    total = dst.size
    k = max(1, seg.slot_bytes // (n * dt.itemsize))  # items per row and chunk
    items, n_set, n_slot = seg.items(dt), seg.set_bytes // dt.itemsize, seg.slot_bytes // dt.itemsize
    ufunc = UFUNCS[mpi_op]
    direct = half is None and premul is None

    def write(c: int, set_: int) -> None:
        lo = c * k
        e = min(k, total - lo)
        base = set_ * n_set + me * n_slot
        for j, src in enumerate(ins):
            row = items[base + j * e : base + (j + 1) * e]
            if not direct:
                _load(row, src[lo : lo + e], half, premul)
            elif j != me:
                np.copyto(row, src[lo : lo + e])

    def read(c: int, set_: int) -> None:
        lo = c * k
        e = min(k, total - lo)
        parts = [items[set_ * n_set + r * n_slot + me * e :][:e] for r in range(n)]
        if direct:
            parts[me] = ins[me][lo : lo + e]
            out = dst[lo : lo + e]
        else:
            out = parts[0]  # rank 0's copy of this rank's row: read only here
        _reduce_ordered(parts, out, ufunc)
        if average:
            scale_average(out, n)
        if not direct:
            _store(dst[lo : lo + e], out, half)

    _two_stage(seg, -(-total // k), write, read)


def _check_splits(sends: np.ndarray, recvs: np.ndarray) -> None:
    """DistError on every rank (all hold both matrices) where a rank expects another number of items from a peer
    than the peer sends it: MPI would truncate or leave part of the output unwritten."""
    bad = np.argwhere(recvs != sends.T)  # [receiver, sender]
    if bad.size:
        dst, src = (int(v) for v in bad[0])
        raise DistError(
            f"all_to_all_single: the ranks' split sizes disagree: group rank {dst} expects {int(recvs[dst, src])} "
            f"items from group rank {src} (its output_split_sizes), which sends it {int(sends[src, dst])} (its "
            f"input_split_sizes); {len(bad)} pair(s) disagree"
        )


@interruptible
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
    posted = seg.slot(set_, me, np.int64, 2 * n)  # a slot holds 16 bytes per rank at least (ShmEngine)
    posted[:n], posted[n:] = scounts, rcounts
    seg.sync()
    both = np.stack([seg.slot(set_, r, np.int64, 2 * n).copy() for r in range(n)])
    matrix = both[:, :n]  # [sender, receiver]
    _check_splits(matrix, both[:, n:])
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
