"""Availability queries and small helpers of torch.distributed's API."""

from __future__ import annotations

import os
from typing import Any

from ._world import WORLD
from .backends import is_backend_available
from .config import parse_number

__all__ = [
    "get_default_backend_for_device",
    "get_node_local_rank",
    "is_available",
    "is_backend_available",
    "is_gloo_available",
    "is_mpi_available",
    "is_nccl_available",
    "is_torchelastic_launched",
    "is_ucc_available",
    "is_xccl_available",
]


def is_available() -> bool:
    """Whether hpcdist can run here (mpi4py importable)."""
    return is_backend_available("mpi")


def is_mpi_available() -> bool:
    """True: MPI is hpcdist's native backend."""
    return is_backend_available("mpi")


def is_gloo_available() -> bool:
    """True: ``gloo`` is accepted and runs on MPI."""
    return is_backend_available("gloo")


def is_nccl_available() -> bool:
    """Whether the NCCL backend can be used (CuPy with NCCL and a GPU)."""
    return is_backend_available("nccl")


def is_ucc_available() -> bool:
    return False


def is_xccl_available() -> bool:
    return False


def is_torchelastic_launched() -> bool:
    """Whether torchrun/torchelastic launched this process (TORCHELASTIC_RUN_ID set)."""
    return os.environ.get("TORCHELASTIC_RUN_ID") is not None


def get_default_backend_for_device(device: Any) -> str:
    """The backend hpcdist uses for ``device`` ('cpu' -> 'mpi', 'cuda' -> 'mpi'; NCCL only when asked)."""
    kind = getattr(device, "type", device)
    if not isinstance(kind, str):
        raise TypeError(f"device must be a string or torch.device, got {type(device).__name__}")
    kind = kind.split(":", 1)[0].lower()
    if kind not in ("cpu", "cuda"):
        raise ValueError(f"device must be 'cpu' or 'cuda', got {device!r}")
    pg = WORLD.default_pg
    if pg is not None and kind in pg._backend_map:
        return str(pg._backend_map[kind])
    return "mpi"


def get_node_local_rank(fallback_rank: int | None = None) -> int:
    """This process's rank among the processes of its node.

    From ``LOCAL_RANK`` when set (torchrun, ``hpcdist run``), else from MPI
    (ranks sharing memory with this one) once initialized, else
    ``fallback_rank``; RuntimeError when none is available.
    """
    raw = os.environ.get("LOCAL_RANK")
    if raw is not None:
        return int(parse_number(raw, "environment variable LOCAL_RANK", minimum=0, unit="a rank"))
    pg = WORLD.default_pg
    if pg is not None:
        return node_local_rank(pg)
    if fallback_rank is not None:
        return int(fallback_rank)
    raise RuntimeError(
        "LOCAL_RANK is not set and the process group is not initialized; pass fallback_rank or call "
        "init_process_group first"
    )


def node_local_rank(pg: Any) -> int:
    """Rank among the ranks of ``pg`` on this node (``MPI_Comm_split_type`` SHARED, bounded by the group's
    timeout); cached on the group, so every rank enters the split the same number of times."""
    if pg._node_local is None:
        from .topology import local_rank_size, node_of_ranks

        pg._node_local = local_rank_size(node_of_ranks(WORLD.node_of, pg._ranks), pg._rank)[0]
    return int(pg._node_local)
