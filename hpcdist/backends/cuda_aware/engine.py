"""Device arrays over a CUDA-aware MPI: device pointers handed to MPI.

The ``mpi`` backend builds :class:`CudaAwareEngine` for ``device_type
"cuda"`` when :func:`hpcdist.gpu.cuda_aware_mpi` says so, else the staged
engine (:mod:`hpcdist.backends.staged`); the choice is made in
:func:`hpcdist.backends.selection.select_engine` when a group first moves
device arrays.

The arrays' streams are synchronized before MPI touches the
memory (MPI does not know CUDA streams); device-side work around MPI (packing,
half-float widening, PREMUL_SUM, AVG, unpacking) runs on the array's stream
and is synchronized before MPI reads it and before the Work completes. A
completed Work means the data is in the user's arrays.
"""

from __future__ import annotations

from typing import Any

from ...buffers.adapters import Buf, apart
from ...buffers.dtypes import HALF_DTYPES, mpi_datatype
from ...buffers.packing import displacements
from ...gpu import xp
from ...gpu.streams import check_devices, streams_of, synchronize
from ...ops import ResolvedOp
from ...work import Work, hold
from ..engine import Engine
from ..mpi.engine import MPIEngine, _mpi_op, _msg

__all__ = ["CudaAwareEngine"]


def _counts_displs(counts: list[int]) -> tuple[list[int], list[int]]:
    return counts, displacements(counts)


class CudaAwareEngine(Engine):
    """The MPI engine's operations with CUDA device buffers handed to a CUDA-aware MPI."""

    kind = "cuda-aware"

    def __init__(self, pg: Any, device_type: str = "cuda") -> None:
        self.pg = pg
        self.comm = pg._comm
        self.device_type = device_type
        self.host = MPIEngine(pg, device_type)  # operations that need no device-side work

    # -- helpers -------------------------------------------------------------

    def _begin(self, bufs: list[Buf], name: str) -> list[Any]:
        check_devices(bufs, self.pg, name)
        streams = streams_of(bufs)
        synchronize(streams)  # MPI reads/writes the memory outside any stream
        return streams

    def _work(self, reqs: list[Any], post: Any, keep: Any, name: str, result: Any, streams: list[Any]) -> Work:
        def finish() -> None:
            if post is not None:
                with streams[0]:
                    post()
            synchronize(streams)

        work = Work(reqs, finish, keep, self.pg._timeout_s, (name, self.pg), result)
        hold(work, streams)  # a CuPy Stream destroys its CUDA stream in __del__ (see hold)
        return work

    def _wrap(self, inner: Any, streams: list[Any], name: str) -> Work:
        """A host-engine Work on device buffers: its finishing step runs on the array's stream, then the streams sync."""
        work = inner.chain(lambda: synchronize(streams), within=streams[0], name=(name, self.pg))
        hold(work, streams)
        return work

    def _size(self) -> int:
        return int(self.comm.Get_size())

    # -- operations the host engine runs unchanged on device pointers ------------

    def barrier(self, sync: bool = False, timeout_s: float | None = None) -> Work | None:
        return self.host.barrier(sync=False, timeout_s=timeout_s)

    def broadcast(self, buf: Buf, root: int, sync: bool = False) -> Work:
        streams = self._begin([buf], "broadcast")
        return self._wrap(self.host.broadcast(buf, root, sync=False), streams, "broadcast")

    def _apart(self, inp: Buf, out: Buf, streams: list[Any], slot: tuple[bool, int] | None = None) -> Buf:
        """:func:`apart` on the array's stream, the copy finished before MPI reads it (the host engine's check then passes)."""
        with streams[0]:
            fresh = apart(inp, out, slot)
        if fresh is not inp:
            synchronize(streams[:1])
        return fresh

    def all_gather_into(self, out: Buf, inp: Buf, sync: bool = False) -> Work:
        streams = self._begin([out, inp], "all_gather_into_tensor")
        inp = self._apart(inp, out, streams, (True, int(self.comm.Get_rank())))
        return self._wrap(self.host.all_gather_into(out, inp, sync=False), streams, "all_gather_into_tensor")

    def all_to_all_single(self, out: Buf, inp: Buf, rcounts: list[int], scounts: list[int], sync: bool = False) -> Work:
        streams = self._begin([out, inp], "all_to_all_single")
        inp = self._apart(inp, out, streams)
        return self._wrap(
            self.host.all_to_all_single(out, inp, rcounts, scounts, sync=False), streams, "all_to_all_single"
        )

    def send(self, buf: Buf, dst: int, tag: int) -> Work:
        streams = self._begin([buf], "send")
        return self._wrap(self.host.send(buf, dst, tag), streams, "send")

    def recv(self, buf: Buf, src: int, tag: int) -> Work:
        streams = self._begin([buf], "recv")
        return self._wrap(self.host.recv(buf, src, tag), streams, "recv")

    # -- reductions: device-side prepare/finish around MPI ---------------------

    def all_reduce(self, buf: Buf, rop: ResolvedOp, sync: bool = False) -> Work:
        from mpi4py import MPI

        streams = self._begin([buf], "all_reduce")
        if rop.direct:  # MPI's op on the device array itself
            return self._wrap(self.host.all_reduce(buf, rop, sync=False), streams, "all_reduce")
        with streams[0]:
            work = xp.prepare(buf, rop, copy=False)
        synchronize(streams)
        req = self.comm.Iallreduce(MPI.IN_PLACE, _msg(work), _mpi_op(rop.mpi_name))
        n = self._size()
        return self._work(
            [req], lambda: xp.finish_reduce(buf, work, rop, n), (buf, work), "all_reduce", buf.obj, streams
        )

    def reduce(self, buf: Buf, root: int, rop: ResolvedOp, sync: bool = False) -> Work:
        from mpi4py import MPI

        streams = self._begin([buf], "reduce")
        is_root = self.comm.Get_rank() == root
        with streams[0]:
            work = xp.prepare(buf, rop, copy=False)
        synchronize(streams)
        op = _mpi_op(rop.mpi_name)
        if not is_root:
            req = self.comm.Ireduce(_msg(work), None, op, root)
            return self._work([req], None, (buf, work), "reduce", buf.obj, streams)
        req = self.comm.Ireduce(MPI.IN_PLACE, _msg(work), op, root)
        n = self._size()
        return self._work([req], lambda: xp.finish_reduce(buf, work, rop, n), (buf, work), "reduce", buf.obj, streams)

    def reduce_scatter(self, out: Buf, ins: list[Buf], rop: ResolvedOp, sync: bool = False) -> Work:
        streams = self._begin([out, *ins], "reduce_scatter")
        counts = [b.arr.size for b in ins]
        with streams[0]:
            if rop.ordered:
                send = xp.order_keys(xp.pack(ins, out.arr.dtype), out.dtype, rop.kind)
            elif out.dtype in HALF_DTYPES:
                send = xp.widen(xp.pack(ins, out.arr.dtype), out.dtype)
            else:
                send = xp.pack(ins, out.arr.dtype)
            if rop.premul is not None:
                xp.premultiply(send, rop.premul)
            recv = xp.empty(out.arr.size, send.dtype)
        synchronize(streams)
        req = self.comm.Ireduce_scatter(_msg(send), _msg(recv), counts, _mpi_op(rop.mpi_name))
        n = self._size()
        return self._work(
            [req],
            lambda: xp.finish_reduce(out, recv, rop, n),
            (out, ins, send, recv),
            "reduce_scatter",
            out.obj,
            streams,
        )

    def reduce_scatter_tensor(self, out: Buf, inp: Buf, rop: ResolvedOp, sync: bool = False) -> Work:
        streams = self._begin([out, inp], "reduce_scatter_tensor")
        with streams[0]:
            send = xp.prepare(inp, rop, copy=False)
            recv = xp.empty(out.arr.size, send.dtype)
        synchronize(streams)
        req = self.comm.Ireduce_scatter_block(_msg(send), _msg(recv), _mpi_op(rop.mpi_name))
        n = self._size()
        return self._work(
            [req],
            lambda: xp.finish_reduce(out, recv, rop, n),
            (out, inp, send, recv),
            "reduce_scatter_tensor",
            out.obj,
            streams,
        )

    # -- gathers and all-to-all: device temporaries ---------------------------

    def all_gather(self, outs: list[Buf], inp: Buf, sync: bool = False) -> Work:
        streams = self._begin([inp, *outs], "all_gather")
        counts = [o.arr.size for o in outs]
        with streams[0]:
            tmp = xp.empty(sum(counts), inp.arr.dtype)
        synchronize(streams)
        mt = mpi_datatype(inp.arr.dtype)
        if all(c == counts[0] for c in counts):
            req = self.comm.Iallgather(_msg(inp.arr), [tmp, mt])
        else:
            req = self.comm.Iallgatherv(_msg(inp.arr), [tmp, _counts_displs(counts), mt])
        return self._work(
            [req], lambda: xp.unpack(tmp, outs), (outs, inp, tmp), "all_gather", [o.obj for o in outs], streams
        )

    def gather(self, inp: Buf, outs: list[Buf] | None, root: int, sync: bool = False) -> Work:
        streams = self._begin([inp, *(outs or [])], "gather")
        if outs is None:
            req = self.comm.Igatherv(_msg(inp.arr), None, root)
            return self._work([req], None, inp, "gather", None, streams)
        counts = [o.arr.size for o in outs]
        with streams[0]:
            tmp = xp.empty(sum(counts), inp.arr.dtype)
        synchronize(streams)
        mt = mpi_datatype(inp.arr.dtype)
        req = self.comm.Igatherv(_msg(inp.arr), [tmp, _counts_displs(counts), mt], root)
        return self._work(
            [req], lambda: xp.unpack(tmp, outs), (inp, outs, tmp), "gather", [o.obj for o in outs], streams
        )

    def scatter(self, out: Buf, ins: list[Buf] | None, root: int, sync: bool = False) -> Work:
        streams = self._begin([out, *(ins or [])], "scatter")
        post = out.writeback
        if ins is None:
            req = self.comm.Iscatterv(None, _msg(out.arr), root)
            return self._work([req], post, out, "scatter", out.obj, streams)
        with streams[0]:
            tmp = xp.pack(ins, out.arr.dtype)
        synchronize(streams)
        mt = mpi_datatype(out.arr.dtype)
        counts = [b.arr.size for b in ins]
        req = self.comm.Iscatterv([tmp, _counts_displs(counts), mt], _msg(out.arr), root)
        return self._work([req], post, (out, ins, tmp), "scatter", out.obj, streams)

    def all_to_all(self, outs: list[Buf], ins: list[Buf], sync: bool = False) -> Work:
        streams = self._begin([*ins, *outs], "all_to_all")
        dtype = ins[0].arr.dtype
        mt = mpi_datatype(dtype)
        scounts = [b.arr.size for b in ins]
        rcounts = [b.arr.size for b in outs]
        with streams[0]:
            send = xp.pack(ins, dtype)
            recv = xp.empty(sum(rcounts), dtype)
        synchronize(streams)
        req = self.comm.Ialltoallv([send, _counts_displs(scounts), mt], [recv, _counts_displs(rcounts), mt])
        return self._work(
            [req], lambda: xp.unpack(recv, outs), (outs, ins, send, recv), "all_to_all", [o.obj for o in outs], streams
        )
