"""Collective operations on arrays (torch.distributed's names and semantics).

One template for all: resolve the group -> check the arguments (O(1), before
any message moves) -> adapt the arrays -> dispatch to the group's engine for
the arrays' device -> return None, or a :class:`~hpcdist.work.Work` when
``async_op=True``.

SPMD contract, for every function here: every rank of ``group`` calls it, in
the same order as the group's other collectives, with arrays of the same
dtype and matching sizes (as each docstring says). A rank that skips a call or
calls another collective makes the others time out after the group's
timeout: with the default ``HPCDIST_WAIT=block`` the watchdog prints a
:class:`~hpcdist.errors.DistTimeoutError` message and ends the job; with
``HPCDIST_WAIT=poll`` they raise it. In block mode every rank also passes the
same ``async_op`` (a blocking call is the blocking MPI routine, an
``async_op=True`` one the non-blocking routine, and MPI does not match the
two); debug DETAIL mode checks it. A rank
that is not in ``group`` gets None back and nothing happens (torch's rule).
``src``/``dst`` are global ranks; ``group_src``/``group_dst`` ranks in the
group. Blocking calls return once this rank's part is done and the outputs
hold the result.
"""

from __future__ import annotations

import zlib
from datetime import timedelta
from itertools import pairwise
from typing import Any

import numpy as np

from .buffers.adapters import Buf, adapt, adapt_list, tensor_array
from .buffers.packing import own_block, pack, unpack, unpack_arrays
from .debug import DETAIL, check_collective, check_traffic
from .errors import DtypeMismatchError
from .flight import END, attach
from .group import ProcessGroup, group_rank, resolve_group
from .ops import CACHE as _OP_CACHE
from .ops import NUMBERS as _NUMBERS
from .ops import RedOpType, resolve_op, supports_complex
from .work import Work, completed_work, finish_orphans, pending_orphans

_ndarray = np.ndarray

__all__ = [
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_single",
    "all_reduce",
    "all_reduce_start",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "broadcast",
    "gather",
    "reduce",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "scatter",
]

SUM = RedOpType.SUM


def _engine(
    pg: ProcessGroup,
    buf: Buf,
    desc: str,
    root: int = -1,
    sized: bool = False,
    async_op: bool | None = None,
    count: int | None = None,
    check: bool = True,
) -> tuple[Any, list[Any] | None]:
    """The group's engine for ``buf``'s device and the call's flight-recorder entry (None when off).

    In debug DETAIL mode, first check that every rank calls ``desc`` with
    ``buf``'s dtype, the same ``root`` (a group rank), where every rank
    must pass the same shape (``sized``) ``buf``'s shape, and in block wait
    mode the same ``async_op`` (:func:`_async_part`); ``check=False``: the
    caller checked the whole call already.
    """
    fr = pg._flight
    entry = None if fr is None else fr.coll(desc, buf.dtype, buf.arr.size if count is None else count, root)
    if DETAIL[0] and check:
        parts = [str(buf.dtype)]
        if root >= 0:
            parts.append(f"root {root}")
        if sized:
            parts.append(f"shape {tuple(buf.shape)}")
        check_collective(pg, f"{desc}({', '.join(parts)}){_async_part(pg, async_op, desc, buf)}")
    return pg.engine(buf.device), entry


def _async_part(pg: ProcessGroup, async_op: bool | None, desc: str = "", buf: Any = None) -> str:
    """``" with async_op=True"`` for a DETAIL check of an async call in block wait mode, else ``""``.

    In ``HPCDIST_WAIT=block`` a blocking call is the blocking MPI routine and
    an ``async_op=True`` one the non-blocking routine, and MPI does not match
    the two: ranks that disagree hang until the timeout (docs/sharp-bits.md).
    Not where the group's engine for ``buf``'s device runs ``desc`` on
    ``buf`` the same way either way
    (:meth:`~hpcdist.backends.engine.Engine.async_meets_blocking`); only an
    engine that exists is asked (making one may be collective, and the
    check comes first), so on a device's first call the rule stands.
    """
    if not (async_op and pg._block):
        return ""
    eng = pg._engines.get(buf.device) if buf is not None else None
    if eng is not None and eng.async_meets_blocking(desc, buf.arr.nbytes):
        return ""
    return " with async_op=True"


def _done(work: Work | None, async_op: bool, entry: list[Any] | None) -> Work | None:
    """Wait for a blocking call (marking its flight entry completed), or hand back the async Work."""
    if async_op:
        if entry is not None and work is not None:
            attach(entry, work)
        return work
    if work is not None:
        work.wait()
    if entry is not None:
        entry[END] = True
    return None


def _same_kind(ref: Buf, others: list[Buf], argname: str, start: int = 0) -> None:
    """``others`` (``argname[start:]``) have ``ref``'s dtype and device; errors name the true index."""
    for i, b in enumerate(others, start):
        if b.dtype != ref.dtype:
            raise DtypeMismatchError(f"{argname}[{i}] has dtype {b.dtype}, expected {ref.dtype} (the input's dtype)")
        if b.device != ref.device or b.index != ref.index:
            raise ValueError(f"{argname}[{i}] is on another device than the input; put all arrays on one device")


def _same(a: Buf, b: Buf, aname: str, bname: str) -> None:
    if a.dtype != b.dtype:
        raise DtypeMismatchError(f"{aname} has dtype {a.dtype} but {bname} has dtype {b.dtype}; they must match")
    if a.device != b.device or a.index != b.index:
        raise ValueError(f"{aname} and {bname} are on different devices; put both on one device")


def _group_multiple(pg: ProcessGroup, big: Buf, big_name: str, small: Buf, small_name: str) -> None:
    """``big`` must hold group size x ``small``'s elements (the *_tensor collectives)."""
    want = small.arr.size * pg._size
    if big.arr.size != want:
        raise ValueError(
            f"{big_name} must have group size x {small_name} size = {pg._size} x {small.arr.size} = {want} "
            f"elements, got {big.arr.size}"
        )


def _list_len(lst: Any, n: int, argname: str) -> None:
    if not isinstance(lst, (list, tuple)):
        raise TypeError(f"{argname} must be a list of {n} arrays (one per rank of the group), got {type(lst).__name__}")
    if len(lst) != n:
        raise ValueError(f"{argname} must hold one array per rank of the group ({n}), got {len(lst)}")


def _per_rank(
    pg: ProcessGroup, lst: Any, argname: str, write: bool, ref: Buf, refname: str, slot: int | None = None
) -> list[Buf]:
    """A list argument with one array per group rank, of ``ref``'s dtype and device, whose entry ``slot``
    (default: this rank's) has ``ref``'s size."""
    _list_len(lst, pg._size, argname)
    bufs = adapt_list(lst, argname, write)
    _same_kind(ref, bufs, argname)
    k = pg._rank if slot is None else slot
    if bufs[k].arr.size != ref.arr.size:
        raise ValueError(
            f"{argname}[{k}] has {bufs[k].arr.size} elements but {refname} has {ref.arr.size}; they must match"
        )
    return bufs


# ------------------------------------------------------------------ broadcast / reductions


def broadcast(
    tensor: Any, src: int | None = None, group: Any = None, async_op: bool = False, group_src: int | None = None
) -> Work | None:
    """Copy ``tensor`` of rank ``src`` into ``tensor`` on every rank of the group.

    Every rank passes an array of the same dtype and size.

    Args:
        tensor: the data to send on ``src``; elsewhere the array that receives it (written in place).
        src: the source, a global rank; give ``src`` or ``group_src``, not both.
        group: the process group (None: the default group); a non-member returns None at once.
        async_op: return a :class:`~hpcdist.work.Work` to wait on instead of blocking.
        group_src: the source as a rank of ``group``.

    Returns:
        A :class:`~hpcdist.work.Work` with ``async_op=True``; else None (also on a non-member).
    """
    pg = resolve_group(group, "broadcast")
    if pg is None:
        return None
    root = group_rank(pg, src, group_src, "src")
    plain = not async_op and not DETAIL[0]
    if plain:  # a lane (see all_reduce): C-contiguous, aligned and writable (flags.carray), below its bound
        arr = tensor if type(tensor) is _ndarray else tensor_array(tensor)
        if arr is not None:
            lane = pg._bcast_lanes.get(id(arr.dtype))
            if lane is not None and arr.nbytes < lane[2] and arr.flags.carray:
                fr = pg._flight
                entry = None if fr is None else fr.coll("broadcast", lane[1], arr.size, root)
                lane[3](arr, root)
                if entry is not None:
                    entry[END] = True
                return None
    buf = adapt(tensor, "tensor", pg._rank != root)
    eng, entry = _engine(pg, buf, "broadcast", root, sized=True, async_op=async_op)
    work = _done(eng.broadcast(buf, root, sync=not async_op), async_op, entry)
    if plain:
        _learn(pg._bcast_lanes, buf, lambda: eng.host_lane("broadcast", buf.arr.dtype))
    return work


def all_reduce(tensor: Any, op: Any = SUM, group: Any = None, async_op: bool = False) -> Work | None:
    """Reduce ``tensor`` over the group in place: every rank ends with the result.

    Every rank passes an array of the same dtype and size. float16/bfloat16
    are reduced in float32 and rounded once. A torch sparse COO tensor is
    summed as gloo does (``ReduceOp.SUM`` only; the coalesced sum in place).

    Args:
        tensor: the input and output of the reduction (written in place on every rank).
        op: a :class:`~hpcdist.ops.ReduceOp` (default SUM), or ``ReduceOp.PREMUL_SUM(factor)``.
        group: the process group (None: the default group); a non-member returns None at once.
        async_op: return a :class:`~hpcdist.work.Work` to wait on instead of blocking.

    Returns:
        A :class:`~hpcdist.work.Work` with ``async_op=True``; else None (also on a non-member).
    """
    pg = resolve_group(group, "all_reduce")
    if pg is None:
        return None
    if op is not SUM and isinstance(op, _NUMBERS) and type(op) is not RedOpType:
        resolve_op(op, "float64")  # raises: a number hashes like a ReduceOp (True == AVG) in the lookups below
    lane = None
    if not async_op and not DETAIL[0]:
        arr = tensor if type(tensor) is _ndarray else tensor_array(tensor)
        if arr is not None:
            lane = (pg._sum_lanes if op is SUM else _op_lanes(pg._lanes, op)).get(id(arr.dtype))
            # a lane: this dtype and op passed every check before, and the engine runs such calls in one step;
            # the array must be small enough, C-contiguous, aligned and writable (flags.carray)
            if lane is not None and arr.nbytes < lane[2] and arr.flags.carray:
                fr = pg._flight
                entry = None if fr is None else fr.coll("all_reduce", lane[1], arr.size, -1)
                lane[3](arr)
                if entry is not None:
                    entry[END] = True
                return None
    try:
        buf = adapt(tensor, "tensor", True)
    except TypeError:
        if getattr(tensor, "is_sparse", False) is True:  # a sparse COO tensor: summed as gloo does
            return _all_reduce_sparse(tensor, op, pg, async_op)
        raise
    dtype = buf.dtype
    try:
        rop = _OP_CACHE.get((op, dtype)) or resolve_op(op, dtype)
    except TypeError:  # an unhashable op
        rop = resolve_op(op, dtype)
    entry = _all_reduce_entry(pg, buf, rop, async_op)
    eng = pg._engines.get(buf.device) or pg.engine(buf.device)
    work = eng.all_reduce(buf, rop, not async_op)
    if work is None:  # a blocking call that completed
        if entry is not None:
            entry[END] = True
        if lane is None and rop.premul is None and not DETAIL[0]:
            _learn(pg._lanes.setdefault(op, {}), buf, lambda: eng.host_all_reduce_lane(dtype, rop))
        return None
    if async_op:
        if entry is not None:
            attach(entry, work)
        return work
    work.wait()
    if entry is not None:
        entry[END] = True
    return None


def _all_reduce_sparse(tensor: Any, op: Any, pg: ProcessGroup, async_op: bool) -> Work | None:
    """A torch sparse COO tensor: every rank's entries summed into it, as gloo does (SUM only; blocking, an
    ``async_op`` call gets a completed Work). :func:`hpcdist.torch.sparse.all_reduce_sparse`."""
    from .torch.sparse import all_reduce_sparse

    all_reduce_sparse([tensor], op, pg, "all_reduce")
    return completed_work(("all_reduce", pg), [tensor]) if async_op else None


def _all_reduce_entry(pg: ProcessGroup, buf: Buf, rop: Any, async_op: bool) -> list[Any] | None:
    """The flight recorder's entry of an all_reduce of ``buf`` (None when off), after its DETAIL check."""
    fr = pg._flight
    entry = None if fr is None else fr.coll("all_reduce", buf.dtype, buf.arr.size, -1)
    if DETAIL[0]:
        check_collective(
            pg,
            f"all_reduce({buf.dtype}, {rop.kind.name}, shape {tuple(buf.shape)})"
            f"{_async_part(pg, async_op, 'all_reduce', buf)}",
        )
    return entry


def all_reduce_start(pg: ProcessGroup, eng: Any, buf: Buf, rop: Any) -> Work:
    """Start an asynchronous all_reduce of ``buf`` on ``eng``, recorded and (DETAIL) checked as :func:`all_reduce`.

    For a caller that picks the engine itself: the torch backend's
    asynchronous all-reduces of CPU tensors take the MPI engine's
    non-blocking path whatever ``pg``'s engine is. Collective, like
    ``all_reduce(..., async_op=True)``, with which it matches on every rank.
    """
    entry = _all_reduce_entry(pg, buf, rop, True)
    work = eng.all_reduce(buf, rop, False)
    if entry is not None:
        attach(entry, work)
    return work


#: no lane for this op yet
_NO_LANES: dict[int, Any] = {}


def _op_lanes(by_op: dict[Any, dict[int, Any]], op: Any) -> dict[int, Any]:
    """``op``'s lanes in ``by_op`` (a group's all_reduce or reduce_scatter_tensor lanes; none learned: empty).

    An op that is a plain number (which hashes like a ReduceOp: True == AVG) or unhashable gets resolve_op's
    error here, as the general path would give it.
    """
    if isinstance(op, _NUMBERS) and type(op) is not RedOpType:
        resolve_op(op, "float64")  # raises
    try:
        return by_op.get(op, _NO_LANES)
    except TypeError:  # unhashable: resolve_op says what is wrong with it
        resolve_op(op, "float64")
        return _NO_LANES


def _learn(lanes: dict[int, Any], buf: Buf, make: Any) -> None:
    """Keep the engine's lane (``make()``: ``(max_bytes, run)`` or None) for blocking calls on host arrays of
    ``buf``'s dtype in ``lanes`` (a group's lanes of one operation, or of all_reduce with one op), once.

    Asked after a blocking call that took the general path: its checks (the
    array kind, the dtype, the op for the dtype) passed, so later calls on
    NumPy arrays (or views of CPU tensors) of this dtype need only the
    per-array checks (flags, sizes, the size bound) before the lane moves
    them. Only a ``buf`` that is a NumPy array the call used in place, of the
    dtype it names (not a copy, not bfloat16 moved as uint16), teaches a
    lane. No lane: one of 0 bytes, never taken, so the engine is not asked again.
    """
    arr = buf.arr
    if type(arr) is not _ndarray or buf.writeback is not None:
        return
    np_dtype = arr.dtype
    if id(np_dtype) in lanes or len(lanes) >= 64 or np_dtype.name != buf.dtype:  # (a program can make new dtypes)
        return
    got = make() or (0, None)
    lanes[id(np_dtype)] = (np_dtype, buf.dtype, got[0], got[1])  # holds the dtype: its id is not reused


def reduce(
    tensor: Any,
    dst: int | None = None,
    op: Any = SUM,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Work | None:
    """Reduce ``tensor`` over the group into ``tensor`` on rank ``dst`` (others' are left as they were).

    Every rank passes an array of the same dtype and size.

    Args:
        tensor: this rank's input; on ``dst`` also the output (written in place).
        dst: the destination, a global rank; give ``dst`` or ``group_dst``, not both.
        op: a :class:`~hpcdist.ops.ReduceOp` (default SUM), or ``ReduceOp.PREMUL_SUM(factor)``.
        group: the process group (None: the default group); a non-member returns None at once.
        async_op: return a :class:`~hpcdist.work.Work` to wait on instead of blocking.
        group_dst: the destination as a rank of ``group``.

    Returns:
        A :class:`~hpcdist.work.Work` with ``async_op=True``; else None (also on a non-member).
    """
    pg = resolve_group(group, "reduce")
    if pg is None:
        return None
    root = group_rank(pg, dst, group_dst, "dst")
    mine = pg._rank == root
    plain = not async_op and not DETAIL[0]
    if plain:  # a lane (see all_reduce); the array writable on every rank (flags.carray), as the lane learned it
        arr = tensor if type(tensor) is _ndarray else tensor_array(tensor)
        if arr is not None:
            lane = (pg._reduce_sum_lanes if op is SUM else _op_lanes(pg._reduce_lanes, op)).get(id(arr.dtype))
            if lane is not None and arr.nbytes < lane[2] and arr.flags.carray:
                fr = pg._flight
                entry = None if fr is None else fr.coll("reduce", lane[1], arr.size, root)
                lane[3](arr, root, mine)
                if entry is not None:
                    entry[END] = True
                return None
    buf = adapt(tensor, "tensor", mine)
    rop = resolve_op(op, buf.dtype)
    eng, entry = _engine(pg, buf, "reduce", root, sized=True, async_op=async_op)
    work = _done(eng.reduce(buf, root, rop, sync=not async_op), async_op, entry)
    if plain and rop.direct:
        _learn(pg._reduce_lanes.setdefault(op, {}), buf, lambda: eng.host_lane("reduce", buf.arr.dtype, rop))
    return work


def all_reduce_coalesced(tensors: list[Any], op: Any = SUM, group: Any = None, async_op: bool = False) -> Work | None:
    """All-reduce several arrays of one dtype in one MPI call (packed, then unpacked).

    Every rank passes the same number of arrays, with the same dtypes and
    sizes in the same order. Complex arrays may join a list of their real
    element type when ``op`` acts elementwise (SUM, AVG, PREMUL_SUM), as torch.

    Args:
        tensors: the arrays to reduce, each in place; at least one.
        op: a :class:`~hpcdist.ops.ReduceOp` (default SUM), or ``ReduceOp.PREMUL_SUM(factor)``.
        group: the process group (None: the default group); a non-member returns None at once.
        async_op: return a :class:`~hpcdist.work.Work` to wait on instead of blocking.

    Returns:
        A :class:`~hpcdist.work.Work` with ``async_op=True``; else None (also on a non-member).
    """
    return reduce_list(tensors, op, group, async_op, "all_reduce_coalesced")


def reduce_list(tensors: list[Any], op: Any, group: Any, async_op: bool, name: str) -> Work | None:
    """:func:`all_reduce_coalesced`, named ``name`` in DETAIL checks and the flight recorder (the buckets of
    ``all_reduce_bucketed`` are ``all_reduce_bucketed``, whichever path their arrays take)."""
    pg = resolve_group(group, name)
    if pg is None:
        return None
    bufs = adapt_list(tensors, "tensors", True)
    if not bufs:
        raise ValueError("tensors must hold at least one array")
    shapes = [b.shape for b in bufs] if DETAIL[0] else None  # as given (a complex array: before its real view)
    bufs = _complex_as_real(bufs, op)
    _same_kind(bufs[0], bufs[1:], "tensors", start=1)
    rop = resolve_op(op, bufs[0].dtype, "op")
    host = bufs[0].device == "cpu"
    if shapes is not None:  # one check for the whole call, whichever path it takes
        if host:
            refuse_overlap([b.arr for b in bufs])
        desc = coalesced_desc(name, bufs[0].dtype, rop, shapes, sum(b.size for b in bufs))
        check_collective(pg, desc + _async_part(pg, async_op and host))
    if not host:
        parts = _parts(pg, [(b, (b, rop)) for b in bufs], "all_reduce", name, check=False)
        return _done(parts, async_op, None)
    if not async_op:  # blocking: the engine reduces the arrays where they lie if it can (shared memory)
        arrays = [b.arr.reshape(-1) for b in bufs]
        nbytes = sum(a.nbytes for a in arrays)
        first = Buf(arrays[0], tensors, bufs[0].dtype)
        count = nbytes // arrays[0].itemsize
        eng, entry = _engine(pg, first, name, async_op=False, count=count, check=False)
        eng.host_all_reduce_many(arrays, bufs[0].dtype, rop, nbytes)
        for b in bufs:
            if b.writeback is not None:
                b.writeback()
        return _done(None, False, entry)
    flat = pack(bufs, bufs[0].arr.dtype)
    packed = Buf(flat, tensors, bufs[0].dtype, "cpu", lambda: unpack(flat, bufs))
    eng, entry = _engine(pg, packed, name, async_op=async_op, check=False)
    return _done(eng.all_reduce(packed, rop, sync=not async_op), async_op, entry)


def refuse_overlap(arrays: list[Any]) -> None:
    """ValueError naming two of ``arrays`` (flat, C-contiguous) that share memory. The shared-memory reduction of a
    list copies results back chunk by chunk while it still reads later chunks, so memory listed twice would be
    read after its result was written (reduced twice). Checked in DETAIL mode only (by all_reduce_coalesced and
    all_reduce_bucketed, before any message): it costs microseconds an array.
    """
    spans = sorted((a.__array_interface__["data"][0], a.nbytes, i) for i, a in enumerate(arrays) if a.nbytes)
    for (start, size, i), (nxt, _, j) in pairwise(spans):
        if nxt < start + size:
            i, j = min(i, j), max(i, j)
            raise ValueError(
                f"tensors[{i}] and tensors[{j}] share memory: the arrays of one coalesced or bucketed all_reduce must "
                "be distinct (an array listed twice, or overlapping views, would be reduced twice); pass each once"
            )


#: above this many arrays a DETAIL description names their shapes by a checksum instead of listing them
_LISTED_SHAPES = 8


def coalesced_desc(name: str, dtype: str, rop: Any, shapes: list[tuple[int, ...]], count: int) -> str:
    """The DETAIL description of ``name``, one reduction of several arrays as one: dtype, op, how many
    arrays, their items in all and their shapes (listed, or a CRC-32 of their repr beyond
    :data:`_LISTED_SHAPES`), so that ranks whose lists differ in any size, or only in how the same
    items are split between the arrays, are caught before any message moves."""
    listed = repr(shapes) if len(shapes) <= _LISTED_SHAPES else f"crc32 {zlib.crc32(repr(shapes).encode()):08x}"
    return f"{name}({dtype}, {rop.kind.name}, {len(shapes)} arrays, {count} items, shapes {listed})"


def _parts(pg: ProcessGroup, calls: list[tuple[Buf, tuple]], method: str, name: str, check: bool = True) -> Work:
    """Start ``engine.method(*args)`` for each ``(buf, args)`` (one flight entry each); one Work over all.

    ``check=False``: the caller made the call's DETAIL check (else each part is checked as ``method``).
    """
    works = []
    for buf, args in calls:
        eng, entry = _engine(pg, buf, method, check=check)
        work = getattr(eng, method)(*args, sync=False)
        if entry is not None:
            attach(entry, work)
        works.append(work)
    return combine(works, name, pg)


_REAL_OF = {"complex64": "float32", "complex128": "float64"}


def _complex_as_real(bufs: list[Buf], op: Any) -> list[Buf]:
    """As torch: a complex array joins a list of its element type viewed as (real, imag) pairs.

    Only where the list mixes complex arrays with real ones of their element
    type and the op acts elementwise on the pairs (SUM, AVG, PREMUL_SUM).
    """
    kinds = {_REAL_OF.get(b.dtype, b.dtype) for b in bufs}
    if len(kinds) != 1 or all(b.dtype not in _REAL_OF for b in bufs) or all(b.dtype in _REAL_OF for b in bufs):
        return bufs
    if not supports_complex(op):
        raise ValueError(f"all_reduce_coalesced: op {op!r} is not defined for the complex arrays in tensors")
    real = kinds.pop()
    out = []
    for b in bufs:
        if b.dtype in _REAL_OF:
            wb = b.writeback
            b = Buf(b.arr.view(b.arr.real.dtype), b.obj, real, b.device, wb, b.index)
        out.append(b)
    return out


def combine(works: list[Any], name: str, pg: ProcessGroup, result: Any = None) -> Work:
    """One Work over several of ``pg``'s (:meth:`Work.combine`): completes when all did, finishing each in order.

    ``result``: the combined Work's result (None: the list of the parts' results)."""
    return Work.combine(works, (name, pg), pg._timeout_s, result)


# ------------------------------------------------------------------ gathers


def all_gather(tensor_list: list[Any], tensor: Any, group: Any = None, async_op: bool = False) -> Work | None:
    """Gather ``tensor`` of every rank into ``tensor_list[r]`` on every rank.

    ``tensor_list`` holds one array per group rank; its entry ``r`` must have
    the size of rank ``r``'s ``tensor`` (sizes may differ between ranks).

    Args:
        tensor_list: the outputs, one array per group rank, of ``tensor``'s dtype.
        tensor: this rank's input.
        group: the process group (None: the default group); a non-member returns None at once.
        async_op: return a :class:`~hpcdist.work.Work` to wait on instead of blocking.

    Returns:
        A :class:`~hpcdist.work.Work` with ``async_op=True``; else None (also on a non-member).
    """
    pg = resolve_group(group, "all_gather")
    if pg is None:
        return None
    plain = not async_op and not DETAIL[0]
    if plain:  # a lane (see all_gather_into_tensor), gathering into a new array copied out to the list
        arr = tensor if type(tensor) is _ndarray else tensor_array(tensor)
        if arr is not None and _list_lane(pg, pg._ag_list_lanes.get(id(arr.dtype)), tensor_list, arr):
            return None
    inp = adapt(tensor, "tensor", False)
    outs = _per_rank(pg, tensor_list, "tensor_list", True, inp, "tensor")
    eng, entry = _engine(pg, inp, "all_gather", async_op=async_op)
    if DETAIL[0]:
        check_traffic(pg, "all_gather", [inp.arr.size] * pg._size, [b.arr.size for b in outs])
    work = _done(eng.all_gather(outs, inp, sync=not async_op), async_op, entry)
    if plain:
        _learn(pg._ag_list_lanes, inp, lambda: eng.host_lane("all_gather", inp.arr.dtype))
    return work


def _list_lane(pg: ProcessGroup, lane: Any, tensor_list: Any, inp: np.ndarray) -> bool:
    """Run a list all_gather's ``lane`` (None: not learned) on ``inp`` into a new array, then copy rank ``r``'s
    part into ``tensor_list[r]``, as the general path does (so outputs may overlap each other and the input);
    False: the general path's call.

    The checks: a list of group-size NumPy arrays or plain CPU tensors, each of ``inp``'s dtype object and size,
    writable, C-contiguous and aligned (flags.carray); ``inp`` C-contiguous; group size x ``inp`` below the
    lane's bound.
    """
    n, size = pg._size, inp.size
    if lane is None or inp.nbytes * n >= lane[2] or not inp.flags.c_contiguous:
        return False
    outs = _list_arrays(tensor_list, inp, n, True)
    if outs is None:
        return False
    flat = np.empty(n * size, inp.dtype)
    _lane_call(pg, lane, "all_gather", size, -1, flat, inp)
    unpack_arrays(flat, outs)
    return True


def _list_arrays(lst: Any, ref: np.ndarray, n: int, write: bool) -> list[np.ndarray] | None:
    """NumPy arrays of the ``n`` entries of a list collective's list ``lst`` for a lane (plain NumPy arrays, or
    views of plain CPU tensors), each of ``ref``'s dtype object and size, C-contiguous, and writable and aligned
    when ``write`` (flags.carray); else None: the general path's call, which accepts the list or raises."""
    if type(lst) is not list or len(lst) != n:
        return None
    size, dtype = ref.size, ref.dtype
    arrays = []
    for t in lst:
        a = t if type(t) is _ndarray else tensor_array(t)
        if (
            a is None
            or a.dtype is not dtype
            or a.size != size
            or not (a.flags.carray if write else a.flags.c_contiguous)
        ):
            return None
        arrays.append(a)
    return arrays


#: (size, group size, skipped part) -> MPI's counts and displacements of equal parts (lanes repeat their sizes)
_EVEN: dict[tuple[int, int, int], tuple[list[int], list[int]]] = {}


def _even(size: int, n: int, skip: int = -1) -> tuple[list[int], list[int]]:
    """MPI's counts and displacements of ``n`` parts of ``size`` elements; part ``skip``'s count 0 (an all-to-all's
    own block, copied outside MPI), -1: none skipped. For the lanes of Gatherv, Scatterv and Alltoallv."""
    key = (size, n, skip)
    got = _EVEN.get(key)
    if got is None:
        if len(_EVEN) >= 256:
            _EVEN.clear()
        got = _EVEN[key] = ([0 if r == skip else size for r in range(n)], [size * r for r in range(n)])
    return got


def all_gather_into_tensor(
    output_tensor: Any, input_tensor: Any, group: Any = None, async_op: bool = False
) -> Work | None:
    """Gather every rank's ``input_tensor`` into ``output_tensor`` (group size x its size), in rank order.

    Every rank passes inputs of the same dtype and size.

    Args:
        output_tensor: the output, group size x ``input_tensor``'s elements; rank ``r``'s input lands in chunk ``r``.
        input_tensor: this rank's input (it may be this rank's chunk of ``output_tensor``).
        group: the process group (None: the default group); a non-member returns None at once.
        async_op: return a :class:`~hpcdist.work.Work` to wait on instead of blocking.

    Returns:
        A :class:`~hpcdist.work.Work` with ``async_op=True``; else None (also on a non-member).
    """
    pg = resolve_group(group, "all_gather_into_tensor")
    if pg is None:
        return None
    plain = not async_op and not DETAIL[0]
    pair = _apart_arrays(output_tensor, input_tensor) if plain else None
    if pair is not None:
        out_arr, in_arr = pair  # a lane (see all_reduce), of the output's dtype
        lane = pg._gather_lanes.get(id(out_arr.dtype))
        if _pair_lane(pg, lane, out_arr, in_arr, out_arr, in_arr, "all_gather_into"):
            return None
    inp = adapt(input_tensor, "input_tensor", False)
    out = adapt(output_tensor, "output_tensor", True)
    _same(out, inp, "output_tensor", "input_tensor")
    _group_multiple(pg, out, "output_tensor", inp, "input")
    eng, entry = _engine(pg, inp, "all_gather_into", sized=True, async_op=async_op)
    work = _done(eng.all_gather_into(out, inp, sync=not async_op), async_op, entry)
    if plain:
        _learn(pg._gather_lanes, out, lambda: eng.host_lane("all_gather_into_tensor", out.arr.dtype))
    return work


def _pair_lane(pg: ProcessGroup, lane: Any, out: np.ndarray, inp: np.ndarray, big: Any, small: Any, desc: str) -> bool:
    """Run ``lane`` (None: not learned) on an all-gather's or reduce-scatter's ``out`` and ``inp`` (which share no
    memory: :func:`_apart_arrays`) if they pass its checks, recorded as ``desc``; False: the general path's call.

    The checks: one dtype object; ``big`` (the output of an all-gather, the input of a reduce-scatter) group
    size x ``small`` and below the lane's bound; the output writable, C-contiguous and aligned (flags.carray),
    the input C-contiguous.
    """
    if (
        lane is None
        or inp.dtype is not out.dtype
        or big.nbytes >= lane[2]
        or big.size != small.size * pg._size
        or not out.flags.carray
        or not inp.flags.c_contiguous
    ):
        return False
    fr = pg._flight
    entry = None if fr is None else fr.coll(desc, lane[1], small.size, -1)
    lane[3](out, inp)
    if entry is not None:
        entry[END] = True
    return True


def _apart_arrays(output_tensor: Any, input_tensor: Any) -> tuple[np.ndarray, np.ndarray] | None:
    """NumPy arrays of an all-gather's or reduce-scatter's output and input that share no memory (a lane's case),
    else None: two plain NumPy arrays that own their memory (two such cannot share a byte; views may, and
    the in-place form is one), or views of two plain CPU tensors whose byte ranges do not meet."""
    if type(output_tensor) is _ndarray and type(input_tensor) is _ndarray:
        if output_tensor is input_tensor or not (output_tensor.flags.owndata and input_tensor.flags.owndata):
            return None
        return output_tensor, input_tensor
    out, inp = tensor_array(output_tensor), tensor_array(input_tensor)
    if out is None or inp is None:
        return None
    po, pi = output_tensor.data_ptr(), input_tensor.data_ptr()
    return None if po < pi + inp.nbytes and pi < po + out.nbytes else (out, inp)


def all_gather_single(output_tensor: Any, input_tensor: Any, group: Any = None, async_op: bool = False) -> Work | None:
    """Same as :func:`all_gather_into_tensor` (torch 2.13's newer name)."""
    return all_gather_into_tensor(output_tensor, input_tensor, group, async_op)


def all_gather_coalesced(
    output_tensor_lists: list[list[Any]], input_tensor_list: list[Any], group: Any = None, async_op: bool = False
) -> Work | None:
    """:func:`all_gather` of each ``input_tensor_list[i]``, all at once, into ``output_tensor_lists[r][i]``.

    As torch documents: ``output_tensor_lists`` holds one list per group rank
    ``r``, each with one array per input, where rank ``r``'s
    ``input_tensor_list[i]`` lands.

    Args:
        output_tensor_lists: one list per group rank, each with one output array per input.
        input_tensor_list: this rank's inputs; every rank passes as many.
        group: the process group (None: the default group); a non-member returns None at once.
        async_op: return a :class:`~hpcdist.work.Work` to wait on instead of blocking.

    Returns:
        A :class:`~hpcdist.work.Work` with ``async_op=True``; else None (also on a non-member).
    """
    pg = resolve_group(group, "all_gather_coalesced")
    if pg is None:
        return None
    if not isinstance(output_tensor_lists, (list, tuple)) or not isinstance(input_tensor_list, (list, tuple)):
        raise TypeError("output_tensor_lists must be a list of lists and input_tensor_list a list of arrays")
    _list_len(output_tensor_lists, pg._size, "output_tensor_lists")
    k = len(input_tensor_list)
    for r, outl in enumerate(output_tensor_lists):
        if not isinstance(outl, (list, tuple)) or len(outl) != k:
            got = len(outl) if isinstance(outl, (list, tuple)) else type(outl).__name__
            raise ValueError(
                f"output_tensor_lists[{r}] must hold one array per entry of input_tensor_list ({k}), got {got}"
            )
    checked = []
    for i, inp_obj in enumerate(input_tensor_list):
        inp = adapt(inp_obj, f"input_tensor_list[{i}]", False)
        column = [outl[i] for outl in output_tensor_lists]  # rank r's input i lands in output_tensor_lists[r][i]
        outs = _per_rank(pg, column, f"output_tensor_lists[*][{i}]", True, inp, f"input_tensor_list[{i}]")
        checked.append((outs, inp))
    if DETAIL[0]:  # the whole call at once: a part checked alone would leave a rank with fewer parts waiting
        check_collective(pg, f"all_gather_coalesced({', '.join(str(inp.dtype) for _, inp in checked)})")
        if checked:
            sends = [[inp.arr.size for _, inp in checked]] * pg._size
            check_traffic(
                pg, "all_gather_coalesced", sends, [[o[r].arr.size for o, _ in checked] for r in range(pg._size)]
            )
    calls = [(inp, (outs, inp)) for outs, inp in checked]
    return _done(_parts(pg, calls, "all_gather", "all_gather_coalesced", check=False), async_op, None)


def _at(pg: ProcessGroup, root: int, size: int) -> list[int]:
    """Items to or from each group rank when only ``root`` takes part (DETAIL size checks)."""
    return [size if r == root else 0 for r in range(pg._size)]


def _sizes(pg: ProcessGroup, bufs: list[Buf] | None) -> list[int]:
    """The size of each array of a root's list; zeros on the other ranks (DETAIL size checks)."""
    return [0] * pg._size if bufs is None else [b.arr.size for b in bufs]


def _root_list(
    pg: ProcessGroup, root: int, lst: Any, argname: str, ref: Buf, write: bool, role: str
) -> list[Buf] | None:
    """The per-rank list of gather/scatter: required on the root, None or empty elsewhere."""
    if pg._rank != root:
        if lst:
            raise ValueError(f"{argname} must be None or empty on ranks other than the {role}")
        return None
    if lst is None:
        raise ValueError(f"{argname} is required on the {role} rank (one array per rank of the group)")
    return _per_rank(pg, lst, argname, write, ref, "tensor", slot=root)


def gather(
    tensor: Any,
    gather_list: list[Any] | None = None,
    dst: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_dst: int | None = None,
) -> Work | None:
    """Gather every rank's ``tensor`` into ``gather_list`` on rank ``dst``.

    ``gather_list`` (one array per group rank, entry ``r`` of rank ``r``'s
    size) is required on ``dst`` and must be None or empty elsewhere.

    Args:
        tensor: this rank's input.
        gather_list: on ``dst``, the outputs, one array per group rank; None or empty elsewhere.
        dst: the destination, a global rank (default: global rank 0); or give ``group_dst``.
        group: the process group (None: the default group); a non-member returns None at once.
        async_op: return a :class:`~hpcdist.work.Work` to wait on instead of blocking.
        group_dst: the destination as a rank of ``group``.

    Returns:
        A :class:`~hpcdist.work.Work` with ``async_op=True``; else None (also on a non-member).
    """
    pg = resolve_group(group, "gather")
    if pg is None:
        return None
    root = group_rank(pg, 0 if dst is None and group_dst is None else dst, group_dst, "dst")
    plain = not async_op and not DETAIL[0]
    if plain:  # a lane (see all_gather's): MPI's Gatherv, as the general path's, with equal parts
        arr = tensor if type(tensor) is _ndarray else tensor_array(tensor)
        if arr is not None and _gather_lane(pg, pg._gather_root_lanes.get(id(arr.dtype)), gather_list, arr, root):
            return None
    inp = adapt(tensor, "tensor", False)
    outs = _root_list(pg, root, gather_list, "gather_list", inp, True, "destination")
    eng, entry = _engine(pg, inp, "gather", root, async_op=async_op)
    if DETAIL[0]:
        check_traffic(pg, "gather", _at(pg, root, inp.arr.size), _sizes(pg, outs))
    work = _done(eng.gather(inp, outs, root, sync=not async_op), async_op, entry)
    if plain:
        _learn(pg._gather_root_lanes, inp, lambda: eng.host_lane("gather", inp.arr.dtype))
    return work


def _gather_lane(pg: ProcessGroup, lane: Any, gather_list: Any, inp: np.ndarray, root: int) -> bool:
    """Run a gather's ``lane`` (None: not learned) on ``inp``; on ``root`` into a new array, then copied into
    ``gather_list`` as the general path does. False: the general path's call.

    The checks: ``inp`` C-contiguous, group size x ``inp`` below the lane's bound; on the root a list of
    equal parts (:func:`_list_arrays`, written), elsewhere no list. Every rank runs MPI's Gatherv either way.
    """
    n, size = pg._size, inp.size
    if lane is None or inp.nbytes * n >= lane[2] or not inp.flags.c_contiguous:
        return False
    outs = flat = counts = None
    if pg._rank == root:
        outs = _list_arrays(gather_list, inp, n, True)
        if outs is None:
            return False
        flat, counts = np.empty(n * size, inp.dtype), _even(size, n)
    elif gather_list:  # the general path's error
        return False
    _lane_call(pg, lane, "gather", size, root, inp, flat, counts, root)
    if outs is not None and flat is not None:  # (the root)
        unpack_arrays(flat, outs)
    return True


def scatter(
    tensor: Any,
    scatter_list: list[Any] | None = None,
    src: int | None = None,
    group: Any = None,
    async_op: bool = False,
    group_src: int | None = None,
) -> Work | None:
    """Rank ``src`` sends ``scatter_list[r]`` to rank ``r``, which receives it into ``tensor``.

    ``scatter_list`` is required on ``src`` (entry ``r`` of rank ``r``'s
    ``tensor`` size) and must be None or empty elsewhere.

    Args:
        tensor: the output of this rank (written in place).
        scatter_list: on ``src``, the inputs, one array per group rank; None or empty elsewhere.
        src: the source, a global rank (default: global rank 0); or give ``group_src``.
        group: the process group (None: the default group); a non-member returns None at once.
        async_op: return a :class:`~hpcdist.work.Work` to wait on instead of blocking.
        group_src: the source as a rank of ``group``.

    Returns:
        A :class:`~hpcdist.work.Work` with ``async_op=True``; else None (also on a non-member).
    """
    pg = resolve_group(group, "scatter")
    if pg is None:
        return None
    root = group_rank(pg, 0 if src is None and group_src is None else src, group_src, "src")
    plain = not async_op and not DETAIL[0]
    if plain:  # a lane (see gather's): MPI's Scatterv, as the general path's, with equal parts
        arr = tensor if type(tensor) is _ndarray else tensor_array(tensor)
        if arr is not None and _scatter_lane(pg, pg._scatter_lanes.get(id(arr.dtype)), scatter_list, arr, root):
            return None
    out = adapt(tensor, "tensor", True)
    ins = _root_list(pg, root, scatter_list, "scatter_list", out, False, "source")
    eng, entry = _engine(pg, out, "scatter", root, async_op=async_op)
    if DETAIL[0]:
        check_traffic(pg, "scatter", _sizes(pg, ins), _at(pg, root, out.arr.size))
    work = _done(eng.scatter(out, ins, root, sync=not async_op), async_op, entry)
    if plain:
        _learn(pg._scatter_lanes, out, lambda: eng.host_lane("scatter", out.arr.dtype))
    return work


def _scatter_lane(pg: ProcessGroup, lane: Any, scatter_list: Any, out: np.ndarray, root: int) -> bool:
    """Run a scatter's ``lane`` (None: not learned) into ``out``; on ``root`` from ``scatter_list`` packed into a
    new array, as the general path does. False: the general path's call.

    The checks: ``out`` writable, C-contiguous and aligned (flags.carray), group size x ``out`` below the lane's
    bound; on the root a list of equal parts (:func:`_list_arrays`, read), elsewhere no list.
    """
    n, size = pg._size, out.size
    if lane is None or out.nbytes * n >= lane[2] or not out.flags.carray:
        return False
    flat = counts = None
    if pg._rank == root:
        ins = _list_arrays(scatter_list, out, n, False)
        if ins is None:
            return False
        flat, counts = np.concatenate([a.reshape(-1) for a in ins]), _even(size, n)
    elif scatter_list:  # the general path's error
        return False
    _lane_call(pg, lane, "scatter", size, root, out, flat, counts, root)
    return True


# ------------------------------------------------------------------ reduce-scatter


def reduce_scatter(
    output: Any, input_list: list[Any], op: Any = SUM, group: Any = None, async_op: bool = False
) -> Work | None:
    """Reduce ``input_list[r]`` over the group into ``output`` on rank ``r``.

    Every rank passes one input per group rank; entry ``r`` has rank ``r``'s
    ``output`` size, the same on every rank.

    Args:
        output: this rank's output (written in place).
        input_list: one input per group rank, of ``output``'s dtype.
        op: a :class:`~hpcdist.ops.ReduceOp` (default SUM), or ``ReduceOp.PREMUL_SUM(factor)``.
        group: the process group (None: the default group); a non-member returns None at once.
        async_op: return a :class:`~hpcdist.work.Work` to wait on instead of blocking.

    Returns:
        A :class:`~hpcdist.work.Work` with ``async_op=True``; else None (also on a non-member).
    """
    pg = resolve_group(group, "reduce_scatter")
    if pg is None:
        return None
    out = adapt(output, "output", True)
    ins = _per_rank(pg, input_list, "input_list", False, out, "output")
    rop = resolve_op(op, out.dtype)
    eng, entry = _engine(pg, out, "reduce_scatter", async_op=async_op)
    if DETAIL[0]:
        check_traffic(pg, "reduce_scatter", [b.arr.size for b in ins], [out.arr.size] * pg._size)
    return _done(eng.reduce_scatter(out, ins, rop, sync=not async_op), async_op, entry)


def reduce_scatter_tensor(
    output: Any, input: Any, op: Any = SUM, group: Any = None, async_op: bool = False
) -> Work | None:
    """Reduce ``input`` (group size x output size) over the group; rank ``r`` gets the ``r``-th chunk.

    Every rank passes arrays of the same dtype and sizes.

    Args:
        output: this rank's chunk of the result (written in place).
        input: group size x ``output``'s elements, chunk ``r`` destined for rank ``r``.
        op: a :class:`~hpcdist.ops.ReduceOp` (default SUM), or ``ReduceOp.PREMUL_SUM(factor)``.
        group: the process group (None: the default group); a non-member returns None at once.
        async_op: return a :class:`~hpcdist.work.Work` to wait on instead of blocking.

    Returns:
        A :class:`~hpcdist.work.Work` with ``async_op=True``; else None (also on a non-member).
    """
    pg = resolve_group(group, "reduce_scatter_tensor")
    if pg is None:
        return None
    plain = not async_op and not DETAIL[0]
    pair = _apart_arrays(output, input) if plain else None
    if pair is not None:
        # a lane (see all_reduce and all_gather_into_tensor): this dtype and op passed every check before
        out_arr, in_arr = pair
        lanes = pg._rs_sum_lanes if op is SUM else _op_lanes(pg._rs_lanes, op)
        if _pair_lane(pg, lanes.get(id(out_arr.dtype)), out_arr, in_arr, in_arr, out_arr, "reduce_scatter_tensor"):
            return None
    out = adapt(output, "output", True)
    inp = adapt(input, "input", False)
    _same(out, inp, "output", "input")
    _group_multiple(pg, inp, "input", out, "output")
    rop = resolve_op(op, out.dtype)
    eng, entry = _engine(pg, out, "reduce_scatter_tensor", sized=True, async_op=async_op)
    work = _done(eng.reduce_scatter_tensor(out, inp, rop, sync=not async_op), async_op, entry)
    if plain and rop.direct:
        _learn(pg._rs_lanes.setdefault(op, {}), out, lambda: eng.host_lane("reduce_scatter_tensor", out.arr.dtype, rop))
    return work


def reduce_scatter_single(
    output: Any, input: Any, op: Any = SUM, group: Any = None, async_op: bool = False
) -> Work | None:
    """Same as :func:`reduce_scatter_tensor` (torch 2.13's newer name)."""
    return reduce_scatter_tensor(output, input, op, group, async_op)


# ------------------------------------------------------------------ all-to-all


def all_to_all(
    output_tensor_list: list[Any], input_tensor_list: list[Any], group: Any = None, async_op: bool = False
) -> Work | None:
    """Rank ``i`` sends ``input_tensor_list[j]`` to rank ``j``, which receives it in ``output_tensor_list[i]``.

    Sizes may differ between pairs; what rank ``i`` sends to ``j`` and what
    ``j`` expects from ``i`` must have the same size.

    Args:
        output_tensor_list: one output per group rank (written in place).
        input_tensor_list: one input per group rank, all of one dtype and device.
        group: the process group (None: the default group); a non-member returns None at once.
        async_op: return a :class:`~hpcdist.work.Work` to wait on instead of blocking.

    Returns:
        A :class:`~hpcdist.work.Work` with ``async_op=True``; else None (also on a non-member).
    """
    pg = resolve_group(group, "all_to_all")
    if pg is None:
        return None
    _list_len(output_tensor_list, pg._size, "output_tensor_list")
    _list_len(input_tensor_list, pg._size, "input_tensor_list")
    ins = adapt_list(input_tensor_list, "input_tensor_list", False)
    outs = adapt_list(output_tensor_list, "output_tensor_list", True)
    _same_kind(ins[0], ins[1:], "input_tensor_list", start=1)
    _same_kind(ins[0], outs, "output_tensor_list")
    if ins[pg._rank].arr.size != outs[pg._rank].arr.size:
        raise ValueError(
            f"input_tensor_list[{pg._rank}] and output_tensor_list[{pg._rank}] (this rank to itself) must have equal sizes"
        )
    eng, entry = _engine(pg, ins[0], "all_to_all", async_op=async_op)
    if DETAIL[0]:
        check_traffic(pg, "all_to_all", [b.arr.size for b in ins], [b.arr.size for b in outs])
    return _done(eng.all_to_all(outs, ins, sync=not async_op), async_op, entry)


def _split_counts(splits: Any, n: int, rows: int, row_elems: int, argname: str, tensor_name: str) -> list[int]:
    if splits is None or (isinstance(splits, (list, tuple)) and len(splits) == 0):
        if rows % n != 0:
            raise ValueError(
                f"{tensor_name}'s first dimension ({rows}) must be divisible by the group size ({n}) when "
                f"{argname} is not given"
            )
        return [rows // n * row_elems] * n
    seq = splits.tolist() if hasattr(splits, "tolist") else list(splits)
    if len(seq) != n:
        raise ValueError(f"{argname} must hold one size per rank of the group ({n}), got {len(seq)}")
    for s in seq:  # NumPy integers too (``list(np_array)``), as torch takes any integer
        if isinstance(s, bool) or not isinstance(s, (int, np.integer)) or s < 0:
            raise ValueError(f"{argname} must hold non-negative ints, got {seq!r}")
    seq = [int(s) for s in seq]
    if sum(seq) != rows:
        raise ValueError(f"{argname} sums to {sum(seq)} but {tensor_name}'s first dimension is {rows}")
    return [s * row_elems for s in seq]


def all_to_all_single(
    output: Any,
    input: Any,
    output_split_sizes: Any = None,
    input_split_sizes: Any = None,
    group: Any = None,
    async_op: bool = False,
) -> Work | None:
    """Split ``input`` along dim 0, send chunk ``j`` to rank ``j``; concatenate what arrives into ``output``.

    Splits (rows per rank, each array's own rows, as torch) default to equal
    chunks; they may be uneven and must agree, in items, between senders and
    receivers.

    Args:
        output: the rows received, in rank order (written in place).
        input: the rows to send, in rank order.
        output_split_sizes: rows received from each group rank (None or []: equal chunks).
        input_split_sizes: rows sent to each group rank (None or []: equal chunks).
        group: the process group (None: the default group); a non-member returns None at once.
        async_op: return a :class:`~hpcdist.work.Work` to wait on instead of blocking.

    Returns:
        A :class:`~hpcdist.work.Work` with ``async_op=True``; else None (also on a non-member).
    """
    pg = resolve_group(group, "all_to_all_single")
    if pg is None:
        return None
    even = output_split_sizes is None and input_split_sizes is None
    plain = even and not async_op and not DETAIL[0]
    pair = _apart_arrays(output, input) if plain else None
    if pair is not None and _a2a_lane(pg, pg._a2a_lanes.get(id(pair[0].dtype)), *pair):
        return None
    out = adapt(output, "output", True)
    inp = adapt(input, "input", False)
    _same(out, inp, "output", "input")
    if len(inp.shape) == 0 or len(out.shape) == 0:
        raise ValueError("all_to_all_single needs arrays with at least one dimension")
    # as torch, each array's splits count its own rows (input (4, 2) and output (8,) may exchange 2-item rows
    # with 1-item ones): what travels is items, split_size x that array's row size
    in_rows, out_rows = inp.shape[0], out.shape[0]
    in_row = inp.arr.size // in_rows if in_rows else int(np.prod(inp.shape[1:], dtype=np.int64))
    out_row = out.arr.size // out_rows if out_rows else int(np.prod(out.shape[1:], dtype=np.int64))
    scounts = _split_counts(input_split_sizes, pg._size, in_rows, in_row, "input_split_sizes", "input")
    rcounts = _split_counts(output_split_sizes, pg._size, out_rows, out_row, "output_split_sizes", "output")
    if scounts[pg._rank] != rcounts[pg._rank]:
        raise ValueError(
            f"this rank sends itself {scounts[pg._rank]} items (input_split_sizes[{pg._rank}] x input row of "
            f"{in_row}) but expects {rcounts[pg._rank]} (output_split_sizes[{pg._rank}] x output row of {out_row}); "
            "they must match"
        )
    eng, entry = _engine(pg, inp, "all_to_all_single", async_op=async_op)
    if DETAIL[0]:
        check_traffic(pg, "all_to_all_single", scounts, rcounts)
    work = _done(eng.all_to_all_single(out, inp, rcounts, scounts, sync=not async_op), async_op, entry)
    if plain:
        _learn(pg._a2a_lanes, out, lambda: eng.host_lane("all_to_all_single", out.arr.dtype))
    return work


def _a2a_lane(pg: ProcessGroup, lane: Any, out: np.ndarray, inp: np.ndarray) -> bool:
    """Run an even all_to_all_single's ``lane`` (None: not learned) on ``out`` and ``inp`` (which share no memory:
    :func:`_apart_arrays`) if they pass its checks; False: the general path's call.

    The checks: one dtype object and size, below the lane's bound; the output writable, C-contiguous and
    aligned (flags.carray), the input C-contiguous; the first dimension of each a multiple of the group size
    (the general path's even split). As the engine's general path, MPI's Alltoallv (every rank calls it,
    whatever its splits) moves the peers' blocks and this rank's own block is copied here.
    """
    n, size = pg._size, inp.size
    if (
        lane is None
        or inp.dtype is not out.dtype
        or out.size != size
        or inp.nbytes >= lane[2]
        or not out.flags.carray
        or not inp.flags.c_contiguous
        or not inp.ndim
        or not out.ndim
        or inp.shape[0] % n
        or out.shape[0] % n
    ):
        return False
    k, me = size // n, pg._rank
    own = own_block(inp, out, k * me, k * me, k)  # a large own block: copied here, its count 0 (as the engine's)
    _lane_call(pg, lane, "all_to_all_single", size, -1, out, inp, _even(k, n, me if own else -1))
    return True


def _lane_call(pg: ProcessGroup, lane: Any, desc: str, count: int, root: int, *args: Any) -> None:
    """Run ``lane`` on ``args`` as the call ``desc`` of ``count`` items (``root``: -1 if none), recorded in the
    flight recorder as the general path records it. (all_reduce, broadcast, reduce and the all-gather and
    reduce-scatter of tensors write this out: their frame and ``*args`` are a tenth of a hot call's cost.)"""
    fr = pg._flight
    entry = None if fr is None else fr.coll(desc, lane[1], count, root)
    lane[3](*args)
    if entry is not None:
        entry[END] = True


# ------------------------------------------------------------------ barrier


def barrier(
    group: Any = None, async_op: bool = False, device_ids: Any = None, timeout: timedelta | None = None
) -> Work | None:
    """Block until every rank of the group entered the barrier (or ``timeout``, then DistTimeoutError).

    Args:
        group: the process group (None: the default group); a non-member returns None at once.
        async_op: return a :class:`~hpcdist.work.Work` to wait on instead of blocking.
        device_ids: accepted for torch compatibility and ignored (torch's NCCL barrier picks its devices
            with it; hpcdist's barrier moves no device data).
        timeout: how long a blocking barrier waits (default: the group's timeout) before it raises
            DistTimeoutError; with ``async_op=True`` give it to ``Work.wait`` instead.

    Returns:
        A :class:`~hpcdist.work.Work` with ``async_op=True``; else None (also on a non-member).
    """
    pg = resolve_group(group, "barrier")
    if pg is None:
        return None
    if timeout is not None and not isinstance(timeout, timedelta):
        raise TypeError(f"timeout must be a datetime.timedelta, got {type(timeout).__name__}")
    if timeout is not None and timeout < timedelta(0):
        raise ValueError(f"barrier: timeout must be >= 0 (0: the group's timeout), got {timeout!r}")
    if DETAIL[0]:
        check_collective(pg, f"barrier(){_async_part(pg, async_op or timeout is not None)}")
    fr = pg._flight
    entry = None if fr is None else fr.coll("barrier", None, 0, -1)
    lane: Any = pg._barrier_lane if timeout is None and not async_op else False
    if lane:  # the engine's blocking barrier, learned by an earlier call
        lane()
        if pending_orphans():
            finish_orphans(pg)
        if entry is not None:
            entry[END] = True
        return None
    eng = pg.barrier_engine()
    if timeout is None:
        work = eng.barrier(sync=not async_op)
    else:  # the engine's own bound where it waits inside the call (shared memory); else Work.wait's below
        work = eng.barrier(sync=False, timeout_s=timeout.total_seconds())
    if async_op:
        if work is not None and pending_orphans():  # completes once the group's dropped collectives finished too
            work = work.chain(lambda: finish_orphans(pg))
        if entry is not None and work is not None:
            attach(entry, work)
        return work
    if work is not None:
        work.wait(timeout)
    if pending_orphans():  # as gloo's barrier waits for the group's earlier work: finish its dropped collectives
        finish_orphans(pg)
    if entry is not None:
        entry[END] = True
    if lane is None:  # not asked yet (False: the engine has none)
        pg._barrier_lane = eng.host_barrier_lane() or False
    return None
