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
* ``opts.asyncOp`` True (``async_op=True``, and every C++ caller): the MPI
  operation starts and a :class:`~hpcdist.torch.work.HpcdistWork` returns,
  completing when the MPI requests do.
* Called on the progress thread (inside a future's callback): the operation
  runs to completion there, on the group's callback communicator.

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

    def __repr__(self) -> str:
        return f"<HpcdistProcessGroup {self._gname!r} rank {self.rank()}/{self.size()}>"

    # torch names a group after its creator returns (_set_group_name/_set_group_desc) and reads the
    # names back (destroy_process_group, functional collectives); the C++ base keeps them on its
    # registered backends, of which a Python ProcessGroup has none, so they live here.
    def _set_group_name(self, name: str) -> None:
        self._gname = name

    @property
    def group_name(self) -> str:
        return self._gname

    def _set_group_desc(self, desc: str) -> None:
        self._gdesc = desc

    @property
    def group_desc(self) -> str:
        return self._gdesc

    @property
    def hpcdist_group(self) -> Any:
        """The hpcdist :class:`~hpcdist.group.ProcessGroup` behind this group (its ``comm`` is the MPI one)."""
        return self._hpg

    # -- the one template -------------------------------------------------------------

    def _go(self, name: str, async_op: bool, result: list[Any], start: Callable[[Any, bool], Any]) -> HpcdistWork:
        """Run ``start(hpcdist_group, async_op)``; wrap what it returns in a torch Work."""
        if progress.PROGRESS.ident == _get_ident():  # inside a future callback: synchronous, callback comm
            start(self._att.cb, False)
            return done_work(result, name)
        if not async_op:
            start(self._hpg, False)
            return done_work(result, name)
        return HpcdistWork(start(self._hpg, True), result, name, self._timeout_s, self._g2l)

    def _many(self, name: str, async_op: bool, result: list[Any], starts: list[Callable[[Any, bool], Any]]) -> Any:
        """Several hpcdist calls as one Work (the coalesced and multi-tensor forms)."""
        if len(starts) == 1:
            return self._go(name, async_op, result, starts[0])

        def start(g: Any, a: bool) -> Any:
            if not a:
                for s in starts:
                    s(g, False)
                return None
            return combine([s(g, True) for s in starts], name, g)

        return self._go(name, async_op, result, start)

    # -- collectives --------------------------------------------------------------------

    def broadcast(self, tensors: list[Any], opts: Any = None) -> Any:
        opts = opts or _c10d.BroadcastOptions()
        check_tensors("broadcast", "tensors", tensors)
        root = opts.rootRank
        return self._many(
            "broadcast",
            opts.asyncOp,
            tensors,
            [lambda g, a, t=t: C.broadcast(t, group=g, async_op=a, group_src=root) for t in tensors],
        )

    def allreduce(self, tensors: list[Any], opts: Any = None) -> Any:
        if opts is None:
            opts = _c10d.AllreduceOptions()
        elif not isinstance(opts, _c10d.AllreduceOptions):  # torch allows allreduce(tensors, ReduceOp)
            op, opts = opts, _c10d.AllreduceOptions()
            opts.reduceOp = op
        if tensors and tensors[0].layout is torch.sparse_coo:  # gloo's sparse all-reduce: synchronous, SUM
            return self._go("all_reduce", False, tensors, lambda g, a: all_reduce_sparse(tensors, opts.reduceOp, g))
        check_tensors("all_reduce", "tensors", tensors)
        op = reduce_op("all_reduce", opts.reduceOp, tensors[0].dtype)
        return self._many(
            "all_reduce",
            opts.asyncOp,
            tensors,
            [lambda g, a, t=t: C.all_reduce(t, op, group=g, async_op=a) for t in tensors],
        )

    def allreduce_coalesced(self, tensors: list[Any], opts: Any = None) -> Any:
        opts = opts or _c10d.AllreduceCoalescedOptions()
        check_tensors("all_reduce_coalesced", "tensors", tensors)
        op = reduce_op("all_reduce_coalesced", opts.reduceOp, tensors[0].dtype)
        return self._go(
            "all_reduce_coalesced",
            opts.asyncOp,
            tensors,
            lambda g, a: C.all_reduce_coalesced(tensors, op, group=g, async_op=a),
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
            [lambda g, a, t=t: C.reduce(t, op=op, group=g, async_op=a, group_dst=root) for t in tensors],
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
                lambda g, a, o=o, i=i: C.all_gather(o, i, group=g, async_op=a)
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
            lambda g, a: C.all_gather_into_tensor(output, input, group=g, async_op=a),
        )

    _allgather_base = all_gather_single

    def allgather_coalesced(self, output_lists: list[list[Any]], input_list: list[Any], opts: Any = None) -> Any:
        opts = opts or _c10d.AllgatherOptions()
        check_tensors("all_gather_coalesced", "input_tensor_list", input_list)
        return self._go(
            "all_gather_coalesced",
            opts.asyncOp,
            _flat(output_lists),
            lambda g, a: C.all_gather_coalesced(output_lists, input_list, group=g, async_op=a),
        )

    def all_gather_single_coalesced(self, outputs: list[Any], inputs: list[Any], opts: Any = None) -> Any:
        opts = opts or _c10d.AllgatherOptions()
        check_tensors("all_gather_into_tensor_coalesced", "inputs", inputs)
        return self._many(
            "all_gather_into_tensor_coalesced",
            opts.asyncOp,
            list(outputs),
            [
                lambda g, a, o=o, i=i: C.all_gather_into_tensor(o, i, group=g, async_op=a)
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
            lambda g, a: C.gather(input_tensors[0], outs, group=g, async_op=a, group_dst=root),
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
            lambda g, a: C.scatter(output_tensors[0], ins, group=g, async_op=a, group_src=root),
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
                lambda g, a, o=o, i=i: C.reduce_scatter(o, i, op, group=g, async_op=a)
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
            lambda g, a: C.reduce_scatter_tensor(output, input, op, group=g, async_op=a),
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
                lambda g, a, o=o, i=i: C.reduce_scatter_tensor(o, i, op, group=g, async_op=a)
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
            lambda g, a: C.all_to_all(output_tensors, input_tensors, group=g, async_op=a),
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
            lambda g, a: C.all_to_all_single(output, input, outs, ins, group=g, async_op=a),
        )

    alltoall_base = all_to_all_single

    def barrier(self, opts: Any = None) -> Any:
        opts = opts or _c10d.BarrierOptions()
        return self._go("barrier", opts.asyncOp, [], lambda g, a: C.barrier(group=g, async_op=a))

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
        on_cb = progress.PROGRESS.ident == _get_ident()
        work = HpcdistWork(start(self._att.cb if on_cb else self._hpg), list(tensors), name, self._timeout_s, self._g2l)
        if on_cb:
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
