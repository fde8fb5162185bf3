"""Which ranks share a node: the one place that decides node-locality.

``MPI_Comm_split_type(COMM_TYPE_SHARED)`` groups the ranks that MPI can give
shared memory to. That is not always a node: processes that joined one world
through ports (hpcdist's launcher-free ``env://``/``tcp://`` rendezvous) from
different hosts, or from different network/mount namespaces of one host, may
all land in one "shared" communicator. So :func:`node_comm` splits it once
more by :func:`node_identity` — the host name and the identity of the
``/dev/shm`` file system — and the shared-memory engine never spans two hosts
or two ``/dev/shm`` mounts.

Hierarchical collectives (nodes x leaders) build on the same function: its
result is the node communicator, and rank 0 of it is the node's leader.
"""

from __future__ import annotations

import os
import socket
from typing import Any

__all__ = ["node_comm", "node_identity"]


def node_identity() -> str:
    """A string equal for two processes exactly when they can share memory through ``/dev/shm``.

    The host name plus the device and inode of ``/dev/shm`` (a mount
    namespace with its own tmpfs there gets another identity). Override with
    ``HPCDIST_NODE_ID`` (e.g. when host names are not unique).
    """
    forced = os.environ.get("HPCDIST_NODE_ID")
    if forced:
        return forced
    try:
        st = os.stat("/dev/shm")
        shm = f"{st.st_dev}:{st.st_ino}"
    except OSError:
        shm = "-"
    return f"{socket.gethostname()}|{shm}"


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
