"""Shared-memory collectives for the host arrays of ranks on one node.

* :mod:`.node`        which ranks of a group share a node (from :mod:`hpcdist.topology`), node communicators;
* :mod:`.segment`     one POSIX shared-memory segment over a communicator of one node, its counter barrier;
* :mod:`.algorithms`  all_reduce / reduce / broadcast / all_gather / reduce_scatter / all_to_all over a
  segment (building blocks for hierarchical engines too);
* :mod:`.cma`         reading a peer's memory directly (``process_vm_readv``), probed per segment;
* :mod:`.direct`      single-copy all_reduce / broadcast / all_gather / reduce_scatter through it;
* :mod:`.symmetric`   symmetric memory (arrays every rank maps) and the collectives that read it in place;
* :mod:`.table`       the measured table: which path each operation and size takes;
* :mod:`.engine`      :class:`ShmEngine`, the host engine that puts them together.

Nothing here runs at import; the segment is made by the first call that uses it.

Composing (hierarchical collectives): ``node = node_comm(comm, timeout_s)`` gives the
ranks of ``comm`` on this node (rank 0 of it is the node's leader);
``seg = Segment(node, slot_bytes, timeout_s, (opname, pg))`` the segment over
them; then e.g. ``algorithms.reduce(seg, x, x if leader else None, "SUM")``
reduces inside the node into the leader, MPI runs among the leaders, and
``algorithms.broadcast(seg, x, 0)`` hands the result back to the node.
"""

from __future__ import annotations

__all__ = [
    "Segment",
    "ShmEngine",
    "host_engine",
    "node_comm",
    "node_identity",
    "one_node",
    "shm_eligible",
    "shm_serves",
]

from .engine import ShmEngine, host_engine, shm_eligible, shm_serves
from .node import node_comm, node_identity, one_node
from .segment import Segment
