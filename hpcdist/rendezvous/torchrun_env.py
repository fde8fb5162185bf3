"""Export torchrun's environment variables after init, for third-party code.

Libraries written for ``torchrun`` read ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``.
Under ``mpiexec``/``srun`` nobody sets them; :func:`export_torchrun_env` does.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from datetime import timedelta
from typing import TYPE_CHECKING

from hpcdist._launchenv import TORCHRUN_VARS, free_port, torchrun_values
from hpcdist._timed import INIT_HINT, timed_bcast_json
from hpcdist.config import default_timeout
from hpcdist.rendezvous.group_store import host_address

if TYPE_CHECKING:
    from mpi4py import MPI

    from hpcdist.store import Store

__all__ = ["TORCHRUN_VARS", "export_torchrun_env", "restore_env"]


def _master(store: Store | None, single_node: bool) -> tuple[str, str]:
    """Rank 0's MASTER_ADDR/MASTER_PORT: what is set, else the TCP store's host and a free port.

    Not the store's port: code written for torch binds a server of its own at
    MASTER_PORT on rank 0 (``init_process_group("gloo", "env://")``), which
    must not collide with hpcdist's store, nor talk to it without its secret.
    """
    addr = os.environ.get("MASTER_ADDR", "").strip()
    port = os.environ.get("MASTER_PORT", "").strip()
    store_host = getattr(store, "host", None)
    if not addr:
        addr = str(store_host) if store_host else ("127.0.0.1" if single_node else host_address())
    if not port:
        port = str(free_port())
    return addr, port


def export_torchrun_env(
    comm: MPI.Intracomm,
    rank: int,
    world_size: int,
    *,
    store: Store | None = None,
    timeout: timedelta | None = None,
    node_of: Sequence[int] | None = None,
) -> dict[str, tuple[str | None, str]]:
    """Set torchrun's variables in ``os.environ`` from the joined world.

    SPMD: collective over ``comm`` (one broadcast, and the node layout when
    ``node_of``, the node index of every rank from
    :func:`hpcdist.topology.node_layout`, is not given), bounded by
    ``timeout`` (default: ``HPCDIST_TIMEOUT``).
    ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` are set to the
    truth (rewritten only when they differ); the node-local ones count the
    ranks of this node by :func:`hpcdist.topology.node_identity`, so they are
    right in worlds joined without a launcher too. ``MASTER_ADDR``/``MASTER_PORT``
    are rank 0's: its values when it has them set, else the host of the TCP
    ``store`` when given (else rank 0's host, 127.0.0.1 on a single node) and
    a port that was free on rank 0 (never the store's own port); every rank
    gets the same pair. Returns what it changed, name -> (earlier value or
    None, the value set), for :func:`restore_env`.
    """
    limit = (timeout or default_timeout()).total_seconds()
    what = "init_process_group (torchrun environment)"
    from hpcdist.topology import local_rank_size, node_layout

    nodes = node_layout(comm, limit) if node_of is None else node_of
    local_rank, local_size = local_rank_size(nodes, comm.Get_rank())
    single_node = local_size == world_size
    master = _master(store, single_node) if comm.Get_rank() == 0 else None
    addr, port = timed_bcast_json(comm, master, 0, limit, what, INIT_HINT)
    values = torchrun_values(rank, world_size, local_rank, local_size, addr, port)
    changed: dict[str, tuple[str | None, str]] = {}
    for name, value in values.items():
        if os.environ.get(name) != value:
            changed[name] = (os.environ.get(name), value)
            os.environ[name] = value
    return changed


def restore_env(changed: dict[str, tuple[str | None, str]]) -> None:
    """Undo :func:`export_torchrun_env` (``destroy_process_group``): each variable it set, and nobody changed since,
    goes back to its earlier value (or away). The next init then rendezvouses afresh, not at the last world's
    ``MASTER_PORT``."""
    for name, (before, ours) in changed.items():
        if os.environ.get(name) != ours:
            continue
        if before is None:
            del os.environ[name]
        else:
            os.environ[name] = before
