"""The engine interface: what moves the arrays of one process group on one device.

An engine is built once per (group, device type) by
:func:`hpcdist.backends.selection.select_engine` and serves every operation
of that group on arrays of that device. :mod:`hpcdist.collectives` and
:mod:`hpcdist.p2p` check the arguments, adapt the arrays to
:class:`~hpcdist.buffers.adapters.Buf` and call one method here; the engine
only moves data.

The contract of every operation method:

* its arguments were checked by the caller (dtypes, sizes, ranks): the
  engine raises only for what only it can know (a device it cannot serve,
  a transport failure, a timeout);
* ranks (``root``, ``dst``, ``src``) are ranks *in the group*;
  ``src`` may be ``MPI.ANY_SOURCE`` (-2) for :meth:`Engine.recv`;
* ``sync`` is True when the caller waits right away (``async_op=False``):
  the engine may then finish the operation before returning and return
  None; otherwise it returns a :class:`~hpcdist.work.Work` that completes it;
* every rank of the group calls the same collective methods in the same
  order (the SPMD contract of :mod:`hpcdist.collectives`).

Capabilities are class attributes, read directly (never probed):

``batches_p2p``
    :meth:`Engine.batch_p2p` must receive a whole ``batch_isend_irecv`` at
    once (NCCL: one group call, else a ring of sends deadlocks). When False,
    ``batch_isend_irecv`` starts each operation on its own.
``kind``
    the name of the path this engine's operations take (``"mpi"``,
    ``"nccl"``, ...), as ``hpcdist bench`` and ``hpcdist info`` print it;
    :meth:`Engine.path` refines it per operation and size where an engine
    chooses between paths (the shared-memory engine).

Write an engine: subclass :class:`Engine`, implement the abstract methods,
and register a factory with :meth:`hpcdist.Backend.register_backend`
(see docs/architecture.md, "Write an engine").
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from typing import Any, ClassVar

import numpy as np

from ..buffers.adapters import Buf
from ..ops import ResolvedOp
from ..work import Work

__all__ = ["Engine"]


class Engine(ABC):
    """The operations one process group runs on arrays of one device type (see module docstring).

    Attributes every engine sets: ``pg`` (its :class:`~hpcdist.group.ProcessGroup`)
    and ``device_type`` (``"cpu"`` or ``"cuda"``).
    """

    #: batch_p2p must receive a whole batch_isend_irecv at once (see module docstring)
    batches_p2p: ClassVar[bool] = False
    #: the name of this engine's path (see module docstring)
    kind: ClassVar[str] = "engine"

    pg: Any
    device_type: str

    def path(self, op: str, nbytes: int) -> str:
        """The name of the path ``op`` on ``nbytes`` bytes takes: :attr:`kind` unless the engine chooses per call."""
        return self.kind

    def async_meets_blocking(self, desc: str, nbytes: int) -> bool:
        """Whether an ``async_op=True`` call ``desc`` (the name DETAIL mode gives it) on an array of ``nbytes`` meets
        a blocking one on another rank (the same MPI calls either way), so that DETAIL need not compare
        ``async_op``. In block wait mode a blocking call is the blocking MPI routine: no, unless the engine knows."""
        return False

    # -- collectives -----------------------------------------------------------------

    @abstractmethod
    def barrier(self, sync: bool = False, timeout_s: float | None = None) -> Work | None:
        """Every rank of the group enters before any leaves.

        ``timeout_s``: ``barrier(timeout=...)``'s own timeout, for an engine that waits inside this call (the
        shared-memory one); an engine that returns a pending Work leaves it to ``Work.wait(timeout)``.
        """

    @abstractmethod
    def broadcast(self, buf: Buf, root: int, sync: bool = False) -> Work | None:
        """``buf`` of ``root`` into ``buf`` of every rank."""

    @abstractmethod
    def all_reduce(self, buf: Buf, rop: ResolvedOp, sync: bool = False) -> Work | None:
        """Reduce ``buf`` over the group with ``rop``, in place on every rank."""

    def check_reduction(self, dtype: str, rop: ResolvedOp) -> None:  # noqa: B027 - most engines reduce what MPI does
        """Raise TypeError/ValueError, before anything moves, where this engine cannot reduce ``dtype`` with ``rop``
        although MPI's view (:func:`~hpcdist.ops.resolve_op`) allows it (NCCL lacks some types and ops).
        Calls that run several reductions ask first, so none moves when one would be refused."""

    def host_all_reduce_lane(self, dtype: str, rop: ResolvedOp) -> tuple[int, Callable[[Any], None]] | None:
        """The engine's one-call path for a blocking in-place all_reduce of small host NumPy arrays, or None.

        Returns ``(max_bytes, run)``: ``run(array)`` all-reduces a writable
        C-contiguous NumPy array of logical dtype ``dtype`` and fewer than
        ``max_bytes`` bytes with ``rop``, blocking, exactly as
        ``all_reduce(Buf(array), rop, sync=True)`` would. :func:`hpcdist.all_reduce`
        keeps it per (group, dtype, op) and calls it directly: the hot path of
        small calls (see docs/architecture.md). The default is None: no lane.
        """
        return None

    def host_lane(
        self, op: str, np_dtype: Any, rop: ResolvedOp | None = None
    ) -> tuple[int, Callable[..., None]] | None:
        """The engine's one-call path for blocking ``op`` on small host NumPy arrays of ``np_dtype``, or None.

        ``op`` is ``"broadcast"`` (``run(array, root)``: ``root`` a group rank),
        ``"reduce"`` (``run(array, root, mine)``, reducing with ``rop`` into the
        root's array; ``mine``: this rank is the root),
        ``"all_gather_into_tensor"``, ``"all_gather"`` (of equal sizes, into
        one output) and ``"all_to_all_single"`` of even splits
        (``run(output, input)``), ``"gather"`` (``run(input, output, counts,
        root)``: ``output`` and MPI's ``(counts, displacements)`` None but on
        the root) and ``"scatter"`` (``run(output, input, counts, root)``,
        likewise) or
        ``"reduce_scatter_tensor"`` (``run(output, input)``, reducing with
        ``rop``). Returns ``(max_bytes, run)``: ``run`` does exactly what the
        engine's method would with ``sync=True`` on C-contiguous NumPy arrays
        of fewer than ``max_bytes`` bytes (the broadcast or reduced array, the gathered
        output, the scattered or exchanged input) that the caller checked: writable where
        written, of ``np_dtype``, the right sizes, not sharing memory.
        :mod:`hpcdist.collectives` keeps it per (group, op, dtype), as
        all_reduce's :meth:`host_all_reduce_lane`. The default is None: no lane.
        """
        return None

    def host_barrier_lane(self) -> Callable[[], None] | None:
        """The engine's one-call blocking barrier (``run()``, as ``barrier(sync=True)``), or None (the default)."""
        return None

    def host_all_reduce_many(self, arrays: list[Any], dtype: str, rop: ResolvedOp, nbytes: int) -> None:
        """All-reduce several flat C-contiguous writable host NumPy arrays of logical ``dtype`` (``nbytes`` in all)
        as one, blocking, each in place (:func:`hpcdist.all_reduce_bucketed`).

        The default packs them into one array, runs :meth:`all_reduce` on it and
        copies the results back; an engine that can reduce the arrays where
        they lie (the shared-memory engine) overrides it.
        """
        flat = np.concatenate(arrays)
        work = self.all_reduce(Buf(flat, flat, dtype), rop, sync=True)
        if work is not None:
            work.wait()
        lo = 0
        for a in arrays:
            hi = lo + a.size
            a[...] = flat[lo:hi]
            lo = hi

    @abstractmethod
    def reduce(self, buf: Buf, root: int, rop: ResolvedOp, sync: bool = False) -> Work | None:
        """Reduce ``buf`` over the group into ``buf`` of ``root``."""

    @abstractmethod
    def all_gather(self, outs: list[Buf], inp: Buf, sync: bool = False) -> Work | None:
        """``inp`` of rank ``r`` into ``outs[r]`` on every rank (sizes may differ by rank)."""

    @abstractmethod
    def all_gather_into(self, out: Buf, inp: Buf, sync: bool = False) -> Work | None:
        """Every rank's ``inp`` into slot ``r`` of ``out`` (``inp`` may be this rank's slot of ``out``)."""

    @abstractmethod
    def gather(self, inp: Buf, outs: list[Buf] | None, root: int, sync: bool = False) -> Work | None:
        """``inp`` of rank ``r`` into ``outs[r]`` of ``root`` (``outs`` is None elsewhere)."""

    @abstractmethod
    def scatter(self, out: Buf, ins: list[Buf] | None, root: int, sync: bool = False) -> Work | None:
        """``ins[r]`` of ``root`` into ``out`` of rank ``r`` (``ins`` is None elsewhere)."""

    @abstractmethod
    def reduce_scatter(self, out: Buf, ins: list[Buf], rop: ResolvedOp, sync: bool = False) -> Work | None:
        """Reduce ``ins[r]`` over the group into ``out`` of rank ``r``."""

    @abstractmethod
    def reduce_scatter_tensor(self, out: Buf, inp: Buf, rop: ResolvedOp, sync: bool = False) -> Work | None:
        """Reduce ``inp`` (group size x ``out``) over the group; rank ``r`` gets chunk ``r`` in ``out``."""

    @abstractmethod
    def all_to_all(self, outs: list[Buf], ins: list[Buf], sync: bool = False) -> Work | None:
        """``ins[j]`` of rank ``i`` into ``outs[i]`` of rank ``j``."""

    @abstractmethod
    def all_to_all_single(
        self, out: Buf, inp: Buf, rcounts: list[int], scounts: list[int], sync: bool = False
    ) -> Work | None:
        """``scounts[j]`` elements of ``inp`` to rank ``j``; ``rcounts[i]`` elements from rank ``i`` into ``out``."""

    # -- point to point ----------------------------------------------------------------

    @abstractmethod
    def send(self, buf: Buf, dst: int, tag: int) -> Work:
        """Start sending ``buf`` to group rank ``dst``."""

    @abstractmethod
    def recv(self, buf: Buf, src: int, tag: int) -> Work:
        """Start receiving into ``buf`` from group rank ``src``; the Work's ``source_rank()`` is the sender."""

    def send_now(self, buf: Buf, dst: int, tag: int) -> None:
        """Blocking send (``hpcdist.send``); engines may override it to skip the Work."""
        self.send(buf, dst, tag).wait()

    def recv_now(self, buf: Buf, src: int, tag: int) -> int:
        """Blocking receive (``hpcdist.recv``); returns the sender's global rank."""
        work = self.recv(buf, src, tag)
        work.wait()
        return work.source_rank()

    def batch_p2p(self, ops: list[tuple[bool, Buf, int, int]]) -> list[Work]:
        """Start ``(is_send, buf, group peer, tag)`` operations together (``batch_isend_irecv``)."""
        return [self.send(b, peer, tag) if is_send else self.recv(b, peer, tag) for is_send, b, peer, tag in ops]

    # -- lifetime ------------------------------------------------------------------------

    def close(self) -> None:  # noqa: B027 - an optional hook: most engines own nothing to free
        """Free what the engine owns (at group destruction; collective over the group)."""
