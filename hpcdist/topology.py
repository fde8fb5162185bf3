"""Which ranks share a node: node identity, the world's node layout, node-local ranks.

``MPI_Comm_split_type(COMM_TYPE_SHARED)`` groups the ranks MPI believes
share memory. In a world joined through ports (hpcdist's launcher-free
``env://``/``tcp://``/``file://`` rendezvous) that belief can be wrong: MPICH
puts processes of different hosts, or of different network and mount
namespaces of one host, into one "shared" communicator (``LOCAL_RANK`` 1 on
the second node). So hpcdist decides node-locality itself, from
:func:`node_identity`: the host name, the kernel's boot id and the identity of
the ``/dev/shm`` file system. Two processes are on one node exactly when all
three agree — same machine, same host name, same shared-memory mount — which
is what ``LOCAL_RANK``, the device choice per node, shared-memory segments
and hierarchical collectives need.

:func:`node_layout` is collective: it runs once in ``init_process_group``
(one ``MPI_Allgather`` of an 8-byte hash per rank) and the result, the node
index of every world rank, is kept on the world state, so the node-local
ranks of any group are known without further messages.
"""

from __future__ import annotations

import hashlib
import os
import socket
from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = [
    "affinity",
    "local_rank_size",
    "node_identity",
    "node_layout",
    "node_layout_and_cpus",
    "node_of_ranks",
    "split_shared",
]

_BOOT_ID = "/proc/sys/kernel/random/boot_id"


def node_identity() -> str:
    """A string equal for two processes exactly when they run on one node.

    The host name, the kernel's boot id and the device and inode of
    ``/dev/shm``: another machine has another boot id; a container or
    namespace with its own host name or its own tmpfs on ``/dev/shm`` is
    another node (shared memory cannot span it). ``HPCDIST_NODE_ID``
    overrides it (e.g. where host names repeat and nothing else differs).
    """
    forced = os.environ.get("HPCDIST_NODE_ID", "").strip()
    if forced:
        return forced
    try:
        with open(_BOOT_ID) as f:
            boot = f.read().strip()
    except OSError:
        boot = "-"
    try:
        st = os.stat("/dev/shm")
        shm = f"{st.st_dev}:{st.st_ino}"
    except OSError:
        shm = "-"
    return f"{socket.gethostname()}|{boot}|{shm}"


def _key(identity: str) -> int:
    return int.from_bytes(hashlib.blake2b(identity.encode(), digest_size=8).digest(), "little", signed=True)


def node_layout(comm: Any, timeout_s: float | None = None, what: str = "init_process_group (node layout)") -> list[int]:
    """The node index of every rank of ``comm``, nodes numbered by their lowest rank.

    SPMD: collective over ``comm`` (one ``Allgather`` of 8 bytes per rank);
    with ``timeout_s``, polled and raising DistTimeoutError naming ``what`` when a rank never comes.
    """
    return _numbered(_gather_words(comm, [_key(node_identity())], timeout_s, what)[:, 0])


#: CPUs 0 .. 64 * _MASK_WORDS - 1 are gathered as a bitmask (exact union); CPUs beyond, rare, are counted per
#: distinct set
_MASK_WORDS = 16


def node_layout_and_cpus(
    comm: Any, timeout_s: float | None = None, what: str = "init_process_group (node layout)"
) -> tuple[list[int], list[int]]:
    """:func:`node_layout`, and for every rank the CPUs that the ranks of ``comm`` on its node may run on.

    A node's CPUs are the union of its ranks' affinity sets: a bitmask of CPUs 0-1023 per rank, OR-ed per
    node (CPUs numbered from 1024 up are counted once per distinct set of them). Every rank gets the same
    answer (one ``Allgather`` of 160 bytes per rank), so what depends on it (the shared-memory engine's
    oversubscribed table) is decided alike everywhere: a rank pinned to fewer CPUs than its peers must not
    pick another path than theirs.
    """
    cpus = affinity()
    limit = 64 * _MASK_WORDS
    mask = np.zeros(_MASK_WORDS, dtype=np.uint64)
    low = np.asarray([c for c in cpus if c < limit], dtype=np.uint64)
    np.bitwise_or.at(mask, (low >> np.uint64(6)).astype(np.intp), np.uint64(1) << (low & np.uint64(63)))
    high = tuple(c for c in cpus if c >= limit)
    fingerprint = int.from_bytes(hashlib.blake2b(repr(high).encode(), digest_size=8).digest(), "little", signed=True)
    head = [_key(node_identity()), len(high), fingerprint]
    words = _gather_words(comm, head + mask.view(np.int64).tolist(), timeout_s, what)
    layout = _numbered(words[:, 0])
    nodes = max(layout) + 1
    union = np.zeros((nodes, _MASK_WORDS), dtype=np.uint64)
    beyond: list[dict[int, int]] = [{} for _ in range(nodes)]
    for node, row in zip(layout, words, strict=True):
        union[node] |= row[3:].view(np.uint64)
        beyond[node][int(row[2])] = int(row[1])
    counts = [int(np.unpackbits(union[j].view(np.uint8)).sum()) + sum(beyond[j].values()) for j in range(nodes)]
    return layout, [counts[node] for node in layout]


def affinity() -> tuple[int, ...]:
    """The CPUs this process may run on, sorted (all of them where the OS has no affinity call)."""
    try:
        return tuple(sorted(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # pragma: no cover - not Linux
        return tuple(range(os.cpu_count() or 1))


def _gather_words(comm: Any, words: list[int], timeout_s: float | None, what: str) -> np.ndarray:
    """Every rank's ``words`` (int64, the same number on every rank), one row per rank of ``comm``."""
    mine = np.array(words, dtype=np.int64)
    if comm.Get_size() == 1:
        return mine.reshape(1, -1)
    from mpi4py import MPI

    out = np.empty((comm.Get_size(), len(words)), dtype=np.int64)
    if timeout_s is None:
        comm.Allgather([mine, MPI.INT64_T], [out, MPI.INT64_T])
    else:
        from ._timed import INIT_HINT, wait_or_raise

        req = comm.Iallgather([mine, MPI.INT64_T], [out, MPI.INT64_T])
        wait_or_raise(comm, [req], timeout_s, what, INIT_HINT)
    return out


def _numbered(keys: np.ndarray) -> list[int]:
    index: dict[int, int] = {}
    return [index.setdefault(int(k), len(index)) for k in keys]


def node_of_ranks(layout: Sequence[int], ranks: Sequence[int]) -> list[int]:
    """The node index of each of ``ranks`` (world ranks), renumbered 0.. by first appearance."""
    index: dict[int, int] = {}
    return [index.setdefault(layout[r], len(index)) for r in ranks]


def local_rank_size(nodes: Sequence[int], rank: int) -> tuple[int, int]:
    """``(local rank, local size)`` of ``rank`` given the node index of every rank."""
    mine = nodes[rank]
    return sum(1 for n in nodes[:rank] if n == mine), sum(1 for n in nodes if n == mine)


def split_shared(comm: Any, timeout_s: float, what: str, hint: str) -> Any:
    """``comm.Split_type(COMM_TYPE_SHARED)`` (the ranks MPI can give shared memory to), bounded by ``timeout_s``.

    The one place hpcdist calls ``MPI_Comm_split_type``: a polled barrier
    first (DistTimeoutError naming ``what`` and ``hint`` when a rank never
    comes), then the blocking split under the watchdog. Collective over
    ``comm``; the caller frees the result. In launcher-free worlds MPI's idea
    of "shared" may span hosts: use :func:`node_layout` for node-locality.
    """
    from mpi4py import MPI

    from ._timed import guarded

    return guarded(lambda: comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.Get_rank()), comm, timeout_s, what, hint)
