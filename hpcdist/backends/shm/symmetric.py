"""Symmetric memory: arrays that every rank of a node's group can read where they lie, and collectives on them.

:func:`allocate` (collective over a group whose ranks share one node) maps
one shared file holding one part per rank; rank ``r``'s array is part ``r``,
and every rank can see every part. A collective on such arrays needs no copy
through the segment: the owner of each slice of an all_reduce reads the
slice straight from every rank's array and writes the result into its own,
and the others copy it from there — a read of ``n`` slices, one write and a
copy per element, where the segment's path copies everything in and out
(torch's ``SymmetricMemory`` and NCCL's registered buffers do the same on GPUs).

The file is unlinked as soon as every rank has mapped it (nothing is left in
``/dev/shm``); the mapping, hence the memory, lives until the last array (or
view) of it on every rank is gone. :data:`LIVE` knows the live allocations by
address, so the shared-memory engine recognises an array of one (a view too)
without being told.

The collectives (:func:`all_reduce`, :func:`broadcast`, :func:`all_gather`,
:func:`reduce_scatter`) begin, as the segment's do, with the segment's
operation tags (:meth:`Segment.begin`) and one sync, at which every rank also
posts which allocation it passes and where in its part; every rank checks
that all passed the same allocation and reads each peer's array where that
peer said (the operation's size is the same on every rank: the tag checks
it), so no rank reads past a peer's array. They end with a sync, so no rank returns — and
lets its caller write the array again — while a peer may still read it.
Reductions are computed once per element, by the owner of the slice, in rank
order ``((x0 op x1) op x2) ...``: the same bits on every rank, from run to
run, and the same as the segment's path. SPMD: every rank of the group
passes arrays of the same allocation (anywhere in its part: FSDP's
all_gather passes row ``rank`` of the output as the input), of the same size.
"""

from __future__ import annotations

import bisect
import ctypes
import mmap
import weakref
from typing import Any

import numpy as np

from ..._timed import timed_allgather_json
from ...buffers.reduction import scale_average
from ...errors import DistError, describe_op
from .algorithms import UFUNCS, _bounds, _reduce_ordered
from .direct import _others
from .segment import Segment, _map_shared, interruptible

__all__ = ["LIVE", "OPS", "Allocation", "all_gather", "all_reduce", "allocate", "broadcast", "find", "reduce_scatter"]

#: the operations with a symmetric-memory algorithm (their names in the segment's mismatch errors get a suffix)
OPS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor")

_PAGE = mmap.PAGESIZE
#: items per step of a reduction of more than two ranks (its partial results stay in the L2 cache)
CHUNK_BYTES = 256 << 10


class Allocation:
    """One symmetric allocation as this rank sees it: the group, the mapping and where each rank's part lies."""

    __slots__ = ("__weakref__", "_map", "group", "key", "nbytes", "rank", "size", "start", "stride")

    def __init__(self, pg: Any, m: mmap.mmap, key: int, nbytes: int, stride: int) -> None:
        self.group = weakref.ref(pg)
        self._map = weakref.ref(m)  # the arrays keep the mapping alive, not this record
        self.key = key  # the same on every rank
        self.rank, self.size = pg._rank, pg._size
        self.nbytes, self.stride = nbytes, stride  # each part's bytes, and the distance between parts
        self.start = np.frombuffer(m, np.uint8, 1).ctypes.data + self.rank * stride  # this rank's part

    def part(self, rank: int, dtype: np.dtype, offset: int, count: int) -> np.ndarray:
        """``count`` items of ``dtype`` at byte ``offset`` of rank ``rank``'s part."""
        m = self._map()
        assert m is not None, "an array of the allocation is alive, so is its mapping"
        return np.frombuffer(m, dtype, count, rank * self.stride + offset)


#: the live allocations of this process, by the address of this rank's part (sorted), for :func:`find`
LIVE: list[tuple[int, Allocation]] = []


def _forget(start: int) -> None:
    i = bisect.bisect_left(LIVE, start, key=lambda e: e[0])
    if i < len(LIVE) and LIVE[i][0] == start:
        del LIVE[i]


def allocate(pg: Any, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    """Collective over ``pg`` (every rank on one node, the same ``shape`` and ``dtype``, checked): this rank's
    array of a new symmetric allocation, zero-filled. Bounded by the group's timeout."""
    what = describe_op(("symmetric_memory.empty", pg))
    mine = [list(shape), dtype.str]
    every = timed_allgather_json(pg._comm, mine, pg._timeout_s, what, "every rank of the group must call it")
    for r, theirs in enumerate(every):
        if theirs != mine:
            raise ValueError(
                f"{what}: every rank of the group must ask for the same shape and dtype; this rank (group rank "
                f"{pg._rank}) asked for shape {tuple(shape)} of {dtype}, group rank {r} for shape {tuple(theirs[0])} "
                f"of {np.dtype(theirs[1])}"
            )
    nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
    stride = max(_PAGE, -(-nbytes // _PAGE) * _PAGE)  # every part starts on a page of its own
    m, path = _map_shared(pg._comm, stride * pg._size, pg._timeout_s, what, "allocate less, or ")
    key = int(path.rsplit("-", 1)[1], 16)
    alloc = Allocation(pg, m, key, nbytes, stride)
    bisect.insort(LIVE, (alloc.start, alloc), key=lambda e: e[0])
    weakref.finalize(m, _forget, alloc.start)
    count = nbytes // dtype.itemsize
    return np.frombuffer(m, dtype, count, pg._rank * stride).reshape(shape)


def address(arr: np.ndarray) -> int:
    """The address of ``arr``'s first byte (a third of the time of ``arr.ctypes.data`` for writable arrays)."""
    try:
        return ctypes.addressof(ctypes.c_char.from_buffer(arr))  # type: ignore[arg-type]
    except (TypeError, ValueError, BufferError):  # read-only, empty or not contiguous
        return int(arr.ctypes.data)


def find(arr: np.ndarray) -> tuple[Allocation, int] | None:
    """The allocation holding all of ``arr`` (a C-contiguous array) in this rank's part, and its byte offset
    there; None when ``arr`` lies elsewhere."""
    if not LIVE:
        return None
    live = LIVE[:]  # a garbage collection in another thread may drop an entry meanwhile
    addr = address(arr)
    i = bisect.bisect_right(live, addr, key=lambda e: e[0]) - 1
    if i < 0:
        return None
    start, alloc = live[i]
    off = addr - start
    return (alloc, off) if off + arr.nbytes <= alloc.nbytes else None


def _agree(seg: Segment, alloc: Allocation, offset: int) -> list[int]:
    """The first sync: post (allocation, offset); every rank's offset, by rank. A rank that passed another
    allocation is a DistError on every rank alike (they all read the same posts)."""
    posted = seg.exchange([alloc.key, offset])
    for r, (key, _) in enumerate(posted):
        if key != alloc.key:
            raise DistError(
                f"{describe_op(seg.what)}: every rank must pass an array of the same symmetric allocation; group "
                f"rank {r} passed another allocation than this rank (group rank {seg.rank})"
            )
    return [off for _, off in posted]


def _reduce(parts: list[np.ndarray], out: np.ndarray, mpi_op: str) -> None:
    """``out = ((parts[0] op parts[1]) op parts[2]) ...`` in steps of :data:`CHUNK_BYTES` (partial results stay
    in cache); ``out`` may be one of ``parts`` exactly, or apart (:func:`~.algorithms._reduce_ordered`)."""
    ufunc = UFUNCS[mpi_op]
    k = max(1, CHUNK_BYTES // out.itemsize) if len(parts) > 2 else max(1, out.size)  # two: no partial results
    for lo in range(0, out.size, k):
        hi = lo + k
        _reduce_ordered([p[lo:hi] for p in parts], out[lo:hi], ufunc)


@interruptible
def all_reduce(seg: Segment, alloc: Allocation, x: np.ndarray, offset: int, mpi_op: str, average: bool) -> None:
    """Reduce ``x`` (flat, at ``offset`` of this rank's part) over the ranks, in place on every rank. Three syncs.

    Rank ``r`` reduces slice ``r`` reading it from every part, into its own
    array; after a sync each rank copies every other slice from its owner.
    """
    n, me = seg.size, seg.rank
    offs = _agree(seg, alloc, offset)
    b = _bounds(x.size, n)
    views = [x if r == me else alloc.part(r, x.dtype, offs[r], x.size) for r in range(n)]
    lo, hi = b[me], b[me + 1]
    if hi > lo:
        mine = x[lo:hi]
        _reduce([v[lo:hi] for v in views], mine, mpi_op)
        if average:
            scale_average(mine, n)
    seg.sync()  # every slice is reduced
    for r in _others(seg):
        if b[r + 1] > b[r]:
            np.copyto(x[b[r] : b[r + 1]], views[r][b[r] : b[r + 1]])
    seg.sync()  # every peer has copied this rank's slice


@interruptible
def broadcast(seg: Segment, alloc: Allocation, x: np.ndarray, offset: int, root: int) -> None:
    """Copy ``x`` of rank ``root`` into ``x`` on every rank. Two syncs.

    Every array is visible to every rank, so the copying is shared: rank ``r``
    (the root too) copies slice ``r`` of the root's array into every other
    rank's array — one copy per element and receiver, spread over all ranks.
    """
    n, me = seg.size, seg.rank
    offs = _agree(seg, alloc, offset)
    b = _bounds(x.size, n)
    lo, hi = b[me], b[me + 1]
    if hi > lo:
        src = x[lo:hi] if me == root else alloc.part(root, x.dtype, offs[root] + lo * x.itemsize, hi - lo)
        for r in [me, *_others(seg)]:
            if r != root:
                np.copyto(x[lo:hi] if r == me else alloc.part(r, x.dtype, offs[r] + lo * x.itemsize, hi - lo), src)
    seg.sync()  # every slice is in every array


@interruptible
def all_gather(seg: Segment, alloc: Allocation, src: np.ndarray, offset: int, rows: list[np.ndarray]) -> None:
    """Every rank's ``src`` (at ``offset`` of its part) into ``rows[r]`` on every rank. Two syncs.

    A row that overlaps this rank's ``src`` (which the peers are reading), other
    than ``rows[rank]`` being ``src`` itself, is written after the last sync.
    """
    me = seg.rank
    offs = _agree(seg, alloc, offset)
    later: list[tuple[np.ndarray, np.ndarray]] = []
    for r in [me, *_others(seg)]:
        row = rows[r]
        if r == me and address(row) == address(src):
            continue  # in place
        part = src if r == me else alloc.part(r, src.dtype, offs[r], src.size)
        if np.may_share_memory(row, src):
            later.append((row, part.copy()))
        else:
            np.copyto(row, part)
    seg.sync()  # every peer has read this rank's src
    for row, part in later:
        np.copyto(row, part)


@interruptible
def reduce_scatter(
    seg: Segment, alloc: Allocation, src: np.ndarray, offset: int, out: np.ndarray, mpi_op: str, average: bool
) -> None:
    """Reduce row ``r`` of ``src`` (flat, ``n`` equal rows, at ``offset`` of its part) over the ranks into
    ``out`` on rank ``r``. Two syncs. ``out`` may be this rank's row of ``src`` (the peers never read it);
    where it overlaps another row it is computed aside and copied in after the last sync."""
    n, me = seg.size, seg.rank
    offs = _agree(seg, alloc, offset)
    c = out.size
    row = me * c * src.itemsize
    parts = [src[me * c : (me + 1) * c] if r == me else alloc.part(r, src.dtype, offs[r] + row, c) for r in range(n)]
    exact = address(out) == address(parts[me])
    aside = not exact and np.may_share_memory(out, src)
    dst = np.empty_like(out) if aside else out
    if c:
        _reduce(parts, dst, mpi_op)
        if average:
            scale_average(dst, n)
    seg.sync()  # every peer has read this rank's rows
    if aside:
        np.copyto(out, dst)
