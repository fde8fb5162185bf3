"""Which ranks share a node: the node index of a group's ranks, and node communicators.

Node-locality is decided by :mod:`hpcdist.topology` (host name, boot id and
the ``/dev/shm`` mount: ``MPI_Comm_split_type(COMM_TYPE_SHARED)`` alone puts
ranks of different hosts or namespaces together in launcher-free worlds), once
per job at init: :func:`group_nodes` reads it without a message. The
shared-memory engine runs only on groups whose ranks all share one node, and
never spans two hosts or two ``/dev/shm`` mounts.

Every call here that waits for other ranks is bounded by the timeout (a
polled exchange, or a polled barrier before a blocking ``MPI_Comm_split``,
which then runs under the watchdog).
"""

from __future__ import annotations

from typing import Any

from ..._timed import guarded
from ..._world import WORLD
from ...topology import node_identity, node_layout, node_of_ranks

__all__ = ["group_nodes", "node_comm", "node_identity", "one_node"]

_HINT = (
    "every rank of the group must make the same collective calls in the same order; a rank that never comes, "
    "crashed or is stuck leaves the others waiting (raise timeout= if it is just slow)"
)


def group_nodes(pg: Any) -> list[int]:
    """The node index of every rank of group ``pg`` (0.. by first appearance), from the layout found at init.

    No message when the world's layout is known (it is after
    ``init_process_group``); otherwise collective over the group, bounded by its timeout.
    """
    if WORLD.node_of:
        return node_of_ranks(WORLD.node_of, pg._ranks)
    return node_layout(pg._comm, pg._timeout_s, f"node layout of {pg!r}")


def one_node(pg: Any) -> bool:
    """Whether every rank of ``pg`` runs on this rank's node (see :func:`group_nodes`)."""
    return len(set(group_nodes(pg))) == 1


def node_comm(comm: Any, timeout_s: float, what: str = "node communicator") -> Any:
    """A new communicator of the ranks of ``comm`` on this rank's node, ordered by their rank in ``comm``.

    Collective over ``comm`` and bounded by ``timeout_s``: one polled
    ``MPI_Iallgather`` of the node identities, a polled barrier, then
    ``MPI_Comm_split`` under the watchdog. The caller frees the result.
    """
    layout = node_layout(comm, timeout_s, what)
    me = comm.Get_rank()
    return guarded(lambda: comm.Split(layout[me], me), comm, timeout_s, what, _HINT)
