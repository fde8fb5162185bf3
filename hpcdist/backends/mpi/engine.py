"""The MPI engine: every operation as one non-blocking MPI call.

Each method starts the operation on the group's communicator and returns a
:class:`~hpcdist.work.Work` that owns the request(s), the finishing step and
the buffers. Arguments were checked by the caller (:mod:`hpcdist.collectives`,
:mod:`hpcdist.p2p`); this module only moves data.

Host memory is passed to MPI as ``[ndarray, MPI datatype]``; CUDA arrays
(when the MPI is CUDA-aware) are passed through ``__cuda_array_interface__``
after the GPU layer synchronized the producing stream. Counts above
``2**31 - 1`` go through MPI-4's large-count calls, which mpi4py picks.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ..._watchdog import WATCHDOG
from ...buffers.adapters import Buf, apart, is_slot
from ...buffers.dtypes import HALF_DTYPES, mpi_datatype
from ...buffers.packing import displacements as _displs
from ...buffers.packing import own_block
from ...buffers.packing import pack as _pack
from ...buffers.packing import unpack as _unpack
from ...buffers.reduction import finish_reduce, order_keys, premultiply, prepare, widen
from ...ops import RedOpType, ResolvedOp
from ...work import ProbedRecv, Work, strand, timeout_error, wait_requests
from ..engine import Engine

__all__ = ["MPIEngine"]

# This module is imported when the first engine is built, after MPI started.
from mpi4py import MPI

_IN_PLACE = MPI.IN_PLACE
_ANY_SOURCE = MPI.ANY_SOURCE
_OPS: dict[str, Any] = {}


#: the float dtypes whose blocking MIN/MAX all_reduce MPI runs on the floats where no rank holds a NaN
#: (:meth:`MPIEngine._min_max_without_nan`); the others' (and the other calls') always on ordered keys
_NAN_CHECKED = frozenset({"float32", "float64"})
#: up to this many bytes, that all_reduce sends a copy with one more item (the NaN flag): one MPI call
_WITH_FLAG_BELOW = 32 << 10
_UCHAR, _MAX = MPI.UNSIGNED_CHAR, MPI.MAX
#: MIN and MAX as MPI computes them on floats: exact where no item is NaN
_UNORDERED = {kind: ResolvedOp(kind, kind.name) for kind in (RedOpType.MIN, RedOpType.MAX)}


def _mpi_op(name: str) -> Any:
    op = _OPS.get(name)
    if op is None:
        op = _OPS[name] = getattr(MPI, name)
    return op


#: a Buf's dtype name -> its MPI datatype, for the arrays whose name is their NumPy dtype's (not half floats)
_BY_NAME: dict[str, Any] = {}


def _by_name(buf: Buf) -> Any:
    mt = mpi_datatype(buf.arr.dtype)
    if buf.arr.dtype.name == buf.dtype:
        _BY_NAME[buf.dtype] = mt
    return mt


def _msg(arr: Any) -> list[Any]:
    return [arr, mpi_datatype(arr.dtype)]


def _but(counts: list[int], me: int) -> list[int]:
    """``counts`` with entry ``me`` zeroed."""
    return [0 if r == me else c for r, c in enumerate(counts)]


def _reduce_type(arr: np.ndarray) -> Any:
    return mpi_datatype(arr.dtype)


#: the operations with a lane (:meth:`MPIEngine.host_lane`): op -> (MPI routine, guard shape of its arguments,
#: whether it reduces: then only with an op MPI computes on the array itself, bound as the routine's last argument)
_LANES = {
    "broadcast": ("Bcast", "rooted", False),
    "reduce": ("Reduce", "reduce", True),
    "all_gather_into_tensor": ("Allgather", "gather", False),
    "all_gather": ("Allgather", "gather", False),
    "gather": ("Gatherv", "gatherv", False),
    "scatter": ("Scatterv", "scatterv", False),
    "reduce_scatter_tensor": ("Reduce_scatter_block", "scatter", True),
    "all_to_all_single": ("Alltoallv", "alltoallv", False),
}


class MPIEngine(Engine):
    """Runs the operations of one process group over its MPI communicator.

    Every operation method takes ``sync``: True when the caller will wait
    right away (``async_op=False``). In ``HPCDIST_WAIT=block`` mode a sync
    operation calls the blocking MPI routine under the watchdog and returns
    None; otherwise the non-blocking routine starts and a Work is returned.
    """

    kind = "mpi"

    def __init__(self, pg: Any, device_type: str = "cpu") -> None:
        self.pg = pg
        self.comm = pg._comm
        self.device_type = device_type
        self.block = bool(getattr(pg, "_block", False))
        # (routine, name) -> (comm.Ixxx, "now": the routine run to completion under the watchdog's guard: _resolve)
        self._routines: dict[tuple[str, str], tuple[Any, Any]] = {}
        # the blocking all_reduce hot path (MPI_Allreduce run now: _resolve) for calls of fewer bytes than
        # fast_all_reduce_below; the others go to _all_reduce, which an engine with another path for large
        # arrays overrides (and lowers fast_all_reduce_below to where that path starts)
        self._allreduce_now = self._resolve("Allreduce", "all_reduce")[1]
        self.fast_all_reduce_below: float = float("inf")

    # -- the one template --------------------------------------------------

    def _run(
        self,
        routine: str,
        args: tuple,
        *,
        sync: bool,
        name: str,
        post: Any = None,
        keep: Any = None,
        result: Any = None,
    ) -> Work | None:
        """Run MPI ``routine`` (e.g. ``"Allreduce"``) on ``args``: non-blocking, or blocking when ``sync``.

        Args:
            routine: the blocking routine's name in mpi4py (``"Allreduce"``); ``"I" + "allreduce"`` starts it.
            args: the routine's arguments (the same for both forms).
            sync: the caller waits right away (``async_op=False``): in block mode the blocking
                routine runs under the watchdog; in poll mode the non-blocking one is polled.
            name: the operation's name in errors and in the watchdog.
            post: what to run once the operation completed (copies back, AVG scaling); None: nothing.
            keep: what must live until then (the buffers MPI reads or writes).
            result: the output arrays, :meth:`Work.result`.

        Returns:
            None when ``sync`` (the operation completed), else the Work that completes it.
        """
        start, now = self._routines.get((routine, name)) or self._resolve(routine, name)
        if not sync:
            pg = self.pg
            return Work([start(*args)], post, keep, pg._timeout_s, (name, pg), result)
        now(*args)
        if post is not None:
            post()
        return None

    def _resolve(self, routine: str, name: str) -> tuple[Any, Any]:
        """``(start, now)`` for MPI ``routine`` run as op ``name``, built once per engine.

        ``start`` is the communicator's non-blocking method. ``now`` runs the
        operation to completion under the watchdog's guard (the group's call
        slot: :meth:`~hpcdist._watchdog.Watchdog.guard`): in block mode the
        blocking MPI routine, watched for the group's timeout; in poll mode the
        non-blocking one, polled against the timeout inline (no Work object),
        which raises a catchable :class:`~hpcdist.errors.DistTimeoutError`.
        """
        c, pg = self.comm, self.pg
        start = getattr(c, "I" + routine[0].lower() + routine[1:])
        fn, owner = self._completion(routine, name, start)
        pair = self._routines[(routine, name)] = (
            start,
            WATCHDOG.guard(fn, (name, pg), pg._call_domain, pg.busy_error, owner),
        )
        return pair

    def _completion(self, routine: str, name: str, start: Any) -> tuple[Any, Any]:
        """``(fn, owner)``: what runs ``routine`` to completion, and whom the watchdog watches it for.

        Block mode: the blocking MPI routine, watched for the group's timeout.
        Poll mode: the non-blocking one (``start``) polled against the timeout
        inline (no Work object), raising a catchable DistTimeoutError; not
        watched (owner None).
        """
        pg = self.pg
        if self.block:
            return getattr(self.comm, routine), pg

        def poll(*args: Any) -> None:
            req = start(*args)
            if not req.Test() and not wait_requests([req], pg._timeout_s):
                strand([req], args)  # a late peer may still make MPI use the buffers: keep them
                raise timeout_error((name, pg), pg._timeout_s)

        return poll, None

    # -- collectives ---------------------------------------------------------

    def barrier(self, sync: bool = False, timeout_s: float | None = None) -> Work | None:
        return self._run("Barrier", (), sync=sync, name="barrier")

    def broadcast(self, buf: Buf, root: int, sync: bool = False) -> Work | None:
        post = buf.writeback if self.comm.Get_rank() != root else None
        return self._run(
            "Bcast", (_msg(buf.arr), root), sync=sync, name="broadcast", post=post, keep=buf, result=buf.obj
        )

    def all_reduce(self, buf: Buf, rop: ResolvedOp, sync: bool = False) -> Work | None:
        arr = buf.arr
        if (
            sync
            and (rop.direct or (rop.ordered and buf.dtype in _NAN_CHECKED))
            and buf.writeback is None
            and arr.nbytes < self.fast_all_reduce_below
        ):
            # the hot path (block mode, in place, no post-step): MPI_Allreduce under the watchdog's guard
            mt = _BY_NAME.get(buf.dtype) or _by_name(buf)
            op = _OPS.get(rop.mpi_name) or _mpi_op(rop.mpi_name)
            if rop.direct:
                self._allreduce_now(_IN_PLACE, [arr, mt], op)
                return None
            if self._min_max_without_nan(arr, mt, op, rop.kind is RedOpType.MAX):
                return None
        return self._all_reduce(buf, rop, sync)

    def _min_max_without_nan(self, arr: np.ndarray, mt: Any, op: Any, is_max: bool) -> bool:
        """MIN/MAX of the float32/float64 array ``arr`` (C-contiguous) by MPI on the floats, where no rank holds a
        NaN: then MPI's MIN/MAX is exact. True: done; False: a rank holds one, ``arr`` is as it was and the call
        must take the ordered keys (:func:`~hpcdist.buffers.reduction.order_keys`). Blocking, collective.

        A small array travels with one more item that says whether its rank holds a NaN (MAX of 1 or 0, MIN of
        -1 or 0): one MPI call on a copy. A larger one asks first (a one-byte MAX), then reduces in place."""
        flat = arr.reshape(-1)
        if arr.nbytes <= _WITH_FLAG_BELOW:
            n = flat.size
            both = np.empty(n + 1, arr.dtype)
            both[:n] = flat
            top = flat.max() if n else 0.0  # NaN where any item is
            both[n] = 0.0 if top == top else (1.0 if is_max else -1.0)
            self._allreduce_now(_IN_PLACE, [both, mt], op)
            if both[n] != 0.0:
                return False
            flat[...] = both[:n]
            return True
        if self._nan_anywhere(flat):
            return False
        self._allreduce_now(_IN_PLACE, [arr, mt], op)
        return True

    def _nan_anywhere(self, arr: np.ndarray) -> bool:
        """Whether the float array ``arr`` holds a NaN on any rank (blocking, collective: a one-byte MAX)."""
        top = arr.max() if arr.size else 0.0  # NaN where any item is
        flag = np.array([top != top], np.uint8)
        self._allreduce_now(_IN_PLACE, [flag, _UCHAR], _MAX)
        return bool(flag[0])

    def _unordered_if_no_nan(self, rop: ResolvedOp, buf: Buf, sync: bool) -> ResolvedOp:
        """``rop``; for a blocking MIN/MAX of float32/float64 that no rank holds a NaN for (:meth:`_nan_anywhere`),
        MPI's own MIN/MAX, exact then, instead of the ordered keys' passes."""
        if sync and rop.ordered and buf.dtype in _NAN_CHECKED and not self._nan_anywhere(buf.arr):
            return _UNORDERED[rop.kind]
        return rop

    def host_all_reduce_lane(self, dtype: str, rop: ResolvedOp) -> tuple[int, Any] | None:
        """Ops MPI computes on the array itself: MPI_Allreduce run now (:meth:`_resolve`), below
        ``fast_all_reduce_below``; MIN/MAX of float32/float64 through :meth:`_min_max_without_nan`."""
        if rop.ordered and dtype in _NAN_CHECKED and self.fast_all_reduce_below > 0:
            mt, op, is_max = mpi_datatype(np.dtype(dtype)), _mpi_op(rop.mpi_name), rop.kind is RedOpType.MAX

            def checked(arr: np.ndarray) -> None:
                if not self._min_max_without_nan(arr, mt, op, is_max):
                    self._all_reduce(Buf(arr, arr, dtype), rop, True)

            return int(min(self.fast_all_reduce_below, 1 << 62)), checked
        if not rop.direct or self.fast_all_reduce_below <= 0 or dtype in HALF_DTYPES:
            return None
        pg = self.pg
        fn, owner = self._completion("Allreduce", "all_reduce", self.comm.Iallreduce)
        bound = (
            _IN_PLACE,
            mpi_datatype(np.dtype(dtype)),
            _mpi_op(rop.mpi_name),
        )  # run(arr): fn(IN_PLACE, [arr, mt], op)
        run = WATCHDOG.guard(fn, ("all_reduce", pg), pg._call_domain, pg.busy_error, owner, bound)
        return int(min(self.fast_all_reduce_below, 1 << 62)), run

    def lane_below(self, op: str) -> float:
        """Where this engine's own path for ``op`` starts (bytes): its lanes (:meth:`host_lane`, and
        all_reduce's through ``fast_all_reduce_below``) serve smaller calls. MPI's path has no other:
        infinity; engines with one for large arrays override it."""
        return float("inf")

    def host_lane(self, op: str, np_dtype: Any, rop: ResolvedOp | None = None) -> tuple[int, Any] | None:
        """The MPI routine of ``op`` (:data:`_LANES`) run now under the watchdog's guard, its datatype (and op) bound."""
        spec = _LANES.get(op)
        bound = self.lane_below(op)
        if spec is None or bound <= 0:
            return None
        routine, shape, reduces = spec
        if reduces and (rop is None or not rop.direct):  # AVG, PREMUL_SUM, half floats: steps around the call
            return None
        pg = self.pg
        start = getattr(self.comm, "I" + routine[0].lower() + routine[1:])
        fn, owner = self._completion(routine, op, start)
        head = _IN_PLACE if shape == "reduce" else None  # the root reduces in place
        typed = (head, mpi_datatype(np_dtype), _mpi_op(rop.mpi_name) if reduces and rop is not None else None)
        run = WATCHDOG.guard(fn, (op, pg), pg._call_domain, pg.busy_error, owner, typed, shape)
        return int(min(bound, 1 << 62)), run

    def host_barrier_lane(self) -> Any:
        return (self._routines.get(("Barrier", "barrier")) or self._resolve("Barrier", "barrier"))[1]

    def _all_reduce(self, buf: Buf, rop: ResolvedOp, sync: bool) -> Work | None:
        """all_reduce but its blocking fast path (engines with another path for large arrays override it)."""
        if rop.plain and buf.writeback is None and buf.dtype not in HALF_DTYPES:
            arr = buf.arr
            mt = _BY_NAME.get(buf.dtype) or _by_name(buf)
            args = (_IN_PLACE, [arr, mt], _OPS.get(rop.mpi_name) or _mpi_op(rop.mpi_name))
            return self._run("Allreduce", args, sync=sync, name="all_reduce", keep=buf, result=buf.obj)
        work = prepare(buf, rop, copy=False)
        size = self.comm.Get_size()

        def post() -> None:
            finish_reduce(buf, work, rop, size)

        args = (_IN_PLACE, [work, _reduce_type(work)], _mpi_op(rop.mpi_name))
        return self._run("Allreduce", args, sync=sync, name="all_reduce", post=post, keep=(buf, work), result=buf.obj)

    def reduce(self, buf: Buf, root: int, rop: ResolvedOp, sync: bool = False) -> Work | None:
        c = self.comm
        rop = self._unordered_if_no_nan(rop, buf, sync)
        work = prepare(buf, rop, copy=False)
        op = _mpi_op(rop.mpi_name)
        if c.Get_rank() == root:
            size = c.Get_size()

            def post() -> None:
                finish_reduce(buf, work, rop, size)

            args: tuple = (_IN_PLACE, [work, _reduce_type(work)], op, root)
            return self._run("Reduce", args, sync=sync, post=post, keep=(buf, work), name="reduce", result=buf.obj)
        args = ([work, _reduce_type(work)], None, op, root)
        return self._run("Reduce", args, sync=sync, keep=(buf, work), name="reduce", result=buf.obj)

    def all_gather(self, outs: list[Buf], inp: Buf, sync: bool = False) -> Work | None:
        """Gather ``inp`` of every rank into ``outs[r]`` (sizes may differ by rank)."""
        counts = [o.arr.size for o in outs]
        dtype = inp.arr.dtype
        tmp = np.empty(sum(counts), dtype=dtype)
        mt = mpi_datatype(dtype)

        def post() -> None:
            _unpack(tmp, outs)

        keep, res = (outs, inp, tmp), [o.obj for o in outs]
        if all(x == counts[0] for x in counts):
            args: tuple = (_msg(inp.arr), [tmp, mt])
            return self._run("Allgather", args, sync=sync, post=post, keep=keep, name="all_gather", result=res)
        args = (_msg(inp.arr), [tmp, (counts, _displs(counts)), mt])
        return self._run("Allgatherv", args, sync=sync, post=post, keep=keep, name="all_gather", result=res)

    def all_gather_into(self, out: Buf, inp: Buf, sync: bool = False) -> Work | None:
        c = self.comm
        # torch allows the input to be this rank's slot of the output (FSDP2 gathers in place): MPI_IN_PLACE;
        # an input overlapping the output otherwise is sent from a copy (MPI forbids aliased buffers)
        inp = apart(inp, out, (True, c.Get_rank()))
        send = _IN_PLACE if is_slot(out.arr, inp.arr, c.Get_rank()) else _msg(inp.arr)
        args = (send, _msg(out.arr))
        return self._run(
            "Allgather",
            args,
            sync=sync,
            post=out.writeback,
            keep=(out, inp),
            name="all_gather_into_tensor",
            result=out.obj,
        )

    def gather(self, inp: Buf, outs: list[Buf] | None, root: int, sync: bool = False) -> Work | None:
        if outs is None:
            return self._run("Gatherv", (_msg(inp.arr), None, root), sync=sync, keep=inp, name="gather")
        counts = [o.arr.size for o in outs]
        tmp = np.empty(sum(counts), dtype=inp.arr.dtype)

        def post() -> None:
            _unpack(tmp, outs)

        args = (_msg(inp.arr), [tmp, (counts, _displs(counts)), mpi_datatype(inp.arr.dtype)], root)
        return self._run(
            "Gatherv", args, sync=sync, post=post, keep=(inp, outs, tmp), name="gather", result=[o.obj for o in outs]
        )

    def scatter(self, out: Buf, ins: list[Buf] | None, root: int, sync: bool = False) -> Work | None:
        if ins is None:
            args: tuple = (None, _msg(out.arr), root)
            keep: Any = out
        else:
            tmp = _pack(ins, out.arr.dtype)
            counts = [b.arr.size for b in ins]
            args = ([tmp, (counts, _displs(counts)), mpi_datatype(out.arr.dtype)], _msg(out.arr), root)
            keep = (out, ins, tmp)
        return self._run("Scatterv", args, sync=sync, post=out.writeback, keep=keep, name="scatter", result=out.obj)

    def reduce_scatter(self, out: Buf, ins: list[Buf], rop: ResolvedOp, sync: bool = False) -> Work | None:
        c = self.comm
        half = out.dtype in HALF_DTYPES
        counts = [b.arr.size for b in ins]
        if rop.ordered:
            send = order_keys(_pack(ins, out.arr.dtype), out.dtype, rop.kind)
        elif half:
            send = np.concatenate([widen(b.arr, b.dtype).reshape(-1) for b in ins])
        else:
            send = _pack(ins, out.arr.dtype)
        if rop.premul is not None:
            premultiply(send, rop.premul)
        aside = half or rop.ordered or out.writeback is not None
        recv = np.empty(out.arr.size, dtype=send.dtype) if aside else out.arr
        size = c.Get_size()

        def post() -> None:
            finish_reduce(out, recv, rop, size)

        args = (_msg(send), [recv, mpi_datatype(recv.dtype)], counts, _mpi_op(rop.mpi_name))
        return self._run(
            "Reduce_scatter",
            args,
            sync=sync,
            post=post,
            keep=(out, ins, send, recv),
            name="reduce_scatter",
            result=out.obj,
        )

    def reduce_scatter_tensor(self, out: Buf, inp: Buf, rop: ResolvedOp, sync: bool = False) -> Work | None:
        c = self.comm
        half = out.dtype in HALF_DTYPES
        rop = self._unordered_if_no_nan(rop, inp, sync)
        send = prepare(inp, rop, copy=False)
        # MPI forbids aliased buffers: an output inside the input (FSDP's in-place form) receives aside
        aside = half or rop.ordered or out.writeback is not None or np.may_share_memory(out.arr, send)
        recv = np.empty(out.arr.size, dtype=send.dtype) if aside else out.arr
        size = c.Get_size()

        def post() -> None:
            finish_reduce(out, recv, rop, size)

        args = (_msg(send), [recv, mpi_datatype(recv.dtype)], _mpi_op(rop.mpi_name))
        return self._run(
            "Reduce_scatter_block",
            args,
            sync=sync,
            post=post,
            keep=(out, inp, send, recv),
            name="reduce_scatter_tensor",
            result=out.obj,
        )

    def all_to_all(self, outs: list[Buf], ins: list[Buf], sync: bool = False) -> Work | None:
        dtype = ins[0].arr.dtype
        mt = mpi_datatype(dtype)
        scounts = [b.arr.size for b in ins]
        rcounts = [b.arr.size for b in outs]
        send = _pack(ins, dtype)
        recv = np.empty(sum(rcounts), dtype=dtype)

        def post() -> None:
            _unpack(recv, outs)

        args = ([send, (scounts, _displs(scounts)), mt], [recv, (rcounts, _displs(rcounts)), mt])
        return self._run(
            "Alltoallv",
            args,
            sync=sync,
            post=post,
            keep=(outs, ins, send, recv),
            name="all_to_all",
            result=[o.obj for o in outs],
        )

    def all_to_all_single(
        self, out: Buf, inp: Buf, rcounts: list[int], scounts: list[int], sync: bool = False
    ) -> Work | None:
        inp = apart(inp, out)  # the same array or overlapping ones (MPI forbids aliased buffers): send a copy
        mt = mpi_datatype(inp.arr.dtype)
        # MPI_Alltoallv always, even splits too: every rank must call the same routine, and whether the splits
        # are even on every rank is known on none (torch lets one rank pass none and another uneven ones)
        sd, rd = _displs(scounts), _displs(rcounts)
        me = self.pg._rank
        # a large own block of host arrays: copied here (MPI's way is slower for large blocks), its counts 0
        if type(out.arr) is np.ndarray and own_block(inp.arr, out.arr, sd[me], rd[me], scounts[me]):
            scounts, rcounts = _but(scounts, me), _but(rcounts, me)
        args = ([inp.arr, (scounts, sd), mt], [out.arr, (rcounts, rd), mt])
        return self._run(
            "Alltoallv", args, sync=sync, post=out.writeback, keep=(out, inp), name="all_to_all_single", result=out.obj
        )

    # -- point to point (always non-blocking: receives honour the timeout and can be cancelled) --

    def send(self, buf: Buf, dst: int, tag: int) -> Work:
        req = self.comm.Isend(_msg(buf.arr), dst, tag)
        return Work([req], None, buf, self.pg._timeout_s, ("send", self.pg))

    def send_now(self, buf: Buf, dst: int, tag: int) -> None:
        """Blocking send: the non-blocking call polled inline (no Work object)."""
        req = self.comm.Isend([buf.arr, mpi_datatype(buf.arr.dtype)], dst, tag)
        if not req.Test():
            pg = self.pg
            if not wait_requests([req], pg._timeout_s):
                raise timeout_error(("send", pg), pg._timeout_s)

    def _irecv(self, spec: list[Any], src: int, tag: int, status: Any) -> Any:
        """``MPI_Irecv``, or from any source on a launcher-free world a :class:`ProbedRecv` (an MPICH workaround)."""
        if src == _ANY_SOURCE and self.pg._probe_any:
            return ProbedRecv(self.comm, spec, tag, status)
        return self.comm.Irecv(spec, src, tag)

    def recv_now(self, buf: Buf, src: int, tag: int) -> int:
        """Blocking receive polled inline; returns the sender's global rank. On timeout it is cancelled."""
        status = MPI.Status()
        req = self._irecv([buf.arr, mpi_datatype(buf.arr.dtype)], src, tag, status)
        if not req.Test(status):
            pg = self.pg
            if not wait_requests([req], pg._timeout_s, status):
                try:
                    req.Cancel()
                    req.Wait()
                except Exception:
                    pass
                raise timeout_error(("recv", pg), pg._timeout_s, cancelled=True)
        if buf.writeback is not None:
            buf.writeback()
        return self.pg._ranks[status.Get_source()]

    def recv(self, buf: Buf, src: int, tag: int) -> Work:
        """Receive into ``buf`` from group rank ``src`` (``MPI.ANY_SOURCE`` allowed)."""
        status = MPI.Status()
        req = self._irecv(_msg(buf.arr), src, tag, status)
        pg = self.pg

        def on_timeout() -> None:  # a receive can be cancelled: the group stays usable
            try:
                req.Cancel()
                req.Wait()
            except Exception:
                pass

        return Work.receive(
            req, status, pg._ranks, buf.writeback, buf, pg._timeout_s, ("recv", pg), buf.obj, on_timeout
        )
