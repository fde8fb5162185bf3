"""The shared-memory engine: host collectives of ranks on one node through one segment.

:class:`ShmEngine` is the host engine of a group of two or more ranks unless
``HPCDIST_SHM=0``. It is an :class:`~hpcdist.backends.mpi.MPIEngine` whose
collectives first ask the selection table (:mod:`.table`) whether the
shared-memory path wins for this operation, group size and array size; if
not, the MPI engine's method runs, unchanged. Point-to-point, gather,
scatter and the list form of all_to_all are always MPI.

Arrays of a symmetric allocation of the group (:mod:`.symmetric`,
``hpcdist.symmetric_memory.empty``) need no copy through the segment at all:
all_reduce, broadcast, all_gather_into_tensor and reduce_scatter_tensor on
them read the peers' parts where they lie, wherever the table picks shared
memory (half floats and PREMUL_SUM excepted).

Two ways through shared memory for other arrays: by default the data goes through the
segment, a copy in and a copy out (:mod:`.algorithms`). With
``HPCDIST_SHM_DIRECT=1``, where the OS lets the ranks read each other's
memory (:mod:`.cma`, probed together when the segment is set up),
all_reduce, broadcast, all_gather and reduce_scatter read the peers' arrays
directly, one copy (:mod:`.direct`; half floats, PREMUL_SUM, reduce and
all_to_all keep the segment).

The segment is set up by the first call that takes the shared-memory path
(collective over the group, as that call is, and bounded by the group's
timeout), when every rank of the group is on this node
(:func:`.node.one_node`, known without a message); a group spanning nodes
takes MPI. The segment is a POSIX shared-memory file, so launcher-free
worlds (``env://``, ``tcp://``) get it too. Shared-memory calls complete before they return; with
``async_op=True`` they return a completed Work. A peer that does not arrive
within the group's timeout gives :class:`~hpcdist.errors.DistTimeoutError`
(catchable; unhandled, it ends the job through the abort hook), and the
group's segment is unusable afterwards.
"""

from __future__ import annotations

import zlib
from itertools import pairwise
from typing import Any

import numpy as np

from ... import config
from ..._world import WORLD
from ...buffers.adapters import Buf, apart
from ...buffers.dtypes import HALF_DTYPES
from ...errors import DistError, DistTimeoutError, describe_op
from ...ops import RedOpType, ResolvedOp
from ...work import Work, completed_work
from ..mpi import MPIEngine
from . import algorithms as alg
from . import cma, direct, symmetric, table
from .node import one_node
from .segment import Segment

__all__ = ["ShmEngine", "host_engine", "oversubscribed_node", "shm_eligible", "shm_serves"]

#: an operation's code in the segment's tags (Segment.begin): its place in the table's list, from 1
_OP_CODE = {op: i + 1 for i, op in enumerate(table.OPS)}
#: the dtypes a segment tag names (code: index + 1; 0: another), so ranks that pass as many bytes of different
#: dtypes, or reduce them with different ops, raise as ranks with different sizes do (Segment.begin)
_TAG_DTYPES = (
    "bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64",
    "float16", "bfloat16", "float32", "float64", "complex64", "complex128",
)  # fmt: skip
_TAG_DTYPE = {d: i + 1 for i, d in enumerate(_TAG_DTYPES)}
#: the codes of the operations on symmetric memory (:mod:`.symmetric`), after those
_SYM_CODE = {op: len(table.OPS) + i + 1 for i, op in enumerate(symmetric.OPS)}
#: every code's name, for the segment's mismatch errors
_OP_NAMES = table.OPS + tuple(f"{op} on symmetric memory" for op in symmetric.OPS)


def _converts(rop: ResolvedOp, half: str | None) -> bool:
    """Whether a reduction converts items on the way in (half floats widened, PREMUL_SUM multiplied), which only
    the segment's algorithms do: direct reads and symmetric memory then take the segment."""
    return half is not None or rop.premul is not None


def _kind(dtype: str, rop: ResolvedOp | None = None) -> int:
    """The dtype and reduction op of an operation, for its segment tag (above the op code's byte)."""
    return (_TAG_DTYPE.get(dtype, 0) | (0 if rop is None else (int(rop.kind) + 1) << 5)) << 8


def _kind_name(kind: int) -> str:
    """What :func:`_kind` encoded (shifted down), in words: ``"float64, SUM"``."""
    dtype, op = kind & 31, kind >> 5
    words = [_TAG_DTYPES[dtype - 1] if 0 < dtype <= len(_TAG_DTYPES) else "another dtype"]
    if op:
        try:
            words.append(RedOpType(op - 1).name)
        except ValueError:
            words.append(f"reduction {op - 1}")
    return ", ".join(words)


def _tangled(arrays: list[np.ndarray]) -> bool:
    """Whether any two of ``arrays`` (flat, C-contiguous, of one size, not empty) share memory."""
    nbytes = arrays[0].nbytes
    starts = sorted(a.__array_interface__["data"][0] for a in arrays)
    return any(b - a < nbytes for a, b in pairwise(starts))


def _meets(arr: np.ndarray, arrays: list[np.ndarray], own: int) -> bool:
    """Whether ``arr`` shares memory with one of ``arrays`` (flat, C-contiguous, ``arr``'s size) other than by being
    ``arrays[own]`` exactly (the in-place forms, which the algorithms handle)."""
    for i, a in enumerate(arrays):
        if np.may_share_memory(arr, a) and (i != own or arr.ctypes.data != a.ctypes.data):
            return True
    return False


def host_engine(pg: Any, device_type: str = "cpu") -> MPIEngine:
    """The engine of ``pg`` for host arrays: :class:`ShmEngine`, or the plain MPI engine (``HPCDIST_SHM=0``, 1 rank)."""
    mode = config.shm_mode()
    if not shm_eligible(pg, mode):
        return MPIEngine(pg, device_type)
    return ShmEngine(pg, device_type, mode)


def oversubscribed_node() -> bool:
    """Whether more ranks of this job share this node than its ranks may run on CPUs (from the node layout of init:
    the same answer on every rank of the node, whatever each one's own affinity)."""
    node_of, cpus = WORLD.node_of, WORLD.node_cpus
    pg = WORLD.default_pg
    if not node_of or pg is None or len(cpus) != len(node_of):
        return False
    mine = node_of[pg._rank]
    return sum(1 for n in node_of if n == mine) > cpus[pg._rank]


def shm_eligible(pg: Any, mode: str | None = None) -> bool:
    """Whether ``pg`` gets the shared-memory engine for host arrays: not turned off and two or more ranks.

    (Whether its ranks share a node is found on its first shared-memory call;
    a group spanning nodes then takes MPI for good.)
    """
    return (mode or config.shm_mode()) != "off" and pg._size >= 2


def shm_serves(engine: Any, op: str, nbytes: int) -> bool:
    """Whether ``engine`` runs ``op`` on ``nbytes`` through shared memory (for selectors and ``hpcdist info``)."""
    return isinstance(engine, ShmEngine) and engine.path(op, nbytes) == "shm"


class ShmEngine(MPIEngine):
    """The MPI engine plus a shared-memory path chosen per operation and size (see module docstring)."""

    def __init__(self, pg: Any, device_type: str = "cpu", mode: str = "auto", slot_bytes: int | None = None) -> None:
        super().__init__(pg, device_type)
        self.mode = mode
        # a slot holds at least one element of the widest dtype (complex128) per rank, in whole cache lines (and
        # all_to_all's 2 counts per rank, int64)
        self.slot_bytes = max(slot_bytes or config.shm_slot_bytes(), -(-16 * pg._size // 64) * 64)
        self.oversubscribed = oversubscribed_node()
        #: the selection table (HPCDIST_SHM_TABLE's file, else the built-in one; read only where it applies)
        self.selection = table.active(mode)
        rows = self.selection.rows
        self.windows = {op: table.window(op, pg._size, mode, self.oversubscribed, rows) for op in table.OPS}
        self._ar_lo, self._ar_hi = self.windows["all_reduce"]
        # smaller blocking calls take MPIEngine's fast path untouched
        self.fast_all_reduce_below = min(self.fast_all_reduce_below, self.lane_below("all_reduce"))
        self._seg: Segment | bool | None = None  # None: not set up; False: the group spans nodes
        self._setup_timed_out = False  # the segment's setup outlived the group's timeout: refuse, do not retry
        self.direct_allowed = config.shm_direct()
        self._rd: cma.Reader | None = None  # reads the peers' arrays directly (set up with the segment), if allowed

    # -- selection -----------------------------------------------------------

    @property
    def reads_directly(self) -> bool:
        """Whether the segment's ranks read each other's arrays directly (known after the first shared-memory call)."""
        return self._rd is not None

    def path(self, op: str, nbytes: int) -> str:
        """``"shm"`` or ``"mpi"``: the path ``op`` on ``nbytes`` takes (``"mpi"`` once known to span nodes)."""
        lo, hi = self.windows.get(op, table.NEVER)
        return "shm" if lo <= nbytes < hi and self._seg is not False else "mpi"

    def lane_below(self, op: str) -> float:
        return self.windows.get(op, table.NEVER)[0]  # below its window an operation takes MPIEngine's path

    def host_barrier_lane(self) -> Any:
        return None if self.path("barrier", 0) == "shm" else super().host_barrier_lane()

    def _use(self, op: str, nbytes: int, kind: int = 0) -> Segment | None:
        lo, hi = self.windows[op]
        if not lo <= nbytes < hi or (nbytes == 0 and op != "barrier"):  # empty: nothing to move, and every
            return None  # operation begun on the segment must sync (Segment.begin): MPI's zero-count call
        return self._segment(op, nbytes, kind=kind)

    def _symmetric(self, op: str, arr: Any, nbytes: int) -> tuple[Segment, symmetric.Allocation, int] | None:
        """Where ``arr`` lies, when it is symmetric memory of this group and ``op`` on ``nbytes`` takes shared
        memory: the segment (``op`` on symmetric memory begun on it), the allocation and the byte offset."""
        if not symmetric.LIVE:
            return None
        lo, hi = self.windows[op]
        found = symmetric.find(arr) if lo <= nbytes < hi and nbytes else None
        if found is None or found[0].group() is not self.pg:
            return None
        seg = self._segment(op, nbytes, _SYM_CODE[op])
        return None if seg is None else (seg, found[0], found[1])

    def _segment(self, op: str, nbytes: int, code: int = 0, kind: int = 0) -> Segment | None:
        """The group's segment (set up by the first call: collective), or None when the group spans nodes.

        The operation ``op`` of ``nbytes`` (0: sizes may differ by rank) is begun on it, as ``code`` (default:
        ``op``'s): its first sync checks that every rank called the same (:meth:`Segment.begin`).
        """
        seg = self._seg
        if seg is None:
            if self._setup_timed_out:  # the peers that did come have given up on this setup as well
                raise DistTimeoutError(
                    f"{describe_op((op, self.pg))}: this group's shared-memory setup timed out earlier "
                    "(a rank never came); create a new group (or set HPCDIST_SHM=0)"
                )
            try:
                seg = self._seg = self._setup(op)
            except DistTimeoutError:
                self._setup_timed_out = True  # later calls raise at once, not after another full timeout
                raise
        if seg is False:
            return None
        assert isinstance(seg, Segment)
        seg.what = (op, self.pg)
        seg.timeout_s = self.pg._timeout_s
        seg.begin((code or _OP_CODE[op]) | kind, nbytes)
        return seg

    def _setup(self, op: str) -> Segment | bool:
        """Collective over the group (bounded): the segment, or False when the group is not on one node."""
        pg = self.pg
        if not one_node(pg):
            return False
        seg = Segment(pg._comm, self.slot_bytes, pg._timeout_s, (op, pg), _OP_NAMES)
        seg.kind_name = _kind_name
        try:
            self._agree(seg)
        except BaseException:
            seg.free()
            raise
        self._rd = cma.probe(seg, self.direct_allowed)
        return seg

    def _agree(self, seg: Segment) -> None:
        """Collective over ``seg``'s ranks (one sync): every rank chose the same path per operation and size, or
        the same DistError on every rank (ranks reading different HPCDIST_SHM / HPCDIST_SHM_TABLE settings would
        take different paths for one call: a wait that times out, or garbage)."""
        mine = zlib.crc32(repr(sorted(self.windows.items())).encode())
        everyone = [w[0] for w in seg.exchange([mine])]
        other = next((r for r, d in enumerate(everyone) if d != mine), None)
        if other is not None:
            raise DistError(
                f"{describe_op(seg.what)}: the ranks of this node disagree on which operations take "
                f"shared memory (rank {seg.rank}: HPCDIST_SHM={self.mode}, table {self.selection.source}; rank "
                f"{other} chose otherwise): HPCDIST_SHM and HPCDIST_SHM_TABLE must be the same on every rank of a node"
            )

    def close(self) -> None:
        """Unmap the segment (local: no message, at group destruction)."""
        seg, self._seg = self._seg, False
        self._rd = None  # its scratch buffers go with it
        if isinstance(seg, Segment):
            seg.free()

    def _done(self, sync: bool, op: str, result: Any, *written: Buf) -> Work | None:
        for b in written:
            if b.writeback is not None:
                b.writeback()
        return None if sync else completed_work((op, self.pg), result)

    # -- collectives ---------------------------------------------------------

    def barrier(self, sync: bool = False, timeout_s: float | None = None) -> Work | None:
        seg = self._use("barrier", 0)
        if seg is None:
            return super().barrier(sync)
        if timeout_s is not None:  # barrier(timeout=...): this wait's own bound (it was the group's)
            seg.timeout_s = timeout_s
        seg.guarded_sync()
        return self._done(sync, "barrier", None)

    def broadcast(self, buf: Buf, root: int, sync: bool = False) -> Work | None:
        sym = self._symmetric("broadcast", buf.arr, buf.arr.nbytes)
        if sym is not None:
            symmetric.broadcast(sym[0], sym[1], buf.arr.reshape(-1), sym[2], root)
            return self._done(sync, "broadcast", buf.obj)
        seg = self._use("broadcast", buf.arr.nbytes, _kind(buf.dtype))
        if seg is None:
            return super().broadcast(buf, root, sync)
        if self._rd is not None:
            direct.broadcast(seg, self._rd, buf.arr.reshape(-1), root)
        else:
            alg.broadcast(seg, buf.arr.reshape(-1), root)
        return self._done(sync, "broadcast", buf.obj, *([buf] if seg.rank != root else []))

    def _all_reduce(self, buf: Buf, rop: ResolvedOp, sync: bool) -> Work | None:
        nbytes = buf.arr.nbytes
        if not self._ar_lo <= nbytes < self._ar_hi:
            return MPIEngine._all_reduce(self, buf, rop, sync)
        flat = buf.arr.reshape(-1)
        half = buf.dtype if buf.dtype in HALF_DTYPES else None
        sym = None if _converts(rop, half) else self._symmetric("all_reduce", flat, nbytes)
        if sym is not None:
            symmetric.all_reduce(sym[0], sym[1], flat, sym[2], rop.mpi_name, rop.average)
            return self._done(sync, "all_reduce", buf.obj)
        seg = self._use("all_reduce", nbytes, _kind(buf.dtype, rop))
        if seg is None:
            return MPIEngine._all_reduce(self, buf, rop, sync)
        rd = self._reader(rop, half)
        if rd is not None:
            direct.all_reduce(seg, rd, flat, rop.mpi_name, rop.average)
        else:
            alg.all_reduce(seg, flat, flat, rop.mpi_name, half, rop.premul, rop.average)
        return self._done(sync, "all_reduce", buf.obj, buf)

    def host_all_reduce_many(self, arrays: list[Any], dtype: str, rop: ResolvedOp, nbytes: int) -> None:
        seg = self._use("all_reduce", nbytes, _kind(dtype, rop)) if dtype not in HALF_DTYPES else None
        if seg is None:
            super().host_all_reduce_many(arrays, dtype, rop, nbytes)
            return
        alg.all_reduce_list(seg, arrays, rop.mpi_name, rop.premul, rop.average)

    def reduce(self, buf: Buf, root: int, rop: ResolvedOp, sync: bool = False) -> Work | None:
        seg = self._use("reduce", buf.arr.nbytes, _kind(buf.dtype, rop))
        if seg is None:
            return super().reduce(buf, root, rop, sync)
        flat = buf.arr.reshape(-1)
        half = buf.dtype if buf.dtype in HALF_DTYPES else None
        mine = seg.rank == root
        alg.reduce(seg, flat, flat if mine else None, rop.mpi_name, half, rop.premul, rop.average)
        return self._done(sync, "reduce", buf.obj, *([buf] if mine else []))

    def all_gather(self, outs: list[Buf], inp: Buf, sync: bool = False) -> Work | None:
        size = inp.arr.size
        even = all(o.arr.size == size for o in outs)  # the same on every rank: outs[r] has rank r's size
        seg = (
            self._use("all_gather", inp.arr.nbytes * len(outs), _kind(inp.dtype)) if even else None
        )  # sizes alone decide the path
        if seg is None:
            return super().all_gather(outs, inp, sync)
        src, dsts = inp.arr.reshape(-1), [o.arr.reshape(-1) for o in outs]
        if _tangled(dsts) or _meets(src, dsts, seg.rank):
            # outputs sharing memory (one array in several slots, overlapping views), or an input over other
            # outputs: the staggered reads would leave each rank other data (or read input already written
            # over); gathered aside, then copied out in rank order as MPI's path does (the last slot wins everywhere)
            aside = np.empty((len(dsts), size), src.dtype)
            self._all_gather(seg, src, list(aside))
            for d, a in zip(dsts, aside):
                np.copyto(d, a)
        else:
            self._all_gather(seg, src, dsts)
        return self._done(sync, "all_gather", [o.obj for o in outs], *outs)

    def all_gather_into(self, out: Buf, inp: Buf, sync: bool = False) -> Work | None:
        sym = self._symmetric("all_gather_into_tensor", inp.arr, out.arr.nbytes)
        if sym is not None:
            rows = out.arr.reshape(sym[0].size, out.arr.size // sym[0].size)
            symmetric.all_gather(sym[0], sym[1], inp.arr.reshape(-1), sym[2], list(rows))
            return self._done(sync, "all_gather_into_tensor", out.obj, out)
        seg = self._use("all_gather_into_tensor", out.arr.nbytes, _kind(out.dtype))
        if seg is None:
            return super().all_gather_into(out, inp, sync)
        rows = out.arr.reshape(seg.size, out.arr.size // seg.size)
        inp = apart(inp, out, (True, seg.rank))  # chunks would read input already written over: a copy
        self._all_gather(seg, inp.arr.reshape(-1), list(rows))
        return self._done(sync, "all_gather_into_tensor", out.obj, out)

    def reduce_scatter(self, out: Buf, ins: list[Buf], rop: ResolvedOp, sync: bool = False) -> Work | None:
        size = out.arr.size
        even = all(b.arr.size == size for b in ins)  # the same on every rank: ins[r] has rank r's output size
        seg = self._use("reduce_scatter", out.arr.nbytes * len(ins), _kind(out.dtype, rop)) if even else None
        if seg is None:
            return super().reduce_scatter(out, ins, rop, sync)
        half = out.dtype if out.dtype in HALF_DTYPES else None
        srcs, dst = [b.arr.reshape(-1) for b in ins], out.arr.reshape(-1)
        if _meets(dst, srcs, seg.rank):  # an output over inputs (but its own) would be read after written: aside
            res = np.empty_like(dst)
            self._reduce_scatter(seg, srcs, res, rop, half)
            np.copyto(dst, res)
        else:
            self._reduce_scatter(seg, srcs, dst, rop, half)
        return self._done(sync, "reduce_scatter", out.obj, out)

    def reduce_scatter_tensor(self, out: Buf, inp: Buf, rop: ResolvedOp, sync: bool = False) -> Work | None:
        half = out.dtype if out.dtype in HALF_DTYPES else None
        nbytes = inp.arr.nbytes
        sym = None if _converts(rop, half) else self._symmetric("reduce_scatter_tensor", inp.arr, nbytes)
        if sym is not None:
            flat = inp.arr.reshape(-1)
            symmetric.reduce_scatter(sym[0], sym[1], flat, sym[2], out.arr.reshape(-1), rop.mpi_name, rop.average)
            return self._done(sync, "reduce_scatter_tensor", out.obj, out)
        seg = self._use("reduce_scatter_tensor", nbytes, _kind(out.dtype, rop))
        if seg is None:
            return super().reduce_scatter_tensor(out, inp, rop, sync)
        inp = apart(inp, out, (False, seg.rank))  # an output over other input rows would be read after written
        self._reduce_scatter(
            seg, list(inp.arr.reshape(seg.size, inp.arr.size // seg.size)), out.arr.reshape(-1), rop, half
        )
        return self._done(sync, "reduce_scatter_tensor", out.obj, out)

    def _reader(self, rop: ResolvedOp, half: str | None) -> cma.Reader | None:
        """The direct reader for a reduction, or None: off, or items converted on the way in (:func:`_converts`)."""
        return None if _converts(rop, half) else self._rd

    def _all_gather(self, seg: Segment, src: Any, outs: list[Any]) -> None:
        if self._rd is not None:
            direct.all_gather(seg, self._rd, src, outs)
        else:
            alg.all_gather(seg, src, outs)

    def _reduce_scatter(self, seg: Segment, srcs: list[Any], dst: Any, rop: ResolvedOp, half: str | None) -> None:
        rd = self._reader(rop, half)
        if rd is not None:
            direct.reduce_scatter(seg, rd, srcs, dst, rop.mpi_name, rop.average)
        else:
            alg.reduce_scatter(seg, srcs, dst, rop.mpi_name, half, rop.premul, rop.average)

    def all_to_all_single(
        self, out: Buf, inp: Buf, rcounts: list[int], scounts: list[int], sync: bool = False
    ) -> Work | None:
        window = self.windows["all_to_all_single"]
        # the sizes may differ per rank: alg.all_to_all shares the counts first, then every rank decides alike
        seg = self._segment("all_to_all_single", 0, kind=_kind(out.dtype)) if window[0] < window[1] else None
        if seg is None:
            return super().all_to_all_single(out, inp, rcounts, scounts, sync)
        src = apart(inp, out).arr.reshape(-1)  # overlapping arrays (or the same one): read from a copy
        if not alg.all_to_all(seg, src, scounts, out.arr.reshape(-1), rcounts, window):
            return super().all_to_all_single(out, inp, rcounts, scounts, sync)
        return self._done(sync, "all_to_all_single", out.obj, out)
