"""Device arrays over an MPI that is not CUDA-aware: staged through pinned host blocks.

For each operation: the arrays MPI reads are copied device -> pinned host
(asynchronously on their streams, then synchronized), the host engine runs
the operation on host :class:`~hpcdist.buffers.adapters.Buf` views of the
blocks, and the Work's completion step copies what MPI wrote back to the
device, synchronizes, runs the user's writebacks and returns the blocks to
the pool (:mod:`hpcdist.backends.staged.pinned`), which reuses them across calls. A
completed Work means the data is in the user's device arrays. Blocks of an
operation that timed out are not reused (MPI may still write into them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...buffers.adapters import Buf
from ...gpu.streams import check_devices, require_cupy, stream_for, synchronize
from ...ops import ResolvedOp
from ...work import Work
from ..engine import Engine
from ..mpi import MPIEngine
from .pinned import PinnedPool, host_view, pinned_pool

__all__ = ["StagedEngine"]


#: bytes per piece of a pipelined all_reduce; arrays of two pieces or more are pipelined
PIPELINE_CHUNK = 4 << 20


class _Staging:
    """The host twins of one operation's device Bufs, and their blocks."""

    __slots__ = ("blocks", "pool", "twins")

    def __init__(self, pool: PinnedPool) -> None:
        self.pool = pool
        # id(device buf) -> (host twin, stream, device pointer, host pointer, bytes)
        self.twins: dict[int, tuple[Buf, Any, int, int, int]] = {}
        self.blocks: list[Any] = []

    def host(self, buf: Buf) -> Buf:
        hit = self.twins.get(id(buf))
        if hit is not None:
            return hit[0]
        dev = buf.arr
        n = dev.nbytes
        block = self.pool.acquire(n)
        self.blocks.append(block)
        arr = host_view(block, dev.dtype, tuple(dev.shape), n)
        twin = Buf(arr, buf.obj, buf.dtype, "cpu", None, -1)
        hptr = arr.__array_interface__["data"][0] if n else 0
        self.twins[id(buf)] = (twin, stream_for(buf), int(dev.data.ptr), hptr, n)
        return twin

    def copy(self, bufs: list[Buf], to_host: bool, limit: int | None = None) -> None:
        """Device -> host (``to_host``) or back, for ``bufs``; waits for the copies.

        ``limit``: copy at most these many bytes of each (what a receive got: the rest of the device array
        stays as it was, where the reused block holds another call's bytes)."""
        runtime = _runtime()
        kind = runtime.memcpyDeviceToHost if to_host else runtime.memcpyHostToDevice
        streams: dict[int, Any] = {}
        for b in bufs:
            _twin, stream, dptr, hptr, n = self.twins[id(b)]
            if limit is not None:
                n = min(n, limit)
            if n:
                src, dst = (dptr, hptr) if to_host else (hptr, dptr)
                runtime.memcpyAsync(dst, src, n, kind, stream.ptr)
            streams.setdefault(int(stream.ptr), stream)
        synchronize(streams.values())

    def release(self) -> None:
        for block in self.blocks:
            self.pool.release(block)
        self.blocks = []


def _runtime() -> Any:
    if not _RUNTIME:
        _RUNTIME.append(require_cupy().cuda.runtime)
    return _RUNTIME[0]


_RUNTIME: list[Any] = []


def _received_bytes(work: Work) -> int:
    """The bytes a finished host receive got (its ``MPI.Status``)."""
    from mpi4py import MPI

    return int(work._status.Get_count(MPI.BYTE))


def _writeback(writes: list[Buf]) -> None:
    for b in writes:
        if b.writeback is not None:  # a non-contiguous user array: copy into it, on its library's stream
            b.writeback()
            stream_for(b).synchronize()  # complete means in place, for readers on any stream too


class StagedEngine(Engine):
    """The MPI engine's operations on device arrays, through pinned host copies."""

    kind = "staged"

    def __init__(self, pg: Any, device_type: str = "cuda", pool: PinnedPool | None = None) -> None:
        self.pg = pg
        self.host = MPIEngine(pg, device_type)
        self.pool = pool if pool is not None else pinned_pool()
        self._lost: list[Any] = []
        self._streams: dict[int, tuple[Any, Any]] = {}

    def _run(
        self,
        name: str,
        reads: list[Buf],
        writes: list[Buf],
        start: Callable[[Callable[[Buf], Buf], bool], Any],
        sync: bool = False,
        received: Callable[[Work], int] | None = None,
    ) -> Work | None:
        """Stage ``reads`` in, ``start`` the host operation, stage ``writes`` out on completion.

        ``sync``: the host engine's blocking call (no Work, no polling), then
        the copies back, before returning None.
        ``received``: for a receive, the bytes the finished host Work got; only those are copied back.
        """
        check_devices([*reads, *writes], self.pg, name)
        st = _Staging(self.pool)
        for b in (*reads, *writes):
            st.host(b)
        if sync:
            try:
                st.copy(reads, to_host=True)
                inner = start(st.host, True)
                if inner is not None:
                    inner.wait()
                st.copy(writes, to_host=False)
            except BaseException:
                self._quarantine(st)
                raise
            st.release()
            _writeback(writes)
            return None
        try:
            st.copy(reads, to_host=True)
            inner = start(st.host, False)
        except BaseException:
            st.release()
            raise

        def back() -> None:  # after the host operation finished (if it failed, its blocks are dropped, not reused)
            try:
                st.copy(writes, to_host=False, limit=None if received is None else received(inner))
            finally:
                st.release()
            _writeback(writes)

        return inner.chain(back, name=(name, self.pg))

    def _quarantine(self, st: _Staging) -> None:
        """Keep the blocks of a failed blocking call alive and out of the pool: MPI may still write into them."""
        self._lost.extend(st.blocks)
        st.blocks = []

    @staticmethod
    def _async(work: Work | None) -> Work:
        assert work is not None  # _run without sync always returns the Work
        return work

    def _is_root(self, root: int) -> bool:
        return bool(self.pg._rank == root)

    # -- operations ----------------------------------------------------------

    def barrier(self, sync: bool = False, timeout_s: float | None = None) -> Work | None:
        return self.host.barrier(sync=False, timeout_s=timeout_s)

    def broadcast(self, buf: Buf, root: int, sync: bool = False) -> Work | None:
        me = self._is_root(root)
        if buf.arr.nbytes >= 2 * PIPELINE_CHUNK:  # the same choice on every rank: sizes match in broadcast
            return self._pipelined(
                "broadcast", buf, me, not me, lambda part: self.host.broadcast(part, root, sync=True), sync
            )
        return self._run(
            "broadcast",
            [buf] if me else [],
            [] if me else [buf],
            lambda h, s: self.host.broadcast(h(buf), root, sync=s),
            sync,
        )

    def all_reduce(self, buf: Buf, rop: ResolvedOp, sync: bool = False) -> Work | None:
        if buf.arr.nbytes >= 2 * PIPELINE_CHUNK:  # the same choice on every rank: sizes match in all_reduce
            return self._pipelined(
                "all_reduce", buf, True, True, lambda part: self.host.all_reduce(part, rop, sync=True), sync
            )
        return self._run("all_reduce", [buf], [buf], lambda h, s: self.host.all_reduce(h(buf), rop, sync=s), sync)

    def _pipelined(
        self, name: str, buf: Buf, reads: bool, writes: bool, piece_op: Callable[[Buf], Any], sync: bool
    ) -> Work | None:
        """``name`` in PIPELINE_CHUNK pieces: device -> host copies, MPI and host -> device copies overlap.

        Each piece is copied down on one stream (when MPI reads this rank's
        array: ``reads``), handed to ``piece_op`` (the host engine's blocking
        call on that piece) once its copy is done, and copied back on another
        stream (when MPI writes this rank's array: ``writes``)
        while the next pieces are still coming down. Both streams first wait
        for the array's stream. The call returns once the last piece is back,
        also with ``async_op=True`` (its Work is then complete), so that every
        rank runs the same pieces.
        """
        check_devices([buf], self.pg, name)
        cupy = require_cupy()
        rt = _runtime()
        dev = buf.arr
        n, item = int(dev.nbytes), int(dev.itemsize)
        step = max(item, PIPELINE_CHUNK // item * item)
        down, up = self._pipe_streams(buf.index)
        ready = cupy.cuda.Event(block=False, disable_timing=True)
        ready.record(stream_for(buf))
        down.wait_event(ready)
        up.wait_event(ready)
        block = self.pool.acquire(n)
        host = host_view(block, dev.dtype, (int(dev.size),), n)
        hptr, dptr = host.__array_interface__["data"][0], int(dev.data.ptr)
        pieces = []
        for off in range(0, n, step):
            k = min(step, n - off)
            copied = None
            if reads:
                rt.memcpyAsync(hptr + off, dptr + off, k, rt.memcpyDeviceToHost, down.ptr)
                copied = cupy.cuda.Event(block=False, disable_timing=True)
                copied.record(down)
            pieces.append((off, k, copied))
        try:
            for off, k, copied in pieces:
                if copied is not None:
                    copied.synchronize()
                piece_op(Buf(host[off // item : (off + k) // item], buf.obj, buf.dtype, "cpu", None, -1))
                if writes:
                    rt.memcpyAsync(dptr + off, hptr + off, k, rt.memcpyHostToDevice, up.ptr)
            up.synchronize()
        except BaseException:
            down.synchronize()
            self._lost.append(block)  # MPI may still write into it
            raise
        self.pool.release(block)
        if writes:
            _writeback([buf])
        return None if sync else Work((), None, None, self.pg._timeout_s, (name, self.pg), buf.obj)

    def _pipe_streams(self, device: int) -> tuple[Any, Any]:
        """Two non-blocking streams of ``device`` (copies down, copies up), made once."""
        pair = self._streams.get(device)
        if pair is None:
            cupy = require_cupy()
            with cupy.cuda.Device(device):
                pair = (cupy.cuda.Stream(non_blocking=True), cupy.cuda.Stream(non_blocking=True))
            self._streams[device] = pair
        return pair

    def reduce(self, buf: Buf, root: int, rop: ResolvedOp, sync: bool = False) -> Work | None:
        if buf.arr.nbytes >= 2 * PIPELINE_CHUNK:  # the same choice on every rank: sizes match in reduce
            return self._pipelined(
                "reduce",
                buf,
                True,
                self._is_root(root),
                lambda part: self.host.reduce(part, root, rop, sync=True),
                sync,
            )
        return self._run(
            "reduce",
            [buf],
            [buf] if self._is_root(root) else [],
            lambda h, s: self.host.reduce(h(buf), root, rop, sync=s),
            sync,
        )

    def all_gather(self, outs: list[Buf], inp: Buf, sync: bool = False) -> Work | None:
        return self._run(
            "all_gather", [inp], outs, lambda h, s: self.host.all_gather([h(o) for o in outs], h(inp), sync=s), sync
        )

    def all_gather_into(self, out: Buf, inp: Buf, sync: bool = False) -> Work | None:
        return self._run(
            "all_gather_into_tensor", [inp], [out], lambda h, s: self.host.all_gather_into(h(out), h(inp), sync=s), sync
        )

    def gather(self, inp: Buf, outs: list[Buf] | None, root: int, sync: bool = False) -> Work | None:
        return self._run(
            "gather",
            [inp],
            outs or [],
            lambda h, s: self.host.gather(h(inp), None if outs is None else [h(o) for o in outs], root, sync=s),
            sync,
        )

    def scatter(self, out: Buf, ins: list[Buf] | None, root: int, sync: bool = False) -> Work | None:
        return self._run(
            "scatter",
            ins or [],
            [out],
            lambda h, s: self.host.scatter(h(out), None if ins is None else [h(b) for b in ins], root, sync=s),
            sync,
        )

    def reduce_scatter(self, out: Buf, ins: list[Buf], rop: ResolvedOp, sync: bool = False) -> Work | None:
        return self._run(
            "reduce_scatter",
            ins,
            [out],
            lambda h, s: self.host.reduce_scatter(h(out), [h(b) for b in ins], rop, sync=s),
            sync,
        )

    def reduce_scatter_tensor(self, out: Buf, inp: Buf, rop: ResolvedOp, sync: bool = False) -> Work | None:
        return self._run(
            "reduce_scatter_tensor",
            [inp],
            [out],
            lambda h, s: self.host.reduce_scatter_tensor(h(out), h(inp), rop, sync=s),
            sync,
        )

    def all_to_all(self, outs: list[Buf], ins: list[Buf], sync: bool = False) -> Work | None:
        return self._run(
            "all_to_all",
            ins,
            outs,
            lambda h, s: self.host.all_to_all([h(o) for o in outs], [h(b) for b in ins], sync=s),
            sync,
        )

    def all_to_all_single(
        self, out: Buf, inp: Buf, rcounts: list[int], scounts: list[int], sync: bool = False
    ) -> Work | None:
        return self._run(
            "all_to_all_single",
            [inp],
            [out],
            lambda h, s: self.host.all_to_all_single(h(out), h(inp), rcounts, scounts, sync=s),
            sync,
        )

    def send(self, buf: Buf, dst: int, tag: int) -> Work:
        return self._async(self._run("send", [buf], [], lambda h, s: self.host.send(h(buf), dst, tag)))

    def recv(self, buf: Buf, src: int, tag: int) -> Work:
        # a message may be shorter than the array: only what came is copied back (the block is not read from the device)
        return self._async(
            self._run("recv", [], [buf], lambda h, s: self.host.recv(h(buf), src, tag), received=_received_bytes)
        )
