"""Rank, size, local rank and local size of this process, from the variables
its launcher set: what the bootstrap turns into torchrun's ``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE``.

The launcher table lives in :mod:`hpcdist.rendezvous.detect`; this module
fills the gaps it leaves (srun publishes no local size: it is the length of
``SLURM_GTIDS``) and falls back to a one-process job when no launcher is
detected.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["RankInfo", "rank_info"]


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits in the job, as its launcher says."""

    launcher: str | None
    rank: int
    size: int
    local_rank: int
    local_size: int


def _slurm_local_size(env: Mapping[str, str]) -> int | None:
    gtids = env.get("SLURM_GTIDS", "").strip()
    return len(gtids.split(",")) if gtids else None


def rank_info(env: Mapping[str, str] | None = None) -> RankInfo:
    """This process's place in the job; ``(None, 0, 1, 0, 1)`` without a launcher.

    Where the launcher gives no locality, a single node is assumed (local rank
    = rank, local size = size), as torchrun does for a one-node job.
    """
    from hpcdist.rendezvous.detect import detect_launcher, launcher_local_rank_size, launcher_rank_size

    env = os.environ if env is None else env
    launcher = detect_launcher(env)
    rank_size = launcher_rank_size(env)
    if launcher is None or rank_size is None:
        return RankInfo(launcher, 0, 1, 0, 1)
    rank, size = rank_size
    local_rank, local_size = launcher_local_rank_size(env)
    if local_size is None and launcher == "srun":
        local_size = _slurm_local_size(env)
        if local_rank is None:
            local_rank = int(env.get("SLURM_LOCALID", "0") or 0)
    if local_rank is None or local_size is None:
        local_rank, local_size = rank, size
    return RankInfo(launcher, rank, size, local_rank, local_size)
