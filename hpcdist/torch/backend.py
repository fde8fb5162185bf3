# mypy: disable-error-code="override,assignment,misc"
# (torch's stubs type ProcessGroup's methods with overloads a Python backend cannot mirror one by one)
"""``HpcdistProcessGroup``: a ``torch.distributed.ProcessGroup`` running on hpcdist's engines.

torch's Python layer (``torch.distributed.all_reduce`` and friends) and its
C++ users (DDP's reducer, functional collectives under DTensor/FSDP2) call
these methods with torch's option structs; each one checks the tensors'
dtypes and the op, then forwards to the matching hpcdist collective on the
group's MPI communicator (:mod:`hpcdist.collectives`, :mod:`hpcdist.p2p`),
which picks the engine for the tensors' device (host MPI, CUDA-aware or
staged MPI for CUDA tensors).

* ``opts.asyncOp`` False (a blocking call from Python): the operation runs
  to completion on the calling thread and an already-complete Work returns.
  Both paths use MPI's non-blocking routines (MPI never matches a blocking
  collective with a non-blocking one, and ranks may mix ``async_op``).
* ``opts.asyncOp`` True (``async_op=True``, and every C++ caller): the MPI
  operation starts and a :class:`~hpcdist.torch.work.HpcdistWork` returns,
  completing when the MPI requests do.
* Called on the progress thread (inside a future's callback, e.g. PowerSGD's):
  the operation runs to completion there, so a callback that waits on it
  cannot block the thread that would complete it.

Ranks in torch's options (``rootRank``, ``dstRank``, ``srcRank``) are group
ranks. SPMD contract: torch's; every member calls the same collectives in
the same order.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C import _distributed_c10d as _c10d

from .. import collectives as C
from .. import p2p
from ..collectives import combine
from . import progress
from .groups import Attached, detach
from .ops import check_tensors, reduce_op
from .sparse import all_reduce_sparse
from .work import HpcdistWork, done_work

__all__ = ["BACKEND_NAME", "HpcdistProcessGroup"]

BACKEND_NAME = "hpcdist"
_get_ident = threading.get_ident


class HpcdistProcessGroup(dist.ProcessGroup):
    """One torch process group over hpcdist (made by torch through the registered creator)."""

    def __init__(self, att: Attached, rank: int, size: int, timeout: timedelta, group_name: str = "") -> None:
        super().__init__(rank, size)  # type: ignore[call-arg]  # the (rank, size) overload
        self._att = att
        self._hpg = att.main
        self._timeout = timeout
        self._timeout_s = timeout.total_seconds()
        self._gname = group_name
        self._gdesc = ""
        self._closed = False
        self._g2l = dict(att.main._g2l)

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

    @property
    def hpcdist_group(self) -> Any:
        """The hpcdist :class:`~hpcdist.group.ProcessGroup` behind this group (its ``comm`` is the MPI one)."""
        return self._hpg

    # -- the one template -------------------------------------------------------------

    def _go(self, name: str, async_op: bool, result: list[Any], start: Callable[[Any], Any]) -> HpcdistWork:
        """Start the MPI operation(s) with ``start(hpcdist_group)``; return a torch Work.

        Always the non-blocking MPI routines: MPI never matches a blocking
        collective with a non-blocking one, and another rank may call this
        one with ``async_op=True``. Blocking calls (and calls inside a future's
        callback) wait here, on this thread.
        """
        if async_op and progress.PROGRESS.ident != _get_ident():
            return HpcdistWork(start(self._hpg), result, name, self._timeout_s, self._g2l)
        work = start(self._hpg)
        if work is not None:
            work.wait()
        return done_work(result, name)

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
            [lambda g, t=t: C.broadcast(t, group=g, async_op=True, group_src=root) for t in tensors],
        )

    def allreduce(self, tensors: list[Any], opts: Any = None) -> Any:
        if opts is None:
            opts = _c10d.AllreduceOptions()
        elif not isinstance(opts, _c10d.AllreduceOptions):  # torch allows allreduce(tensors, ReduceOp)
            op, opts = opts, _c10d.AllreduceOptions()
            opts.reduceOp = op
        if tensors and tensors[0].layout is torch.sparse_coo:  # gloo's sparse all-reduce: synchronous, SUM
            return self._go("all_reduce", False, tensors, lambda g: all_reduce_sparse(tensors, opts.reduceOp, g))
        check_tensors("all_reduce", "tensors", tensors)
        op = reduce_op("all_reduce", opts.reduceOp, tensors[0].dtype)
        if len(tensors) == 1 and not opts.asyncOp:  # the hot path: one tensor, blocking
            work = C.all_reduce(tensors[0], op, group=self._hpg, async_op=True)
            if work is not None:
                work.wait()
            return done_work(tensors, "all_reduce")
        return self._many(
            "all_reduce",
            opts.asyncOp,
            tensors,
            [lambda g, t=t: C.all_reduce(t, op, group=g, async_op=True) for t in tensors],
        )

    def allreduce_coalesced(self, tensors: list[Any], opts: Any = None) -> Any:
        opts = opts or _c10d.AllreduceCoalescedOptions()
        check_tensors("all_reduce_coalesced", "tensors", tensors)
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
        opts = opts or _c10d.AllgatherOptions()
        check_tensors("all_gather", "input_tensors", input_tensors)
        check_tensors("all_gather", "output_tensors", output_tensors)
        return self._many(
            "all_gather",
            opts.asyncOp,
            _flat(output_tensors),
            [
                lambda g, o=o, i=i: C.all_gather(o, i, group=g, async_op=True)
                for o, i in zip(output_tensors, input_tensors, strict=True)
            ],
        )

    def all_gather_single(self, output: Any, input: Any, opts: Any = None) -> Any:
        opts = opts or _c10d.AllgatherOptions()
        check_tensors("all_gather_into_tensor", "input", [input, output])
        return self._go(
            "all_gather_into_tensor",
            opts.asyncOp,
            [output],
            lambda g: C.all_gather_into_tensor(output, input, group=g, async_op=True),
        )

    _allgather_base = all_gather_single

    def allgather_coalesced(self, output_lists: list[list[Any]], input_list: list[Any], opts: Any = None) -> Any:
        opts = opts or _c10d.AllgatherOptions()
        check_tensors("all_gather_coalesced", "input_tensor_list", input_list)
        return self._go(
            "all_gather_coalesced",
            opts.asyncOp,
            _flat(output_lists),
            lambda g: C.all_gather_coalesced(output_lists, input_list, group=g, async_op=True),
        )

    def all_gather_single_coalesced(self, outputs: list[Any], inputs: list[Any], opts: Any = None) -> Any:
        opts = opts or _c10d.AllgatherOptions()
        check_tensors("all_gather_into_tensor_coalesced", "inputs", inputs)
        return self._many(
            "all_gather_into_tensor_coalesced",
            opts.asyncOp,
            list(outputs),
            [
                lambda g, o=o, i=i: C.all_gather_into_tensor(o, i, group=g, async_op=True)
                for o, i in zip(outputs, inputs, strict=True)
            ],
        )

    allgather_into_tensor_coalesced = all_gather_single_coalesced

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
        opts = opts or _c10d.ReduceScatterOptions()
        check_tensors("reduce_scatter", "output_tensors", output_tensors)
        op = reduce_op("reduce_scatter", opts.reduceOp, output_tensors[0].dtype)
        return self._many(
            "reduce_scatter",
            opts.asyncOp,
            list(output_tensors),
            [
                lambda g, o=o, i=i: C.reduce_scatter(o, i, op, group=g, async_op=True)
                for o, i in zip(output_tensors, input_tensors, strict=True)
            ],
        )

    def reduce_scatter_single(self, output: Any, input: Any, opts: Any = None) -> Any:
        opts = opts or _c10d.ReduceScatterOptions()
        check_tensors("reduce_scatter_tensor", "output", [output, input])
        op = reduce_op("reduce_scatter_tensor", opts.reduceOp, output.dtype)
        return self._go(
            "reduce_scatter_tensor",
            opts.asyncOp,
            [output],
            lambda g: C.reduce_scatter_tensor(output, input, op, group=g, async_op=True),
        )

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: list[Any], inputs: list[Any], opts: Any = None) -> Any:
        opts = opts or _c10d.ReduceScatterOptions()
        check_tensors("reduce_scatter_tensor_coalesced", "outputs", outputs)
        op = reduce_op("reduce_scatter_tensor_coalesced", opts.reduceOp, outputs[0].dtype)
        return self._many(
            "reduce_scatter_tensor_coalesced",
            opts.asyncOp,
            list(outputs),
            [
                lambda g, o=o, i=i: C.reduce_scatter_tensor(o, i, op, group=g, async_op=True)
                for o, i in zip(outputs, inputs, strict=True)
            ],
        )

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

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
        opts = opts or _c10d.BarrierOptions()
        return self._go("barrier", opts.asyncOp, [], lambda g: C.barrier(group=g, async_op=True))

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """hpcdist's monitored barrier on this group: names the ranks that did not arrive within ``timeout``."""
        from ..debug import monitored_barrier

        monitored_barrier(self._hpg, timeout=timeout, wait_all_ranks=wait_all_ranks)

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
            raise ValueError(f"hpcdist backend: {name} takes exactly one tensor, got {len(tensors)}")
        work = HpcdistWork(start(self._hpg), list(tensors), name, self._timeout_s, self._g2l)
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


def _flat(lists: list[list[Any]]) -> list[Any]:
    return [t for lst in lists for t in lst]
