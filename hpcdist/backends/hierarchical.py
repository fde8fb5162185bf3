"""Hierarchical collectives for host arrays of groups that span several nodes.

Across nodes the network is the scarce resource. A flat MPI collective over
``n`` nodes of ``k`` ranks each sends every rank's data over it; the
hierarchical one sends only one copy per node:

``all_reduce``, where every node holds as many of the group's ranks (``rails``)
    node-local reduce-scatter (node rank ``i`` gets slice ``i``, reduced over
    the node) -> reduce-scatter + all-gather of slice ``i`` among the ranks
    ``i`` of all nodes (the ``i``-th *rail*) over MPI, all rails at once ->
    node-local all-gather. Every rank crosses the network with ``1/k`` of
    the data (``k`` ranks per node), as NCCL's tree/ring algorithms do
    between nodes: no rank idles while one leader sends everything.
``all_reduce``, otherwise (``leaders``; or ``HPCDIST_HIER_ALGO=leaders``)
    node-local reduce to the node's leader (its lowest group rank) ->
    reduce-scatter + all-gather among the leaders over MPI -> node-local
    broadcast from the leader.
``broadcast``
    node-local broadcast on the root's node (from the root) -> broadcast
    among the leaders from the root node's leader -> node-local broadcast on
    every other node.
``all_gather_into_tensor``, on rails (only with ``HPCDIST_HIER_ALGO=rails``)
    all-gather along the rail (the inputs of the ranks ``i``) -> node-local
    all-gather of the rails' blocks -> rows into rank order.
``all_gather_into_tensor``, otherwise (``auto``: measured faster)
    node-local gather to the leader -> all-gather of node blocks among the
    leaders -> node-local broadcast of the whole result.
``reduce_scatter_tensor``, on rails
    the input's blocks in rail order -> node-local reduce-scatter (node rank
    ``i`` gets the blocks of rail ``i``, reduced over its node) ->
    reduce-scatter along the rail: each rank its own block. No step back.
``reduce_scatter_tensor``, otherwise
    node-local reduce of the whole input to the leader -> reduce-scatter of
    node blocks among the leaders -> node-local scatter.

Rails need every node to hold as many of the group's ranks; ``broadcast``
always goes through the leaders. ``HPCDIST_HIER_ALGO=auto`` (the default)
takes rails for all_reduce and reduce_scatter_tensor, where they were
faster on the simulated cluster, and the leaders for all_gather_into_tensor,
where rails were slower (one more pass over the whole output, to put the
rows into rank order); ``rails`` takes rails for all three; ``leaders``
never.

**Bitwise identical everywhere.** Every element of a reduction is computed by
exactly one rank per node (the node step's root, or the owner of the
element's slice in the node's reduce-scatter), then by the one rank that owns
it in the reduce-scatter among leaders (or in its rail), and only copies
travel after that, so every rank gets the same bits. float16/bfloat16
are reduced in float32, PREMUL_SUM multiplies first and AVG divides last, as
on the flat MPI path (:mod:`hpcdist.buffers.reduction`).

**The node-local steps are a seam.** They run on the group's *node group*, a
:class:`~hpcdist.group.ProcessGroup` over the ranks of this node, through
that group's own engine (``reduce``, ``broadcast``, ``gather``,
``scatter``): the MPI engine today, a shared-memory engine wherever one is
chosen for one-node groups, with no change here.

**When it runs.** For a group whose ranks lie on two or more nodes with two or
more ranks on some node (by :mod:`hpcdist.topology`, known on every rank
without a message), for calls of at least ``HPCDIST_HIER_MIN_BYTES`` (``HPCDIST_HIER=1``: every
size; ``0``: never). Smaller calls take the flat MPI path. The node, leader
and rail communicators are split from the group's on its first hierarchical
call, which, like every collective, all ranks of the group make.

**Asynchronous calls run on the engine's thread.** The steps are blocking
calls on communicators of their own, so an ``async_op=True`` call cannot
return before them on the calling thread. Where MPI runs at
``MPI_THREAD_MULTIPLE`` (and ``HPCDIST_HIER_ASYNC`` is not 0) each engine has
one thread that runs the steps of its calls, one call at a time, in the
order they were made: an asynchronous call hands its steps over and returns
a Work whose one "request" is that hand-over (:class:`StepJob`); a blocking
call runs them on the calling thread once the thread has finished every
call handed to it before. Either way the calls reach the node, leader and
rail communicators in program order on every rank, so ranks may mix
``async_op`` for these calls. Without the thread level, asynchronous calls
take the flat non-blocking MPI call. Everything a call does on the group's
own communicator (the topology's splits, the NaN check of MIN/MAX) happens
on the calling thread, before the hand-over.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from functools import partial
from time import monotonic as _monotonic
from typing import Any

import numpy as np

from .. import config
from .._timed import guarded
from .._world import WORLD
from ..buffers.adapters import Buf
from ..buffers.dtypes import mpi_datatype
from ..buffers.packing import displacements as _displs
from ..buffers.reduction import finish_reduce, prepare
from ..ops import ResolvedOp
from ..topology import node_of_ranks
from ..work import BLOCKING_REQUESTS, Work, mpi_failure, strand, timeout_error, wait_requests
from .mpi.engine import MPIEngine, _mpi_op

__all__ = ["HierarchicalEngine", "NodeTopology", "spans_nodes"]

from mpi4py import MPI


def spans_nodes(pg: Any) -> bool:
    """Whether ``pg`` has ranks on two or more nodes and two or more ranks on some node (no messages)."""
    if not WORLD.node_of:
        return False
    nodes = node_of_ranks(WORLD.node_of, pg._ranks)
    n = max(nodes) + 1
    return 1 < n < len(nodes)


class NodeTopology:
    """The nodes of one group, as seen from this rank (collective to build: two or three ``Split`` s of the
    group's comm, bounded by the group's timeout).

    ``node_pg``: the ranks of this node, a ProcessGroup whose engine runs
    the node-local steps; ``leaders``: the communicator of the nodes' lowest
    group ranks (COMM_NULL elsewhere); ``rails``: where ``want_rails`` and
    every node holds as many ranks, the communicator of the
    ranks with this rank's node rank, one per node, in node order (else
    COMM_NULL); ``order``: the group ranks node by node (node-major), and
    ``identity`` whether that is plain rank order; ``rail_order``: the group
    ranks rail by rail (rail-major: node rank, then node).
    """

    def __init__(self, pg: Any, want_rails: bool = True) -> None:
        from ..group import ProcessGroup

        nodes = node_of_ranks(WORLD.node_of, pg._ranks)
        me = nodes[pg._rank]
        self.n_nodes = max(nodes) + 1
        self.members = [[r for r, n in enumerate(nodes) if n == j] for j in range(self.n_nodes)]
        self.node = me
        self.node_rank = self.members[me].index(pg._rank)
        self.is_leader = self.node_rank == 0
        self.order = [r for block in self.members for r in block]
        self.identity = self.order == list(range(len(nodes)))
        self.sizes = [len(b) for b in self.members]
        uniform = len(set(self.sizes)) == 1  # the same on every rank: no message
        self.rail_order = [b[i] for i in range(self.sizes[0]) for b in self.members] if uniform else []
        rails = want_rails and uniform
        comm, limit = pg._comm, pg._timeout_s

        def split() -> tuple[Any, Any, Any]:
            node = comm.Split(me, pg._rank)
            leaders = comm.Split(0 if self.is_leader else MPI.UNDEFINED, pg._rank)
            return node, leaders, comm.Split(self.node_rank, me) if rails else MPI.COMM_NULL  # rail rank = node

        # MPI_Comm_split has no non-blocking form: a polled barrier first, then the splits under the watchdog
        node_comm, self.leaders, self.rails = guarded(
            split,
            comm,
            limit,
            f"hierarchical collectives on {pg!r} (node, leader and rail communicators)",
            "every rank of the group must make the same collective calls in the same order (raise timeout= "
            "if a rank is just slow)",
        )
        self.node_pg = ProcessGroup(
            node_comm,
            [pg._ranks[r] for r in self.members[me]],
            timeout=pg._timeout,
            backend={"cpu": pg._backend_map.get("cpu", "mpi")},
            backend_str=pg._backend_str,
            group_name=f"{pg.group_name}/node{me}",
            group_desc="node-local steps of hierarchical collectives",
        )
        self.node_pg._block = pg._block

    @property
    def steps(self) -> Any:
        """The engine of the node group: the node-local steps."""
        return self.node_pg.engine("cpu")

    def close(self) -> None:
        self.node_pg._free()
        for comm in (self.leaders, self.rails):
            if comm != MPI.COMM_NULL and not MPI.Is_finalized():
                comm.Free()


def _plain(rop: ResolvedOp) -> ResolvedOp:
    """The op of the intermediate steps: MPI's op alone (premultiply before, average after)."""
    return rop if rop.plain else ResolvedOp(rop.kind, rop.mpi_name)


def _buf(arr: np.ndarray) -> Buf:
    return Buf(arr, arr, arr.dtype.name)


class StepJob:
    """The one "request" of an asynchronous hierarchical call: its steps, run by the engine's :class:`StepThread`.

    Has the ``Test``/``Cancel``/``Wait`` of an ``MPI.Request``, so a
    :class:`~hpcdist.work.Work` tests it like one; ``Test`` raises the
    steps' error (a timeout, a failed MPI call) once they ended with one.
    ``block(timeout_s)`` waits for it without spinning (``wait_requests``
    uses it), so a waiter leaves the interpreter to the thread.
    """

    __slots__ = ("_done", "_exc", "_steps")

    def __init__(self, steps: Callable[[], None]) -> None:
        self._steps: Callable[[], None] | None = steps
        self._done = threading.Event()
        self._exc: BaseException | None = None

    def run(self) -> None:
        steps, self._steps = self._steps, None
        try:
            if steps is not None:
                steps()
        except BaseException as exc:  # the Work's waiter raises it
            self._exc = exc
        finally:
            self._done.set()

    def Test(self, status: Any = None) -> bool:
        if not self._done.is_set():
            return False
        if self._exc is not None:
            raise self._exc
        return True

    def block(self, timeout_s: float) -> bool:
        return self._done.wait(timeout_s) and self.Test()

    def Cancel(self) -> None:  # steps that started run to their end (each is bounded by the group's timeout)
        pass

    def Wait(self) -> None:
        self._done.wait()
        self.Test()


BLOCKING_REQUESTS.add(StepJob)


class StepThread:
    """One daemon thread running the steps of an engine's asynchronous calls, one call at a time, in hand-over
    order; a blocking call takes its :meth:`turn` after them.

    Every step of a call is bounded by the group's timeout, so a call by
    ``limit_s`` (the engine passes :data:`CALL_STEPS` times the timeout); a
    turn or :meth:`close` waits while calls keep finishing, and gives up once
    none finished for ``limit_s``.
    """

    def __init__(self, name: str) -> None:
        self._name = name
        self._cv = threading.Condition()
        self._queue: collections.deque[StepJob | None] = collections.deque()
        self._busy = False
        self._finished = 0  # calls run so far: a wait's progress
        self._thread: threading.Thread | None = None

    def submit(self, job: StepJob) -> None:
        with self._cv:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            self._queue.append(job)
            self._cv.notify_all()

    def _run(self) -> None:
        cv, queue = self._cv, self._queue
        while True:
            with cv:
                while not queue:
                    cv.wait()
                job = queue.popleft()
                if job is None:  # close()
                    return
                self._busy = True
            try:
                job.run()
            finally:
                with cv:
                    self._busy = False
                    self._finished += 1
                    cv.notify_all()

    def _idle_within(self, limit_s: float) -> bool:
        """With the lock held: wait until no call is queued or running; False once none finished for ``limit_s``."""
        deadline, seen = _monotonic() + limit_s, self._finished
        while self._queue or self._busy:
            left = deadline - _monotonic()
            if left <= 0:
                return False
            self._cv.wait(left)
            if self._finished != seen:
                deadline, seen = _monotonic() + limit_s, self._finished
        return True

    @contextmanager
    def turn(self, limit_s: float, what: Any) -> Iterator[None]:
        """``with thread.turn(limit, what):`` the calling thread runs steps once every handed-over call has finished;
        :class:`~hpcdist.errors.DistTimeoutError` naming ``what`` when they stop finishing (:meth:`_idle_within`)."""
        with self._cv:
            if not self._idle_within(limit_s):  # the thread's call is its own to finish or time out
                raise timeout_error(what, limit_s, cancelled=True)
            self._busy = True
        try:
            yield
        finally:
            with self._cv:
                self._busy = False
                self._cv.notify_all()

    def idle(self) -> bool:
        with self._cv:
            return not self._queue and not self._busy

    def close(self, limit_s: float) -> bool:
        """After every handed-over call: end the thread (joined, so a later submit starts a fresh one). False, and
        the thread left running, when its calls stopped finishing (:meth:`_idle_within`)."""
        with self._cv:
            if not self._idle_within(limit_s):
                return False
            thread, self._thread = self._thread, None
            if thread is not None:
                self._queue.append(None)
                self._cv.notify_all()
        if thread is not None:
            thread.join()
        return True


#: the most steps one hierarchical call waits on (all_reduce: the node step, the two between the nodes, the node step
#: back), each within the group's timeout
CALL_STEPS = 4


def _split(count: int, parts: int) -> list[int]:
    """``count`` elements in ``parts`` nearly equal consecutive slices."""
    q, r = divmod(count, parts)
    return [q + (1 if i < r else 0) for i in range(parts)]


class HierarchicalEngine(MPIEngine):
    """The MPI engine, with hierarchical all_reduce, broadcast, all_gather_into_tensor and
    reduce_scatter_tensor for blocking calls from ``HPCDIST_HIER_MIN_BYTES`` (see the module docstring).

    ``algorithm`` (``HPCDIST_HIER_ALGO``, read when the engine is built): whether all_reduce,
    reduce_scatter_tensor and all_gather_into_tensor cross the nodes on rails or through the leaders.
    """

    kind = "hierarchical"
    #: the collectives that take rails under HPCDIST_HIER_ALGO=auto (measured: docs/multinode.md)
    RAILS_AUTO = frozenset({"all_reduce", "reduce_scatter_tensor"})

    def __init__(self, pg: Any, device_type: str = "cpu") -> None:
        super().__init__(pg, device_type)
        self.min_bytes = config.hierarchical_min_bytes()
        self.algorithm = config.hierarchical_algorithm()
        self._topo: NodeTopology | None = None
        # where asynchronous calls run their steps (None: they take the flat non-blocking path)
        self._steps_thread: StepThread | None = None
        if config.hierarchical_async() and MPI.Query_thread() == MPI.THREAD_MULTIPLE:
            self._steps_thread = StepThread(f"hpcdist-hier-{pg.group_name}")
        # all_reduce's lane and fast path stop where the hierarchical path starts
        self.fast_all_reduce_below = min(self.fast_all_reduce_below, self.lane_below("all_reduce"))

    #: the collectives it runs in node steps; the others are MPIEngine's, lanes at every size included
    HIER_OPS = frozenset({"all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor"})

    #: DETAIL's names of those calls -> whether the array it describes is one rank's block of the array the engine
    #: decides on (all_gather_into_tensor's input, reduce_scatter_tensor's output: a group size's worth smaller)
    _DETAIL_BLOCK = {"all_reduce": False, "broadcast": False, "all_gather_into": True, "reduce_scatter_tensor": True}

    def async_meets_blocking(self, desc: str, nbytes: int) -> bool:
        """Calls that go hierarchical run the same steps blocking or not (asynchronous ones on the thread)."""
        block = self._DETAIL_BLOCK.get(desc)
        if block is None or self._steps_thread is None or self.min_bytes is None:
            return False
        return nbytes * (self.pg._size if block else 1) >= self.min_bytes

    def lane_below(self, op: str) -> float:
        if self.min_bytes is None or op not in self.HIER_OPS:
            return float("inf")
        return self.min_bytes  # where the node steps start

    def _use(self, sync: bool, nbytes: int) -> NodeTopology | None:
        """The topology when this call goes hierarchical (same answer on every rank: sizes agree), else None.

        Built here, on the calling thread: its splits are collectives on the group's communicator."""
        if self.min_bytes is None or nbytes < self.min_bytes or not (sync or self._steps_thread is not None):
            return None
        topo = self._topo
        if topo is None:
            topo = self._topo = NodeTopology(self.pg, want_rails=self.algorithm != "leaders")
        elif topo.node_pg._timeout_s != self.pg._timeout_s:  # set_timeout() on the group: its node steps too
            topo.node_pg.set_timeout(self.pg._timeout)
        return topo

    def close(self) -> None:
        thread = self._steps_thread  # its calls finish first: they use the communicators freed below
        if thread is not None and not thread.close(self._call_limit()):
            return  # a call still runs on them (stuck past its own timeouts): they are kept for good
        if self._topo is not None:
            self._topo.close()
            self._topo = None

    def _call_limit(self) -> float:
        """The longest one call's steps may take: each is bounded by the group's timeout."""
        return CALL_STEPS * self.pg._timeout_s

    def _steps(self, sync: bool, name: str, steps: Callable[[], None], keep: Any, result: Any) -> Work | None:
        """Run ``steps`` (the node and between-node steps of one call) in program order among this engine's calls:
        blocking, on this thread after every asynchronous call before it; else on the engine's thread, returning
        the Work of that."""
        thread = self._steps_thread
        if sync:
            with nullcontext() if thread is None else thread.turn(self._call_limit(), (name, self.pg)):
                steps()
            return None
        assert thread is not None  # _use sends asynchronous calls here only with the thread
        job = StepJob(steps)
        thread.submit(job)
        return Work([job], None, keep, self.pg._timeout_s, (name, self.pg), result)

    def _on_rails(self, topo: NodeTopology, op: str) -> bool:
        """Whether ``op`` crosses the nodes on rails (the same answer on every rank)."""
        return topo.rails != MPI.COMM_NULL and (self.algorithm == "rails" or op in self.RAILS_AUTO)

    def _wait_between_nodes(self, req: Any, name: str, keep: Any) -> None:
        """Wait for ``req`` (the step among leaders or on a rail) within the group's timeout; on timeout its
        request and buffers ``keep`` are kept for good (a late peer may still make MPI write them)."""
        pg = self.pg
        what = (f"{name} (between nodes)", pg)
        try:
            done = req.Test() or wait_requests([req], pg._timeout_s)
        except Exception as failed:  # MPI reported the request failed: named, as on the flat paths
            raise mpi_failure(what, failed) from failed
        if not done:
            strand([req], keep)
            raise timeout_error(what, pg._timeout_s)

    # -- all_reduce ----------------------------------------------------------------------

    def all_reduce(self, buf: Buf, rop: ResolvedOp, sync: bool = False) -> Work | None:
        topo = self._use(sync, buf.arr.nbytes)
        if topo is None:
            return super().all_reduce(buf, rop, sync)
        rop = self._unordered_if_no_nan(rop, buf, True)  # here: a collective on the group's communicator
        return self._steps(sync, "all_reduce", partial(self._all_reduce_steps, topo, buf, rop), buf, buf.obj)

    def _all_reduce_steps(self, topo: NodeTopology, buf: Buf, rop: ResolvedOp) -> None:
        work = prepare(buf, rop, copy=False).reshape(-1)
        wbuf, plain = _buf(work), _plain(rop)
        steps = topo.steps
        k = topo.sizes[topo.node]
        if self._on_rails(topo, "all_reduce") and work.size % k == 0:  # the same on every rank: sizes agree
            part = np.empty(work.size // k, dtype=work.dtype)
            steps.reduce_scatter_tensor(_buf(part), wbuf, plain, sync=True)
            self._all_reduce_between_nodes(topo.rails, part, plain)
            steps.all_gather_into(wbuf, _buf(part), sync=True)
        else:
            steps.reduce(wbuf, 0, plain, sync=True)
            if topo.is_leader:
                self._all_reduce_between_nodes(topo.leaders, work, plain)
            steps.broadcast(wbuf, 0, sync=True)
        finish_reduce(buf, work, rop, self.pg._size)

    def _all_reduce_between_nodes(self, comm: Any, work: np.ndarray, rop: ResolvedOp) -> None:
        """Reduce-scatter then all-gather among the leaders (or one rail): each element is reduced by one rank of
        ``comm``, so all get the same bits."""
        counts = _split(work.size, comm.Get_size())
        displs = _displs(counts)
        mt = mpi_datatype(work.dtype)
        me = comm.Get_rank()
        mine = np.empty(counts[me], dtype=work.dtype)
        req = comm.Ireduce_scatter([work, mt], [mine, mt], counts, _mpi_op(rop.mpi_name))
        self._wait_between_nodes(req, "all_reduce", (work, mine))
        req = comm.Iallgatherv([mine, mt], [work, (counts, displs), mt])
        self._wait_between_nodes(req, "all_reduce", (work, mine))

    # -- broadcast -----------------------------------------------------------------------

    def broadcast(self, buf: Buf, root: int, sync: bool = False) -> Work | None:
        topo = self._use(sync, buf.arr.nbytes)
        if topo is None:
            return super().broadcast(buf, root, sync)
        return self._steps(sync, "broadcast", partial(self._broadcast_steps, topo, buf, root), buf, buf.obj)

    def _broadcast_steps(self, topo: NodeTopology, buf: Buf, root: int) -> None:
        root_node = next(j for j, block in enumerate(topo.members) if root in block)
        flat = _buf(buf.arr.reshape(-1))
        if topo.node == root_node:
            topo.steps.broadcast(flat, topo.members[root_node].index(root), sync=True)
        if topo.is_leader:
            mt = mpi_datatype(buf.arr.dtype)
            self._wait_between_nodes(topo.leaders.Ibcast([flat.arr, mt], root_node), "broadcast", flat.arr)
        if topo.node != root_node:
            topo.steps.broadcast(flat, 0, sync=True)
        if buf.writeback is not None and self.pg._rank != root:
            buf.writeback()

    # -- all_gather_into_tensor ----------------------------------------------------------

    def all_gather_into(self, out: Buf, inp: Buf, sync: bool = False) -> Work | None:
        topo = self._use(sync, out.arr.nbytes)
        if topo is None:
            return super().all_gather_into(out, inp, sync)
        steps = partial(self._all_gather_into_steps, topo, out, inp)
        return self._steps(sync, "all_gather_into_tensor", steps, (out, inp), out.obj)

    def _all_gather_into_steps(self, topo: NodeTopology, out: Buf, inp: Buf) -> None:
        m = inp.arr.size
        n = len(topo.order)
        mt = mpi_datatype(out.arr.dtype)
        if self._on_rails(topo, "all_gather_into_tensor"):  # along the rail, then on the node: rail-major rows
            rail = np.empty(topo.n_nodes * m, dtype=out.arr.dtype)
            req = topo.rails.Iallgather([inp.arr.reshape(-1), mt], [rail, mt])
            self._wait_between_nodes(req, "all_gather_into_tensor", (inp.arr, rail))
            whole = np.empty(out.arr.size, dtype=out.arr.dtype)
            topo.steps.all_gather_into(_buf(whole), _buf(rail), sync=True)
            order: list[int] | None = topo.rail_order
        else:  # to the leader, among the leaders, from the leader: node-major rows
            whole = out.arr.reshape(-1) if topo.identity else np.empty(out.arr.size, dtype=out.arr.dtype)
            k = topo.sizes[topo.node]
            start = sum(topo.sizes[: topo.node]) * m  # this node's block in node-major order
            block = whole[start : start + k * m]
            outs = [_buf(block[i * m : (i + 1) * m]) for i in range(k)] if topo.is_leader else None
            topo.steps.gather(_buf(inp.arr.reshape(-1)), outs, 0, sync=True)
            if topo.is_leader:
                counts = [s * m for s in topo.sizes]
                req = topo.leaders.Iallgatherv(MPI.IN_PLACE, [whole, (counts, _displs(counts)), mt])
                self._wait_between_nodes(req, "all_gather_into_tensor", whole)
            topo.steps.broadcast(_buf(whole), 0, sync=True)
            order = None if topo.identity else topo.order
        if order is not None:  # -> rank order
            out.arr.reshape(n, m)[order] = whole.reshape(n, m)
        if out.writeback is not None:
            out.writeback()

    # -- reduce_scatter_tensor -----------------------------------------------------------

    def reduce_scatter_tensor(self, out: Buf, inp: Buf, rop: ResolvedOp, sync: bool = False) -> Work | None:
        topo = self._use(sync, inp.arr.nbytes)
        if topo is None:
            return super().reduce_scatter_tensor(out, inp, rop, sync)
        rop = self._unordered_if_no_nan(rop, inp, True)  # here: a collective on the group's communicator
        steps = partial(self._reduce_scatter_tensor_steps, topo, out, inp, rop)
        return self._steps(sync, "reduce_scatter_tensor", steps, (out, inp), out.obj)

    def _reduce_scatter_tensor_steps(self, topo: NodeTopology, out: Buf, inp: Buf, rop: ResolvedOp) -> None:
        m = out.arr.size
        n = len(topo.order)
        plain = _plain(rop)
        if self._on_rails(topo, "reduce_scatter_tensor"):
            # the blocks of rail 0 first (in node order), then rail 1's, ...: a copy, so the input stays as it was
            ranked = prepare(inp, rop, copy=False).reshape(n, m)[topo.rail_order].reshape(-1)
            rail = np.empty(topo.n_nodes * m, dtype=ranked.dtype)
            topo.steps.reduce_scatter_tensor(_buf(rail), _buf(ranked), plain, sync=True)
            mine = np.empty(m, dtype=ranked.dtype)
            mt = mpi_datatype(ranked.dtype)
            req = topo.rails.Ireduce_scatter([rail, mt], [mine, mt], [m] * topo.n_nodes, _mpi_op(plain.mpi_name))
            self._wait_between_nodes(req, "reduce_scatter_tensor", (rail, mine))
            finish_reduce(out, mine, rop, self.pg._size)
            return
        # the node's root reduces in place: never into the caller's input
        work = prepare(inp, rop, copy=topo.is_leader).reshape(-1)
        if not topo.identity:
            work = np.ascontiguousarray(work.reshape(n, m)[topo.order]).reshape(-1)
        topo.steps.reduce(_buf(work), 0, plain, sync=True)
        k = topo.sizes[topo.node]
        ins: list[Buf] | None = None
        if topo.is_leader:
            mine = np.empty(k * m, dtype=work.dtype)
            mt = mpi_datatype(work.dtype)
            counts = [s * m for s in topo.sizes]
            req = topo.leaders.Ireduce_scatter([work, mt], [mine, mt], counts, _mpi_op(plain.mpi_name))
            self._wait_between_nodes(req, "reduce_scatter_tensor", (work, mine))
            ins = [_buf(mine[i * m : (i + 1) * m]) for i in range(k)]
        recv = np.empty(m, dtype=work.dtype)
        topo.steps.scatter(_buf(recv), ins, 0, sync=True)
        finish_reduce(out, recv, rop, self.pg._size)


def hierarchical_or_none(pg: Any, device_type: str) -> HierarchicalEngine | None:
    """The hierarchical engine for a host group spanning nodes (and not turned off), else None."""
    if device_type != "cpu" or config.hierarchical_min_bytes() is None or not spans_nodes(pg):
        return None
    return HierarchicalEngine(pg, device_type)
