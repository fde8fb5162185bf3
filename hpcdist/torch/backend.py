# mypy: disable-error-code="override,assignment,misc"
# (torch's stubs type ProcessGroup's methods with overloads a Python backend cannot mirror one by one)
"""``HpcdistProcessGroup``: a ``torch.distributed.ProcessGroup`` running on hpcdist's engines.

torch's Python layer (``torch.distributed.all_reduce`` and friends) and its
C++ users (DDP's reducer, functional collectives under DTensor/FSDP2) call
these methods with torch's option structs; each one checks the tensors'
dtypes and the op, then forwards to the matching hpcdist collective on the
group's MPI communicator (:mod:`hpcdist.collectives`, :mod:`hpcdist.p2p`),
which picks the engine for the tensors' device (host MPI or shared memory
on one node, CUDA-aware or staged MPI for CUDA tensors).

* ``opts.asyncOp`` False (a blocking call from Python): the operation runs
  to completion on the calling thread and an already-complete Work returns.
  Both paths use MPI's non-blocking routines (MPI never matches a blocking
  collective with a non-blocking one, and ranks may mix ``async_op``).
* ``opts.asyncOp`` True (``async_op=True``, and every C++ caller): the MPI
  operation starts and a :class:`~hpcdist.torch.work.HpcdistWork` returns,
  completing when the MPI requests do. An all-reduce of a CPU tensor takes
  the MPI engine's non-blocking path even where the group's engine is the
  shared-memory one (whose calls complete before returning), so DDP's
  buckets overlap backward; on one node ranks must then agree on
  ``async_op`` for all-reduces in the shared-memory size window.
* On a group spanning nodes, all_reduce, broadcast, all_gather_into_tensor
  and reduce_scatter_tensor of CPU tensors from ``HPCDIST_HIER_MIN_BYTES`` go
  to the hierarchical engine as they are: blocking ones run there, and
  asynchronous ones on the engine's thread, in program order with them
  (DDP's buckets and FSDP2's gathers overlap the computation). Without
  ``MPI_THREAD_MULTIPLE`` asynchronous ones take the flat path, and ranks
  must agree on ``async_op`` for those calls.
* Called on the progress thread (inside a future's callback, e.g. PowerSGD's):
  the operation runs to completion there, so a callback that waits on it
  cannot block the thread that would complete it.

Ranks in torch's options (``rootRank``, ``dstRank``, ``srcRank``) are group
ranks. SPMD contract: torch's; every member calls the same collectives in
the same order.
"""

from __future__ import annotations

import threading
import weakref
from collections import deque
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NamedTuple

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from .. import collectives as C
from .. import p2p
from ..buffers.adapters import adapt
from ..collectives import combine
from ..ops import resolve_op
from . import progress
from .groups import Attached, detach
from .ops import BackendValueError, check_same_dtype, check_tensors, plain_op, reduce_op, torch_error
from .sparse import all_reduce_sparse
from .work import HpcdistWork, done_work, finish_quietly

__all__ = ["BACKEND_NAME", "DEVICES", "HpcdistProcessGroup"]

BACKEND_NAME = "hpcdist"
DEVICES = ("cpu", "cuda")  # the device types "hpcdist" registers with torch, and a group serves
_get_ident = threading.get_ident
_AllreduceOptions = _c10d.AllreduceOptions
_strided = torch.strided


class _Pairwise(NamedTuple):
    """A method running one hpcdist call per (output, input) pair: torch's name, the call, its argument names."""

    name: str
    call: Callable[[Any, Any, Any, Any, bool], Any]  # (output, input, op or None, hpcdist group, async_op) -> Work
    reduces: bool  # takes opts.reduceOp
    args: tuple[str, str]  # (outputs, inputs) argument names, for errors
    sized_by: int | None = None  # which of (output, input) a hierarchical engine sizes the call by; None: never


_ALL_GATHER = _Pairwise(
    "all_gather",
    lambda o, i, op, g, a: C.all_gather(o, i, group=g, async_op=True),
    False,
    ("output_tensors", "input_tensors"),
)
_ALL_GATHER_INTO = _Pairwise(
    "all_gather_into_tensor",
    lambda o, i, op, g, a: C.all_gather_into_tensor(o, i, group=g, async_op=a),
    False,
    ("output", "input"),
    0,
)
_ALL_GATHER_INTO_MANY = _ALL_GATHER_INTO._replace(name="all_gather_into_tensor_coalesced", args=("outputs", "inputs"))
_REDUCE_SCATTER = _Pairwise(
    "reduce_scatter",
    lambda o, i, op, g, a: C.reduce_scatter(o, i, op, group=g, async_op=True),
    True,
    ("output_tensors", "input_tensors"),
)
_REDUCE_SCATTER_INTO = _Pairwise(
    "reduce_scatter_tensor",
    lambda o, i, op, g, a: C.reduce_scatter_tensor(o, i, op, group=g, async_op=a),
    True,
    ("output", "input"),
    1,
)
_REDUCE_SCATTER_INTO_MANY = _REDUCE_SCATTER_INTO._replace(
    name="reduce_scatter_tensor_coalesced", args=("outputs", "inputs")
)


class HpcdistProcessGroup(dist.ProcessGroup):
    """One torch process group over hpcdist (made by torch through the registered creator)."""

    def __init__(
        self,
        att: Attached,
        rank: int,
        size: int,
        timeout: timedelta,
        group_name: str = "",
        devices: tuple[str, ...] = DEVICES,
    ) -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the (rank, size) overload
        self._devices = [torch.device(d) for d in devices]
        self._att = att
        self._hpg = att.main
        self._timeout = timeout
        self._timeout_s = timeout.total_seconds()
        self._gname = group_name
        self._gdesc = ""
        self._closed = False
        self._g2l = dict(att.main._g2l)
        self._async_engine: Any = None  # the plain MPI engine of asynchronous all-reduces (made on first use)
        self._engine_window: tuple[int, int] | None = None  # sizes of blocking all-reduces the engine takes
        self._hier_from: int | None = -1  # blocking CPU calls from here go hierarchical (None: never; -1: unknown)
        self._in_flight: deque[weakref.ref[HpcdistWork]] = deque()  # async collectives returned: see barrier()

    # -- identity ---------------------------------------------------------------------

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def name(self) -> str:
        return BACKEND_NAME

    def getGroupName(self) -> str:
        return self._gname

    def setGroupName(self, group_name: str) -> None:
        self._gname = group_name

    def getGroupDesc(self) -> str:
        return self._gdesc

    def setGroupDesc(self, group_desc: str) -> None:
        self._gdesc = group_desc

    def __repr__(self) -> str:
        return f"<HpcdistProcessGroup {self._gname!r} rank {self.rank()}/{self.size()}>"

    # -- what torch asks of a group's backends --------------------------------------------
    # torch registers per-device C++ Backends only for the backends it builds itself, so for a
    # Python group ``_device_types`` would list nothing; torch code reading it (the object
    # collectives' device, set_model_state_dict's broadcast_from_rank0, DCP's async_save) then
    # fails. The group answers for itself, as gloo's does for "cpu" and "cuda".

    @property
    def _device_types(self) -> list[Any]:
        """The device types this group serves (torch's device map of the group; gloo lists cpu and cuda)."""
        return list(self._devices)

    def _get_backend(self, device: Any) -> Any:
        """The backend serving ``device``'s type: this group itself (its methods dispatch on the tensors)."""
        return self._backend_for(torch.device(device).type)

    def _backend_for(self, device_type: str) -> Any:
        if all(d.type != device_type for d in self._devices):
            raise RuntimeError(
                f"No backend type associated with device type {device_type} (this hpcdist group serves "
                f"{', '.join(d.type for d in self._devices)})"
            )
        return self

    # torch reads these of a Backend before it asks one for optional features
    supports_splitting = False
    supports_coalescing = False
    supports_shrinking = False
    supports_time_estimate = False

    def supports_tensor_alloc(self, device: Any) -> bool:
        return False

    @property
    def hpcdist_group(self) -> Any:
        """The hpcdist :class:`~hpcdist.group.ProcessGroup` behind this group (its ``comm`` is the MPI one)."""
        return self._hpg

    # -- the one template -------------------------------------------------------------

    def _go(self, name: str, async_op: bool, result: list[Any], start: Callable[[Any], Any]) -> HpcdistWork:
        """Start the MPI operation(s) with ``start(hpcdist_group)``; return a torch Work.

        The non-blocking MPI routines (but for the engine windows above): MPI
        never matches a blocking collective with a non-blocking one, and
        another rank may call this one with ``async_op=True``. Blocking calls (and calls inside a future's
        callback) wait here, on this thread.
        """
        hwork = self._start(start)
        if async_op and progress.PROGRESS.ident != _get_ident():
            return self._async_work(hwork, result, name, self._g2l)
        if hwork is not None:
            hwork.wait()
        return done_work(result, name)

    def _async_work(self, hwork: Any, result: list[Any], name: str, src_map: Any = None) -> HpcdistWork:
        """The torch Work of an asynchronous collective, noted for the group's next barrier (see barrier())."""
        work = HpcdistWork(hwork, result, name, self._timeout_s, src_map)
        if hwork is not None:
            q = self._in_flight
            q.append(weakref.ref(work))
            if len(q) >= 64 and len(q) & (len(q) - 1) == 0:  # pruned at 64, 128, 256 ...: amortized O(1) per call
                self._in_flight = deque(map(weakref.ref, self._pending()))
        return work

    def _pending(self) -> list[HpcdistWork]:
        """The noted asynchronous collectives that are still alive and not complete, oldest first."""
        return [w for r in self._in_flight if (w := r()) is not None and not w._done]

    def _start(self, start: Callable[[Any], Any]) -> Any:
        """``start(hpcdist_group)``; hpcdist's argument errors (raised before any message moved) also as the
        RuntimeError gloo raises there (:func:`~hpcdist.torch.ops.torch_error`)."""
        try:
            return start(self._hpg)
        except (ValueError, TypeError) as exc:
            raise torch_error(exc) from exc.__cause__

    def _many(self, name: str, async_op: bool, result: list[Any], starts: list[Callable[[Any], Any]]) -> Any:
        """Several hpcdist calls as one Work (the coalesced and multi-tensor forms)."""
        if len(starts) == 1:
            return self._go(name, async_op, result, starts[0])
        return self._go(name, async_op, result, lambda g: combine([s(g) for s in starts], name, g))

    # -- collectives --------------------------------------------------------------------

    def broadcast(self, tensors: list[Any], opts: Any = None) -> Any:
        opts = opts or _c10d.BroadcastOptions()
        check_tensors("broadcast", "tensors", tensors)
        root = opts.rootRank
        return self._many(
            "broadcast",
            opts.asyncOp,
            tensors,
            [
                lambda g, t=t: C.broadcast(
                    t, group=g, async_op=opts.asyncOp or not self._across_nodes(t), group_src=root
                )
                for t in tensors
            ],
        )

    def allreduce(self, tensors: list[Any], opts: Any = None) -> Any:
        if type(opts) is _AllreduceOptions and len(tensors) == 1:  # the hot path: torch's all_reduce of one tensor
            t = tensors[0]
            op = plain_op(opts.reduceOp, t.dtype) if t.layout is _strided else None
            if op is not None:  # a (ReduceOp, dtype) pair seen before: no checks left to do
                if opts.asyncOp and progress.PROGRESS.ident != _get_ident():
                    return self._async_work(self._all_reduce_start(t, op, True), tensors, "all_reduce")
                work = self._all_reduce_start(t, op, False)
                if work is not None:  # blocking (or inside a future's callback): complete it on this thread
                    work.wait()
                return HpcdistWork(None, tensors, "all_reduce", 0.0)
        if opts is None:
            opts = _AllreduceOptions()
        elif not isinstance(opts, _AllreduceOptions):  # torch allows allreduce(tensors, ReduceOp)
            op, opts = opts, _AllreduceOptions()
            opts.reduceOp = op
        if tensors and tensors[0].layout is torch.sparse_coo:  # gloo's sparse all-reduce: synchronous, SUM
            return self._go("all_reduce", False, tensors, lambda g: all_reduce_sparse(tensors, opts.reduceOp, g))
        check_tensors("all_reduce", "tensors", tensors)
        op = reduce_op("all_reduce", opts.reduceOp, tensors[0].dtype)
        asynchronous = opts.asyncOp and progress.PROGRESS.ident != _get_ident()
        return self._many(
            "all_reduce",
            opts.asyncOp,
            tensors,
            [lambda g, t=t: self._all_reduce_start(t, op, asynchronous) for t in tensors],
        )

    def _all_reduce_start(self, t: Any, op: Any, asynchronous: bool) -> Any:
        """Start the all-reduce of ``t``; hpcdist's Work.

        An asynchronous one of a CPU tensor takes the MPI engine's
        non-blocking path, which the progress thread drives while the caller
        goes on (DDP's buckets overlap backward). The group's own engine may
        be the shared-memory one (one node, large arrays), whose calls
        complete before they return: blocking calls take it. On a group
        spanning nodes, calls the hierarchical engine takes go to it, blocking
        or not (asynchronous ones run on its thread, beside the caller).
        """
        across = self._across_nodes(t)
        if t.is_cpu and not across and (asynchronous or not self._blocking_in_engine(t.numel() * t.element_size())):
            eng = self._async_engine
            if eng is None:
                from ..backends.mpi import MPIEngine  # imports MPI: not at import time

                eng = self._async_engine = MPIEngine(self._hpg, "cpu")
            buf = adapt(t, "tensor", True)
            return C.all_reduce_start(self._hpg, eng, buf, resolve_op(op, buf.dtype))
        return C.all_reduce(t, op, group=self._hpg, async_op=asynchronous or not across)

    def _across_nodes(self, t: Any) -> bool:
        """Whether a call on ``t`` goes to the hierarchical engine as it is (a blocking call as a blocking hpcdist
        call): where the group spans nodes and that engine takes ``t``'s size.

        Other blocking calls start non-blocking, so that ranks passing different ``async_op`` still meet. Here the
        engine runs blocking calls and asynchronous ones (on its thread) the same way, so they meet too; without
        ``MPI_THREAD_MULTIPLE`` (or with ``HPCDIST_HIER_ASYNC=0``) asynchronous ones take the flat path, and every
        rank must pass the same ``async_op`` (docs/torch.md).
        """
        if not t.is_cpu:
            return False
        start = self._hier_from
        if start == -1:
            from ..backends.hierarchical import HierarchicalEngine

            eng = self._hpg.engine("cpu")
            start = self._hier_from = eng.min_bytes if isinstance(eng, HierarchicalEngine) else None
        return start is not None and t.numel() * t.element_size() >= start

    def _blocking_in_engine(self, nbytes: int) -> bool:
        """Whether a blocking CPU all-reduce of ``nbytes`` takes the group's engine (else the MPI path of the
        asynchronous ones, so that ranks passing different ``async_op`` still meet, as torch's ``Join`` does).

        The engine where its shared memory wins by the measured table (docs/torch.md); on an oversubscribed
        node, where the shared-memory engine takes every size, smaller ones keep MPI's path all the same.
        """
        window = self._engine_window
        if window is None:
            from ..backends.shm import ShmEngine, table

            eng = self._hpg.engine("cpu")
            if isinstance(eng, ShmEngine):
                window = table.window("all_reduce", self._hpg._size, eng.mode, False, eng.selection.rows)
            else:
                window = table.ALWAYS
            self._engine_window = window
        return window[0] <= nbytes < window[1]

    def allreduce_coalesced(self, tensors: list[Any], opts: Any = None) -> Any:
        opts = opts or _c10d.AllreduceCoalescedOptions()
        check_tensors("all_reduce_coalesced", "tensors", tensors)
        check_same_dtype("all_reduce_coalesced", "tensors", tensors)
        op = reduce_op("all_reduce_coalesced", opts.reduceOp, tensors[0].dtype)
        return self._go(
            "all_reduce_coalesced",
            opts.asyncOp,
            tensors,
            lambda g: C.all_reduce_coalesced(tensors, op, group=g, async_op=True),
        )

    def reduce(self, tensors: list[Any], opts: Any = None) -> Any:
        opts = opts or _c10d.ReduceOptions()
        check_tensors("reduce", "tensors", tensors)
        op = reduce_op("reduce", opts.reduceOp, tensors[0].dtype)
        root = opts.rootRank
        return self._many(
            "reduce",
            opts.asyncOp,
            tensors,
            [lambda g, t=t: C.reduce(t, op=op, group=g, async_op=True, group_dst=root) for t in tensors],
        )

    def allgather(self, output_tensors: list[list[Any]], input_tensors: list[Any], opts: Any = None) -> Any:
        return self._pairwise(_ALL_GATHER, output_tensors, input_tensors, opts or _c10d.AllgatherOptions())

    def all_gather_single(self, output: Any, input: Any, opts: Any = None) -> Any:
        return self._pairwise(_ALL_GATHER_INTO, [output], [input], opts or _c10d.AllgatherOptions())

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: list[Any], inputs: list[Any], opts: Any = None) -> Any:
        return self._pairwise(_ALL_GATHER_INTO_MANY, outputs, inputs, opts or _c10d.AllgatherOptions())

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def allgather_coalesced(self, output_lists: list[list[Any]], input_list: list[Any], opts: Any = None) -> Any:
        opts = opts or _c10d.AllgatherOptions()
        check_tensors("all_gather_coalesced", "input_tensor_list", input_list)
        return self._go(
            "all_gather_coalesced",
            opts.asyncOp,
            _flat(output_lists),
            lambda g: C.all_gather_coalesced(output_lists, input_list, group=g, async_op=True),
        )

    def gather(self, output_tensors: list[list[Any]], input_tensors: list[Any], opts: Any = None) -> Any:
        opts = opts or _c10d.GatherOptions()
        check_tensors("gather", "input_tensors", input_tensors)
        root = opts.rootRank
        outs = output_tensors[0] if output_tensors else None
        return self._go(
            "gather",
            opts.asyncOp,
            list(outs or []),
            lambda g: C.gather(input_tensors[0], outs, group=g, async_op=True, group_dst=root),
        )

    def scatter(self, output_tensors: list[Any], input_tensors: list[list[Any]], opts: Any = None) -> Any:
        opts = opts or _c10d.ScatterOptions()
        check_tensors("scatter", "output_tensors", output_tensors)
        root = opts.rootRank
        ins = input_tensors[0] if input_tensors else None
        return self._go(
            "scatter",
            opts.asyncOp,
            list(output_tensors),
            lambda g: C.scatter(output_tensors[0], ins, group=g, async_op=True, group_src=root),
        )

    def reduce_scatter(self, output_tensors: list[Any], input_tensors: list[list[Any]], opts: Any = None) -> Any:
        return self._pairwise(_REDUCE_SCATTER, output_tensors, input_tensors, opts or _c10d.ReduceScatterOptions())

    def reduce_scatter_single(self, output: Any, input: Any, opts: Any = None) -> Any:
        return self._pairwise(_REDUCE_SCATTER_INTO, [output], [input], opts or _c10d.ReduceScatterOptions())

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: list[Any], inputs: list[Any], opts: Any = None) -> Any:
        return self._pairwise(_REDUCE_SCATTER_INTO_MANY, outputs, inputs, opts or _c10d.ReduceScatterOptions())

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def _pairwise(self, spec: _Pairwise, outputs: list[Any], inputs: list[Any], opts: Any) -> Any:
        """One hpcdist call per (output, input) pair (``spec.call``), as one Work; the flat outputs are its result."""
        check_tensors(spec.name, spec.args[1], inputs)
        check_tensors(spec.name, spec.args[0], outputs)
        result = _flat(outputs)
        op = reduce_op(spec.name, opts.reduceOp, result[0].dtype) if spec.reduces and result else None
        call, by, asynchronous = spec.call, spec.sized_by, opts.asyncOp
        return self._many(
            spec.name,
            asynchronous,
            result,
            [
                lambda g, o=o, i=i: call(o, i, op, g, asynchronous or by is None or not self._across_nodes((o, i)[by]))
                for o, i in zip(outputs, inputs, strict=True)
            ],
        )

    def alltoall(self, output_tensors: list[Any], input_tensors: list[Any], opts: Any = None) -> Any:
        opts = opts or _c10d.AllToAllOptions()
        check_tensors("all_to_all", "input_tensors", input_tensors)
        return self._go(
            "all_to_all",
            opts.asyncOp,
            list(output_tensors),
            lambda g: C.all_to_all(output_tensors, input_tensors, group=g, async_op=True),
        )

    def all_to_all_single(
        self, output: Any, input: Any, output_split_sizes: list[int], input_split_sizes: list[int], opts: Any = None
    ) -> Any:
        opts = opts or _c10d.AllToAllOptions()
        check_tensors("all_to_all_single", "input", [input, output])
        outs, ins = list(output_split_sizes) or None, list(input_split_sizes) or None
        return self._go(
            "all_to_all_single",
            opts.asyncOp,
            [output],
            lambda g: C.all_to_all_single(output, input, outs, ins, group=g, async_op=True),
        )

    alltoall_base = all_to_all_single

    def barrier(self, opts: Any = None) -> Any:
        """gloo's barrier: complete once every rank entered it and this rank's earlier collectives of the group
        completed (held Works too, not only dropped ones: code written for gloo reads their outputs after it)."""
        opts = opts or _c10d.BarrierOptions()
        earlier = self._pending()
        self._in_flight.clear()
        work = self._go("barrier", opts.asyncOp, [], lambda g: C.barrier(group=g, async_op=True))
        if earlier:
            if work._done:  # a blocking barrier: it has completed
                finish_quietly(earlier)
            else:
                work._then = earlier  # waited for by its wait()
        return work

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """hpcdist's monitored barrier on this group, its errors worded as gloo's (logs and tests grep for them).

        Rank 0 raises "Rank N failed to pass monitoredBarrier in T ms" naming the group rank(s) that did
        not arrive within ``timeout`` ("Rank 0 timed out in monitoredBarrier" when ``timeout`` is zero);
        the other ranks "Rank R successfully reached monitoredBarrier, but received errors while waiting
        for send/recv from rank 0". Both are :class:`~hpcdist.errors.DistTimeoutError` (a RuntimeError).
        """
        from ..debug import monitored_barrier
        from ..errors import DistTimeoutError

        secs = _limit_seconds(timeout, self._timeout_s)
        try:  # a zero timeout is gloo's "no time at all": hpcdist takes 1 µs, timedelta's resolution
            monitored_barrier(self._hpg, timeout=max(secs, 1e-6), wait_all_ranks=wait_all_ranks)
        except DistTimeoutError as exc:
            ms = int(secs * 1000)
            me = self.rank()
            if me != 0:
                what = (
                    f"Rank {me} successfully reached monitoredBarrier, but received errors while waiting for "
                    "send/recv from rank 0. Please check rank 0 logs for faulty rank."
                )
            elif secs <= 0:
                what = f"Rank 0 timed out in monitoredBarrier after {ms} ms."
            else:
                ranks = [self._g2l.get(g, g) for g in getattr(exc, "missing_ranks", [])]
                what = (
                    f"Rank{'s' if len(ranks) > 1 else ''} {', '.join(map(str, ranks))} failed to pass "
                    f"monitoredBarrier in {ms} ms."
                )
            raise DistTimeoutError(f"[Rank {me}]: {what} ({exc})") from exc

    # -- point to point (always asynchronous: torch waits on the Work) --------------------

    def send(self, tensors: list[Any], dstRank: int, tag: int) -> Any:
        check_tensors("send", "tensors", tensors)
        return self._p2p("send", tensors, lambda g: p2p.isend(tensors[0], group=g, tag=tag, group_dst=dstRank))

    def recv(self, tensors: list[Any], srcRank: int, tag: int) -> Any:
        check_tensors("recv", "tensors", tensors)
        return self._p2p("recv", tensors, lambda g: p2p.irecv(tensors[0], group=g, tag=tag, group_src=srcRank))

    def recv_anysource(self, tensors: list[Any], tag: int) -> Any:
        check_tensors("recv", "tensors", tensors)
        return self._p2p("recv", tensors, lambda g: p2p.irecv(tensors[0], group=g, tag=tag))

    def _p2p(self, name: str, tensors: list[Any], start: Callable[[Any], Any]) -> Any:
        if len(tensors) != 1:
            raise BackendValueError(f"hpcdist backend: {name} takes exactly one tensor, got {len(tensors)}")
        hwork = self._start(start)
        work = HpcdistWork(hwork, list(tensors), name, self._timeout_s, self._g2l)
        if progress.PROGRESS.ident == _get_ident():  # inside a future's callback: complete it here
            work.wait()
        return work

    # -- lifetime ---------------------------------------------------------------------------

    def shutdown(self) -> None:
        """Free the MPI communicators (torch's destroy_process_group calls this)."""
        if not self._closed:
            self._closed = True
            detach(self._att)

    def abort(self) -> None:
        self._hpg.abort()


def _limit_seconds(timeout: Any, default_s: float) -> float:
    """torch's timeout argument (timedelta, seconds or None: the group's) in seconds."""
    if timeout is None:
        return default_s
    return timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)


def _flat(items: list[Any]) -> list[Any]:
    """The tensors of a list whose elements are tensors or lists of tensors."""
    return [t for x in items for t in (x if isinstance(x, (list, tuple)) else (x,))]
