"""The ``nccl`` backend: CUDA arrays through NCCL (via ``cupy.cuda.nccl``).

One NCCL communicator per process group, created on the group's first NCCL
operation: rank 0 makes the unique id, the group's MPI communicator
broadcasts it (bounded by the group's timeout), every member joins on its
current CUDA device. Freed by ``destroy_process_group``.

Stream semantics (torch's): each operation is enqueued on the current stream
of the library owning the arrays (torch's for torch tensors, CuPy's
otherwise) and returns at once; its :class:`~hpcdist.backends.nccl.work.CudaEventWork`
holds an event recorded after it. ``wait()`` orders the caller's current
stream after it without blocking the host; ``synchronize()`` blocks the host.

What NCCL lacks raises before anything is enqueued
(:mod:`hpcdist.backends.nccl.types`): 16-bit integers, bitwise ops, complex
MIN/MAX/PRODUCT, receives from any source, host arrays (a group with
``backend="nccl"`` moves CUDA arrays only; ``"cpu:mpi,cuda:nccl"`` sends host
arrays to MPI). ``barrier`` and the object collectives run over MPI. Data
movement sends bytes, so every dtype moves. gather/scatter/all_to_all and
uneven all_gather/reduce_scatter are grouped NCCL point-to-point calls.

SPMD contract as for every backend; in addition NCCL needs one GPU per rank
(two ranks of a group on one GPU fail in NCCL's init).
"""

from __future__ import annotations

from typing import Any, Literal, overload

import numpy as np

from ...buffers.adapters import Buf, apart, is_torch
from ...config import nccl_watchdog_enabled
from ...errors import DistBackendError, DistTimeoutError
from ...gpu import xp
from ...gpu.streams import capturing, check_devices, require_cupy, stream_for
from ...ops import ResolvedOp
from ...work import Work, wait_requests
from ..engine import Engine
from .types import NCCL_BYTE, NcclReduction, nccl_reduction
from .watchdog import nccl_watchdog
from .work import _DROPPED, CudaEventWork, release_dropped

__all__ = ["NCCLEngine", "available"]


def _nccl_module() -> Any:
    require_cupy("the NCCL backend")
    from cupy.cuda import nccl

    if not getattr(nccl, "available", False):
        raise DistBackendError(
            "backend 'nccl': this CuPy cannot load NCCL (cupy.cuda.nccl.available is False); install NCCL "
            "(pip install nvidia-nccl-cu12) or use backend='mpi'"
        )
    return nccl


def available() -> bool:
    """Whether NCCL can be used here: CuPy with NCCL, and a CUDA device."""
    try:
        import cupy
        from cupy.cuda import nccl
    except Exception:
        return False
    if not getattr(nccl, "available", False):
        return False
    try:
        return int(cupy.cuda.runtime.getDeviceCount()) > 0
    except Exception:
        return False


#: NCCL_UNIQUE_ID_BYTES in nccl.h
UNIQUE_ID_BYTES = 128


def unique_id_bytes(uid: Any) -> np.ndarray:
    """``nccl.get_unique_id()``'s id as its 128 raw bytes (uint8).

    CuPy 14 returns ``bytes``; older CuPy returns a tuple built from C ``char``
    values: -128..127 where ``char`` is signed (x86-64), 0..255 where it is
    unsigned (aarch64, ppc64le). The bytes are the same in every form; only
    they travel over MPI.
    """
    values = tuple(uid)
    if len(values) != UNIQUE_ID_BYTES:
        raise DistBackendError(f"NCCL unique id must have {UNIQUE_ID_BYTES} bytes, got {len(values)}")
    return np.array([int(x) & 0xFF for x in values], dtype=np.uint8)


def make_communicator(ctor: Any, size: int, raw: np.ndarray, rank: int) -> Any:
    """``ctor(size, id, rank)`` (``NcclCommunicator``) with the id in the form this CuPy takes.

    Only rank 0 called ``get_unique_id``, so the form is found by trying, before
    NCCL is called: ``bytes`` (CuPy >= 14; older CuPy raises TypeError), then a
    tuple of signed ``char`` values, then unsigned ones (CuPy raises
    OverflowError for a value outside the platform's ``char``).
    """
    u = np.asarray(raw, dtype=np.uint8).reshape(-1)
    forms = (u.tobytes(), tuple(int(x) for x in u.view(np.int8)), tuple(int(x) for x in u))
    last: Exception | None = None
    for form in forms:
        try:
            return ctor(size, form, rank)
        except (TypeError, OverflowError) as exc:
            last = exc
    raise DistBackendError(f"cupy.cuda.nccl.NcclCommunicator took no form of the unique id: {last}") from last


def _ptr(arr: Any, offset_bytes: int = 0) -> int:
    return int(arr.data.ptr) + offset_bytes


def _scaled(buf: Buf, factor: Any, copy: bool) -> Any:
    """``buf.arr * factor`` (a copy when ``copy``) in the array's own dtype; bfloat16 via float32."""
    arr = buf.arr.copy() if copy else buf.arr
    if buf.dtype == "bfloat16":
        wide = xp.widen(arr, "bfloat16")
        xp.premultiply(wide, factor)
        xp.narrow_into(arr, wide, "bfloat16")
    else:
        xp.premultiply(arr, factor)
    return arr


def _divide(arr: Any, dtype: str, n: int) -> None:
    if dtype == "bfloat16":
        wide = xp.widen(arr, "bfloat16")
        xp.scale_average(wide, n)
        xp.narrow_into(arr, wide, "bfloat16")
    else:
        xp.scale_average(arr, n)


def _writeback(bufs: list[Buf]) -> None:
    for b in bufs:
        if b.writeback is not None:
            b.writeback()


class _Calling:
    """``with engine._calling(name):`` turns NCCL's errors into DistBackendError naming the call and group."""

    __slots__ = ("engine", "name")

    def __init__(self, engine: NCCLEngine, name: str) -> None:
        self.engine, self.name = engine, name

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind: Any, exc: Any, tb: Any) -> None:
        if exc is not None and isinstance(exc, self.engine.nccl.NcclError):
            raise DistBackendError(f"NCCL {self.name} on group {self.engine.pg.group_name!r} failed: {exc}") from exc


class NCCLEngine(Engine):
    """Runs one process group's CUDA-array operations through its NCCL communicator."""

    kind = "nccl"

    batches_p2p = True

    def __init__(self, pg: Any, device_type: str = "cuda") -> None:
        if device_type != "cuda":
            raise ValueError(f"the NCCL backend moves CUDA arrays only, not {device_type} arrays")
        self.pg = pg
        self.nccl = _nccl_module()
        self.version = int(self.nccl.get_version())
        self._comm: Any = None
        self._device = -1
        self._host: Any = None
        self._plans: dict[tuple[str, Any], NcclReduction] = {}  # (dtype, op kind) -> plan, for ops without a factor
        self._watch = nccl_watchdog() if nccl_watchdog_enabled() else None

    # -- communicator ------------------------------------------------------------

    def _communicator(self, device: int) -> Any:
        if self._comm is not None:
            if device != self._device:
                raise ValueError(
                    f"group {self.pg.group_name!r} runs NCCL on cuda:{self._device}, but the arrays and current device "
                    f"are cuda:{device}; one group uses one GPU per rank (torch.cuda.set_device({self._device}))"
                )
            return self._comm
        pg = self.pg
        uid = np.zeros(UNIQUE_ID_BYTES, dtype=np.uint8)
        if pg._rank == 0:
            uid[:] = unique_id_bytes(self.nccl.get_unique_id())
        if not wait_requests([pg._comm.Ibcast(uid, 0)], pg._timeout_s):
            raise DistTimeoutError(
                f"NCCL init of group {pg.group_name!r}: not every rank made its first NCCL call within "
                f"{pg._timeout_s:g}s (every rank must call the same collectives in the same order)"
            )
        cupy = require_cupy()
        with cupy.cuda.Device(device), self._calling("communicator init"):
            self._comm = make_communicator(self.nccl.NcclCommunicator, pg._size, uid, pg._rank)
        self._device = device
        return self._comm

    def _calling(self, name: str) -> _Calling:
        return _Calling(self, name)

    def close(self) -> None:
        if self._watch is not None:
            self._watch.forget(self)
        if _DROPPED:
            release_dropped()
        comm, self._comm = self._comm, None
        if comm is not None:
            comm.destroy()

    # -- what the watchdog asks ----------------------------------------------------

    def async_error(self) -> str | None:
        """``ncclCommGetAsyncError`` of this group's communicator, as a message; None when fine."""
        comm = self._comm
        if comm is None:
            return None
        try:
            comm.check_async_error()
        except self.nccl.NcclError as exc:
            return f"NCCL communicator of group {self.pg.group_name!r} failed asynchronously: {exc}"
        return None

    def abort_nccl(self) -> None:
        """``ncclCommAbort``: NCCL kernels of this communicator stop; the communicator is unusable."""
        comm, self._comm = self._comm, None
        if comm is not None:
            comm.abort()

    # -- the template ------------------------------------------------------------

    def _begin(self, bufs: list[Buf], name: str) -> tuple[Any, Any]:
        device = check_devices(bufs, self.pg, name)
        comm = self._communicator(device)
        s = stream_for(bufs[0])
        if len(bufs) > 1:  # arrays of both libraries (CuPy and torch): after the other one's current stream too
            first = is_torch(bufs[0].obj)
            for b in bufs:
                if is_torch(b.obj) != first:
                    other = stream_for(b)
                    if int(other.ptr) != int(s.ptr):
                        s.wait_event(other.record())
                    break
        return comm, s

    @overload
    def _end(
        self, stream: Any, ref: Buf, keep: Any, name: str, result: Any, source: int = -1, *, sync: Literal[False] = ...
    ) -> CudaEventWork: ...
    @overload
    def _end(
        self, stream: Any, ref: Buf, keep: Any, name: str, result: Any, source: int = -1, *, sync: bool
    ) -> CudaEventWork | None: ...
    def _end(
        self, stream: Any, ref: Buf, keep: Any, name: str, result: Any, source: int = -1, *, sync: bool = False
    ) -> CudaEventWork | None:
        """The Work of the operation just enqueued on ``stream``; None for a blocking call.

        A blocking call (``async_op=False``) needs no Work: torch's
        ``work.wait()`` would make the current stream, which is ``stream``,
        wait for itself. Temporaries die on the host at once, which is safe:
        CuPy's pool reuses their memory only in order on ``stream``. The
        caller's arrays may have come from another stream's pool, though, so
        on a side stream (not the default one) a blocking call keeps them in
        :data:`~hpcdist.backends.nccl.work._DROPPED` until the operation
        completed, as a dropped Work does. Every operation is noted to the
        NCCL watchdog (unless it is off).
        """
        captured = capturing(stream)  # a captured operation runs at each replay: unwatched, its event never asked
        if not captured:
            if self._watch is not None:
                self._watch.note(stream, (name, self.pg), self.pg._timeout_s, self)
            if _DROPPED:
                release_dropped()
        if sync and (captured or not stream.ptr):
            return None
        cupy = require_cupy()
        event = cupy.cuda.Event(block=False, disable_timing=True)
        event.record(stream)
        if sync:
            _DROPPED.append((event, keep, result))
            return None
        return CudaEventWork(
            event, keep, self.pg._timeout_s, (name, self.pg), result, self._device, is_torch(ref.obj), source, captured
        )

    def check_reduction(self, dtype: str, rop: ResolvedOp) -> None:
        self._plan(dtype, rop)

    def _plan(self, dtype: str, rop: ResolvedOp) -> NcclReduction:
        if rop.premul is not None:  # the factor varies call by call
            return nccl_reduction(dtype, rop, self.version)
        key = (dtype, rop.kind)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = nccl_reduction(dtype, rop, self.version)
        return plan

    def _copy(self, dst: Any, src: Any, stream: Any) -> None:
        if src.nbytes:
            rt = require_cupy().cuda.runtime
            rt.memcpyAsync(_ptr(dst), _ptr(src), src.nbytes, rt.memcpyDeviceToDevice, stream.ptr)

    # -- barrier: MPI --------------------------------------------------------------

    def barrier(self, sync: bool = False, timeout_s: float | None = None) -> Any:
        """An MPI barrier after this rank's queued GPU work finished (torch's NCCL barrier blocks the host too)."""
        require_cupy("barrier on an NCCL group").cuda.Device().synchronize()  # every stream of this GPU
        if self._host is None:
            from ..mpi import MPIEngine

            self._host = MPIEngine(self.pg, "cpu")
        return self._host.barrier(sync=sync, timeout_s=timeout_s)

    # -- collectives -------------------------------------------------------------

    def broadcast(self, buf: Buf, root: int, sync: bool = False) -> CudaEventWork | None:
        comm, s = self._begin([buf], "broadcast")
        with s, self._calling("broadcast"):
            comm.broadcast(_ptr(buf.arr), _ptr(buf.arr), buf.arr.nbytes, NCCL_BYTE, root, s.ptr)
            if self.pg._rank != root:
                _writeback([buf])
        return self._end(s, buf, buf, "broadcast", buf.obj, sync=sync)

    def all_reduce(self, buf: Buf, rop: ResolvedOp, sync: bool = False) -> CudaEventWork | None:
        plan = self._plan(buf.dtype, rop)
        comm, s = self._begin([buf], "all_reduce")
        arr = buf.arr
        with s, self._calling("all_reduce"):
            if plan.premul is not None:
                _scaled(buf, plan.premul, copy=False)
            comm.allReduce(_ptr(arr), _ptr(arr), arr.size * plan.per_element, plan.datatype, plan.op, s.ptr)
            if plan.divide_after:
                _divide(arr, buf.dtype, self.pg._size)
            _writeback([buf])
        return self._end(s, buf, buf, "all_reduce", buf.obj, sync=sync)

    def reduce(self, buf: Buf, root: int, rop: ResolvedOp, sync: bool = False) -> CudaEventWork | None:
        plan = self._plan(buf.dtype, rop)
        comm, s = self._begin([buf], "reduce")
        arr = buf.arr
        is_root = self.pg._rank == root
        with s, self._calling("reduce"):
            send = arr if plan.premul is None else _scaled(buf, plan.premul, copy=True)
            recv = arr if is_root else send  # NCCL writes recvbuff on the root only
            comm.reduce(_ptr(send), _ptr(recv), arr.size * plan.per_element, plan.datatype, plan.op, root, s.ptr)
            if is_root:
                if plan.divide_after:
                    _divide(arr, buf.dtype, self.pg._size)
                _writeback([buf])
        return self._end(s, buf, (buf, send), "reduce", buf.obj, sync=sync)

    def all_gather(self, outs: list[Buf], inp: Buf, sync: bool = False) -> CudaEventWork | None:
        comm, s = self._begin([inp, *outs], "all_gather")
        counts = [o.arr.size for o in outs]
        me = self.pg._rank
        with s, self._calling("all_gather"):
            if all(c == counts[0] for c in counts):
                tmp = xp.empty(sum(counts), inp.arr.dtype)
                comm.allGather(_ptr(inp.arr), _ptr(tmp), inp.arr.nbytes, NCCL_BYTE, s.ptr)
                xp.unpack(tmp, outs)
                keep: Any = (inp, outs, tmp)
            else:  # uneven: one broadcast per rank, grouped
                self.nccl.groupStart()
                try:
                    for r, o in enumerate(outs):
                        src = inp.arr if r == me else o.arr
                        comm.broadcast(_ptr(src), _ptr(o.arr), o.arr.nbytes, NCCL_BYTE, r, s.ptr)
                finally:
                    self.nccl.groupEnd()
                _writeback(outs)
                keep = (inp, outs)
        return self._end(s, inp, keep, "all_gather", [o.obj for o in outs], sync=sync)

    def all_gather_into(self, out: Buf, inp: Buf, sync: bool = False) -> CudaEventWork | None:
        comm, s = self._begin([out, inp], "all_gather_into_tensor")
        with s, self._calling("all_gather_into_tensor"):
            inp = apart(inp, out, (True, self.pg._rank))  # NCCL's only aliased form is in place; a copy on s
            comm.allGather(_ptr(inp.arr), _ptr(out.arr), inp.arr.nbytes, NCCL_BYTE, s.ptr)
            _writeback([out])
        return self._end(s, out, (out, inp), "all_gather_into_tensor", out.obj, sync=sync)

    def gather(self, inp: Buf, outs: list[Buf] | None, root: int, sync: bool = False) -> CudaEventWork | None:
        comm, s = self._begin([inp, *(outs or [])], "gather")
        me = self.pg._rank
        with s, self._calling("gather"):
            self.nccl.groupStart()
            try:
                if outs is None:
                    if inp.arr.nbytes:  # the root skips empty receives: skip the empty send too
                        comm.send(_ptr(inp.arr), inp.arr.nbytes, NCCL_BYTE, root, s.ptr)
                else:
                    for r, o in enumerate(outs):
                        if r == me:
                            self._copy(o.arr, inp.arr, s)
                        elif o.arr.nbytes:
                            comm.recv(_ptr(o.arr), o.arr.nbytes, NCCL_BYTE, r, s.ptr)
            finally:
                self.nccl.groupEnd()
            _writeback(outs or [])
        return self._end(s, inp, (inp, outs), "gather", None if outs is None else [o.obj for o in outs], sync=sync)

    def scatter(self, out: Buf, ins: list[Buf] | None, root: int, sync: bool = False) -> CudaEventWork | None:
        comm, s = self._begin([out, *(ins or [])], "scatter")
        me = self.pg._rank
        with s, self._calling("scatter"):
            self.nccl.groupStart()
            try:
                if ins is None:
                    if out.arr.nbytes:
                        comm.recv(_ptr(out.arr), out.arr.nbytes, NCCL_BYTE, root, s.ptr)
                else:
                    for r, b in enumerate(ins):
                        if r == me:
                            self._copy(out.arr, b.arr, s)
                        elif b.arr.nbytes:
                            comm.send(_ptr(b.arr), b.arr.nbytes, NCCL_BYTE, r, s.ptr)
            finally:
                self.nccl.groupEnd()
            _writeback([out])
        return self._end(s, out, (out, ins), "scatter", out.obj, sync=sync)

    def reduce_scatter(self, out: Buf, ins: list[Buf], rop: ResolvedOp, sync: bool = False) -> CudaEventWork | None:
        plan = self._plan(out.dtype, rop)
        comm, s = self._begin([out, *ins], "reduce_scatter")
        counts = [b.arr.size for b in ins]
        per, item = plan.per_element, out.arr.itemsize
        with s, self._calling("reduce_scatter"):
            send = xp.pack(ins, out.arr.dtype)
            if plan.premul is not None:
                _scaled(Buf(send, None, out.dtype, "cuda", None, out.index), plan.premul, copy=False)
            if all(c == counts[0] for c in counts):
                comm.reduceScatter(_ptr(send), _ptr(out.arr), out.arr.size * per, plan.datatype, plan.op, s.ptr)
            else:  # uneven: one reduce per rank, grouped
                self.nccl.groupStart()
                try:
                    pos = 0
                    for r, c in enumerate(counts):
                        src = _ptr(send, pos * item)
                        dst = _ptr(out.arr) if r == self.pg._rank else src
                        comm.reduce(src, dst, c * per, plan.datatype, plan.op, r, s.ptr)
                        pos += c
                finally:
                    self.nccl.groupEnd()
            if plan.divide_after:
                _divide(out.arr, out.dtype, self.pg._size)
            _writeback([out])
        return self._end(s, out, (out, ins, send), "reduce_scatter", out.obj, sync=sync)

    def reduce_scatter_tensor(self, out: Buf, inp: Buf, rop: ResolvedOp, sync: bool = False) -> CudaEventWork | None:
        plan = self._plan(out.dtype, rop)
        comm, s = self._begin([out, inp], "reduce_scatter_tensor")
        with s, self._calling("reduce_scatter_tensor"):
            inp = apart(inp, out, (False, self.pg._rank))  # an output in the input, but not in place: a copy on s
            send = inp.arr if plan.premul is None else _scaled(inp, plan.premul, copy=True)
            comm.reduceScatter(
                _ptr(send), _ptr(out.arr), out.arr.size * plan.per_element, plan.datatype, plan.op, s.ptr
            )
            if plan.divide_after:
                _divide(out.arr, out.dtype, self.pg._size)
            _writeback([out])
        return self._end(s, out, (out, inp, send), "reduce_scatter_tensor", out.obj, sync=sync)

    def _exchange(
        self,
        comm: Any,
        s: Any,
        sends: list[tuple[int, int]],
        recvs: list[tuple[int, int]],
        self_copy: tuple[int, int, int],
    ) -> None:
        """Grouped sends (ptr, nbytes) to rank r and receives from rank r; this rank's part copied."""
        me = self.pg._rank
        rt = require_cupy().cuda.runtime
        self.nccl.groupStart()
        try:
            for r in range(self.pg._size):
                if r == me:
                    dst, src, n = self_copy
                    if n:
                        rt.memcpyAsync(dst, src, n, rt.memcpyDeviceToDevice, s.ptr)
                    continue
                if sends[r][1]:
                    comm.send(sends[r][0], sends[r][1], NCCL_BYTE, r, s.ptr)
                if recvs[r][1]:
                    comm.recv(recvs[r][0], recvs[r][1], NCCL_BYTE, r, s.ptr)
        finally:
            self.nccl.groupEnd()

    def all_to_all(self, outs: list[Buf], ins: list[Buf], sync: bool = False) -> CudaEventWork | None:
        comm, s = self._begin([*ins, *outs], "all_to_all")
        me = self.pg._rank
        sends = [(_ptr(b.arr), b.arr.nbytes) for b in ins]
        recvs = [(_ptr(o.arr), o.arr.nbytes) for o in outs]
        with s, self._calling("all_to_all"):
            self._exchange(comm, s, sends, recvs, (recvs[me][0], sends[me][0], sends[me][1]))
            _writeback(outs)
        return self._end(s, ins[0], (outs, ins), "all_to_all", [o.obj for o in outs], sync=sync)

    def all_to_all_single(
        self, out: Buf, inp: Buf, rcounts: list[int], scounts: list[int], sync: bool = False
    ) -> CudaEventWork | None:
        comm, s = self._begin([out, inp], "all_to_all_single")
        me, item = self.pg._rank, inp.arr.itemsize

        def spans(arr: Any, counts: list[int]) -> list[tuple[int, int]]:
            out_, pos = [], 0
            for c in counts:
                out_.append((_ptr(arr, pos * item), c * item))
                pos += c
            return out_

        with s, self._calling("all_to_all_single"):
            inp = apart(inp, out)  # overlapping (or the same) arrays: the sends read a copy, made on s
            sends, recvs = spans(inp.arr, scounts), spans(out.arr, rcounts)
            self._exchange(comm, s, sends, recvs, (recvs[me][0], sends[me][0], sends[me][1]))
            _writeback([out])
        return self._end(s, out, (out, inp), "all_to_all_single", out.obj, sync=sync)

    # -- point to point --------------------------------------------------------

    def _peer(self, peer: int, what: str) -> None:
        if peer < 0:
            raise ValueError(f"{what}: NCCL cannot receive from any source; pass src (a rank) explicitly")

    def send(self, buf: Buf, dst: int, tag: int) -> CudaEventWork:
        comm, s = self._begin([buf], "send")
        with s, self._calling("send"):
            comm.send(_ptr(buf.arr), buf.arr.nbytes, NCCL_BYTE, dst, s.ptr)
        return self._end(s, buf, buf, "send", None)

    def recv(self, buf: Buf, src: int, tag: int) -> CudaEventWork:
        self._peer(src, "recv")
        comm, s = self._begin([buf], "recv")
        with s, self._calling("recv"):
            comm.recv(_ptr(buf.arr), buf.arr.nbytes, NCCL_BYTE, src, s.ptr)
            _writeback([buf])
        return self._end(s, buf, buf, "recv", buf.obj, self.pg._ranks[src])

    def batch_p2p(self, ops: list[tuple[bool, Buf, int, int]]) -> list[Work]:
        """``(is_send, buf, group peer, tag)`` as one NCCL group (what batch_isend_irecv needs)."""
        for is_send, _buf, peer, _tag in ops:
            if not is_send:
                self._peer(peer, "batch_isend_irecv")
        comm, s = self._begin([b for _, b, _, _ in ops], "batch_isend_irecv")
        with s, self._calling("batch_isend_irecv"):
            self.nccl.groupStart()
            try:
                for is_send, b, peer, _tag in ops:
                    call = comm.send if is_send else comm.recv
                    call(_ptr(b.arr), b.arr.nbytes, NCCL_BYTE, peer, s.ptr)
            finally:
                self.nccl.groupEnd()
            _writeback([b for is_send, b, _, _ in ops if not is_send])
        ref = ops[0][1]
        return [
            self._end(
                s,
                ref,
                b,
                "send" if is_send else "recv",
                None if is_send else b.obj,
                -1 if is_send else self.pg._ranks[peer],
            )
            for is_send, b, peer, _ in ops
        ]
