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

from ..buffers.adapters import Buf
from ..buffers.dtypes import HALF_DTYPES, mpi_datatype, narrow_into, widen
from ..ops import ResolvedOp
from ..work import Work
from . import register_builtin

__all__ = ["MPIEngine"]

_OPS: dict[str, Any] = {}


def _mpi_op(name: str) -> Any:
    op = _OPS.get(name)
    if op is None:
        from mpi4py import MPI

        op = _OPS[name] = getattr(MPI, name)
    return op


def _msg(arr: Any) -> list[Any]:
    return [arr, mpi_datatype(arr.dtype)]


def _scale_average(arr: np.ndarray, n: int) -> None:
    if arr.dtype.kind in "fc":
        arr /= n
    else:  # integer AVG truncates toward zero, as NCCL does
        np.copyto(arr, np.trunc(arr / n), casting="unsafe")


def _prepare(buf: Buf, rop: ResolvedOp, copy: bool) -> np.ndarray:
    """The array MPI reduces: widened for half floats, premultiplied, or a copy."""
    if buf.dtype in HALF_DTYPES:
        work = widen(buf.arr, buf.dtype)
    elif copy or rop.premul is not None:
        work = buf.arr.copy()
    else:
        work = buf.arr
    if rop.premul is not None:
        np.multiply(work, rop.premul, out=work, casting="unsafe")
    return work


def _finish_reduce(dst: Buf, work: np.ndarray, rop: ResolvedOp, n: int) -> None:
    if rop.average:
        _scale_average(work, n)
    if dst.dtype in HALF_DTYPES:
        narrow_into(dst.arr, work, dst.dtype)
    elif work is not dst.arr:
        dst.arr[...] = work.reshape(dst.arr.shape)
    if dst.writeback is not None:
        dst.writeback()


def _writeback(bufs: list[Buf]) -> None:
    for b in bufs:
        if b.writeback is not None:
            b.writeback()


def _reduce_type(arr: np.ndarray) -> Any:
    return mpi_datatype(arr.dtype)


class MPIEngine:
    """Runs the operations of one process group over its MPI communicator."""

    def __init__(self, pg: Any, device_type: str = "cpu") -> None:
        self.pg = pg
        self.comm = pg._comm
        self.device_type = device_type

    # -- helpers -------------------------------------------------------------

    def _work(self, reqs: Any, post: Any, keep: Any, name: str, result: Any = None, on_timeout: Any = None) -> Work:
        return Work(reqs, post, keep, self.pg._timeout_s, (name, self.pg), result, on_timeout)

    # -- collectives ---------------------------------------------------------

    def barrier(self) -> Work:
        return self._work([self.comm.Ibarrier()], None, None, "barrier")

    def broadcast(self, buf: Buf, root: int) -> Work:
        req = self.comm.Ibcast(_msg(buf.arr), root)
        post = buf.writeback if self.comm.Get_rank() != root else None
        return self._work([req], post, buf, "broadcast", buf.obj)

    def all_reduce(self, buf: Buf, rop: ResolvedOp) -> Work:
        from mpi4py import MPI

        arr = buf.arr
        if buf.dtype in HALF_DTYPES or rop.premul is not None or rop.average or buf.writeback is not None:
            work = _prepare(buf, rop, copy=False)
            req = self.comm.Iallreduce(MPI.IN_PLACE, [work, _reduce_type(work)], _mpi_op(rop.mpi_name))
            size = self.comm.Get_size()

            def post() -> None:
                _finish_reduce(buf, work, rop, size)

            return self._work([req], post, (buf, work), "all_reduce", buf.obj)
        req = self.comm.Iallreduce(MPI.IN_PLACE, [arr, mpi_datatype(arr.dtype)], _mpi_op(rop.mpi_name))
        return self._work([req], None, buf, "all_reduce", buf.obj)

    def reduce(self, buf: Buf, root: int, rop: ResolvedOp) -> Work:
        from mpi4py import MPI

        is_root = self.comm.Get_rank() == root
        work = _prepare(buf, rop, copy=False)
        op = _mpi_op(rop.mpi_name)
        if is_root:
            req = self.comm.Ireduce(MPI.IN_PLACE, [work, _reduce_type(work)], op, root)
            size = self.comm.Get_size()

            def post() -> None:
                _finish_reduce(buf, work, rop, size)

            return self._work([req], post, (buf, work), "reduce", buf.obj)
        req = self.comm.Ireduce([work, _reduce_type(work)], None, op, root)
        return self._work([req], None, (buf, work), "reduce", buf.obj)

    def all_gather(self, outs: list[Buf], inp: Buf) -> Work:
        """Gather ``inp`` of every rank into ``outs[r]`` (sizes may differ by rank)."""
        counts = [o.arr.size for o in outs]
        dtype = inp.arr.dtype
        tmp = np.empty(sum(counts), dtype=dtype)
        mt = mpi_datatype(dtype)
        if all(c == counts[0] for c in counts):
            req = self.comm.Iallgather(_msg(inp.arr), [tmp, mt])
        else:
            displs = np.cumsum([0, *counts[:-1]]).tolist()
            req = self.comm.Iallgatherv(_msg(inp.arr), [tmp, (counts, displs), mt])

        def post() -> None:
            _unpack(tmp, outs)

        return self._work([req], post, (outs, inp, tmp), "all_gather", [o.obj for o in outs])

    def all_gather_into(self, out: Buf, inp: Buf) -> Work:
        req = self.comm.Iallgather(_msg(inp.arr), _msg(out.arr))
        return self._work([req], out.writeback, (out, inp), "all_gather_into_tensor", out.obj)

    def gather(self, inp: Buf, outs: list[Buf] | None, root: int) -> Work:
        mt = mpi_datatype(inp.arr.dtype)
        if outs is None:
            req = self.comm.Igatherv(_msg(inp.arr), None, root)
            return self._work([req], None, inp, "gather")
        counts = [o.arr.size for o in outs]
        displs = np.cumsum([0, *counts[:-1]]).tolist()
        tmp = np.empty(sum(counts), dtype=inp.arr.dtype)
        req = self.comm.Igatherv(_msg(inp.arr), [tmp, (counts, displs), mt], root)

        def post() -> None:
            _unpack(tmp, outs)

        return self._work([req], post, (inp, outs, tmp), "gather", [o.obj for o in outs])

    def scatter(self, out: Buf, ins: list[Buf] | None, root: int) -> Work:
        mt = mpi_datatype(out.arr.dtype)
        if ins is None:
            req = self.comm.Iscatterv(None, _msg(out.arr), root)
            keep: Any = out
        else:
            tmp = _pack(ins, out.arr.dtype)
            counts = [b.arr.size for b in ins]
            displs = np.cumsum([0, *counts[:-1]]).tolist()
            req = self.comm.Iscatterv([tmp, (counts, displs), mt], _msg(out.arr), root)
            keep = (out, ins, tmp)
        return self._work([req], out.writeback, keep, "scatter", out.obj)

    def reduce_scatter(self, out: Buf, ins: list[Buf], rop: ResolvedOp) -> Work:
        half = out.dtype in HALF_DTYPES
        counts = [b.arr.size for b in ins]
        send = np.concatenate([widen(b.arr, b.dtype).reshape(-1) for b in ins]) if half else _pack(ins, out.arr.dtype)
        if rop.premul is not None:
            np.multiply(send, rop.premul, out=send, casting="unsafe")
        recv = np.empty(out.arr.size, dtype=send.dtype) if (half or out.writeback is not None) else out.arr
        req = self.comm.Ireduce_scatter(_msg(send), [recv, mpi_datatype(recv.dtype)], counts, _mpi_op(rop.mpi_name))
        size = self.comm.Get_size()

        def post() -> None:
            _finish_reduce(out, recv, rop, size)

        return self._work([req], post, (out, ins, send, recv), "reduce_scatter", out.obj)

    def reduce_scatter_tensor(self, out: Buf, inp: Buf, rop: ResolvedOp) -> Work:
        half = out.dtype in HALF_DTYPES
        send = _prepare(inp, rop, copy=False)
        recv = np.empty(out.arr.size, dtype=send.dtype) if (half or out.writeback is not None) else out.arr
        req = self.comm.Ireduce_scatter_block(_msg(send), [recv, mpi_datatype(recv.dtype)], _mpi_op(rop.mpi_name))
        size = self.comm.Get_size()

        def post() -> None:
            _finish_reduce(out, recv, rop, size)

        return self._work([req], post, (out, inp, send, recv), "reduce_scatter_tensor", out.obj)

    def all_to_all(self, outs: list[Buf], ins: list[Buf]) -> Work:
        dtype = ins[0].arr.dtype
        mt = mpi_datatype(dtype)
        scounts = [b.arr.size for b in ins]
        rcounts = [b.arr.size for b in outs]
        send = _pack(ins, dtype)
        recv = np.empty(sum(rcounts), dtype=dtype)
        sd = np.cumsum([0, *scounts[:-1]]).tolist()
        rd = np.cumsum([0, *rcounts[:-1]]).tolist()
        req = self.comm.Ialltoallv([send, (scounts, sd), mt], [recv, (rcounts, rd), mt])

        def post() -> None:
            _unpack(recv, outs)

        return self._work([req], post, (outs, ins, send, recv), "all_to_all", [o.obj for o in outs])

    def all_to_all_single(self, out: Buf, inp: Buf, rcounts: list[int], scounts: list[int]) -> Work:
        mt = mpi_datatype(inp.arr.dtype)
        sd = np.cumsum([0, *scounts[:-1]]).tolist()
        rd = np.cumsum([0, *rcounts[:-1]]).tolist()
        req = self.comm.Ialltoallv([inp.arr, (scounts, sd), mt], [out.arr, (rcounts, rd), mt])
        return self._work([req], out.writeback, (out, inp), "all_to_all_single", out.obj)

    # -- point to point ------------------------------------------------------

    def send(self, buf: Buf, dst: int, tag: int) -> Work:
        req = self.comm.Isend(_msg(buf.arr), dst, tag)
        return self._work([req], None, buf, "send")

    def recv(self, buf: Buf, src: int, tag: int) -> Work:
        """Receive into ``buf`` from group rank ``src`` (``MPI.ANY_SOURCE`` allowed)."""
        from mpi4py import MPI

        status = MPI.Status()
        req = self.comm.Irecv(_msg(buf.arr), src, tag)
        pg = self.pg
        work: Work

        def post() -> None:
            work._source = pg._ranks[status.Get_source()]
            if buf.writeback is not None:
                buf.writeback()

        def on_timeout() -> None:  # a receive can be cancelled: the group stays usable
            try:
                req.Cancel()
                req.Wait()
            except Exception:
                pass

        work = Work([req], post, buf, pg._timeout_s, ("recv", pg), buf.obj, on_timeout)
        work._status = status
        return work


def _pack(bufs: list[Buf], dtype: np.dtype) -> np.ndarray:
    if not bufs:
        return np.empty(0, dtype=dtype)
    return np.concatenate([b.arr.reshape(-1) for b in bufs])


def _unpack(flat: np.ndarray, outs: list[Buf]) -> None:
    pos = 0
    for o in outs:
        n = o.arr.size
        o.arr.reshape(-1)[...] = flat[pos : pos + n]
        pos += n
    _writeback(outs)


def _factory(pg: Any, device_type: str) -> MPIEngine:
    return MPIEngine(pg, device_type)


register_builtin("mpi", _factory, ("cpu", "cuda"))
register_builtin("gloo", _factory, ("cpu", "cuda"))
