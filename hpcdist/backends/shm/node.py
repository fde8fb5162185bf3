"""Which ranks share a node: the one place that decides node-locality.

``MPI_Comm_split_type(COMM_TYPE_SHARED)`` groups the ranks that MPI can give
shared memory to. That is not always a node: processes that joined one world
through ports (hpcdist's launcher-free ``env://``/``tcp://`` rendezvous) from
different hosts, or from different network/mount namespaces of one host, may
all land in one "shared" communicator. So :func:`node_comm` splits it once
more by :func:`hpcdist.topology.node_identity` — the host name, the boot id and
the identity of the ``/dev/shm`` file system — and the shared-memory engine never spans two hosts
or two ``/dev/shm`` mounts.

Hierarchical collectives (nodes x leaders) build on the same function: its
result is the node communicator, and rank 0 of it is the node's leader.
"""

from __future__ import annotations

from typing import Any

from ...topology import node_identity

__all__ = ["node_comm", "node_identity"]


def node_comm(comm: Any) -> Any:
    """A new communicator of the ranks of ``comm`` on this rank's node, ordered by their rank in ``comm``.

    Collective over ``comm``. The caller frees the result. Ranks that
    ``Split_type(COMM_TYPE_SHARED)`` puts together but whose
    :func:`node_identity` differs end in different communicators.
    """
    from mpi4py import MPI

    shared = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank())
    me = node_identity()
    names = shared.allgather(me)
    distinct = sorted(set(names))
    if len(distinct) == 1:
        return shared
    try:
        return shared.Split(distinct.index(me), shared.Get_rank())
    finally:
        shared.Free()
