"""Helpers shared by the programs that tests/torch launches under mpiexec.

Each program runs once with backend "hpcdist" and once with torch's own
"gloo" (the reference), and saves what it computed per rank with
:func:`save`; the tests compare the two runs (and known answers).
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
import torch.distributed as dist


def init(backend: str, **kwargs: Any) -> tuple[int, int]:
    """Start torch.distributed with ``backend`` under mpiexec; return (rank, world size).

    gloo is torch's own: env:// over MASTER_ADDR/MASTER_PORT set by the test,
    rank and size from the launcher's PMI variables. hpcdist needs nothing.
    """
    if backend == "gloo":
        os.environ.setdefault("RANK", os.environ.get("PMI_RANK", "0"))
        os.environ.setdefault("WORLD_SIZE", os.environ.get("PMI_SIZE", "1"))
    else:
        import hpcdist.torch  # noqa: F401  (the entry point registers it too, when installed)
    dist.init_process_group(backend, **kwargs)
    return dist.get_rank(), dist.get_world_size()


def args() -> tuple[str, str]:
    """(backend, output directory) from the command line."""
    if len(sys.argv) < 3:
        raise SystemExit(f"usage: {sys.argv[0]} BACKEND OUTDIR")
    return sys.argv[1], sys.argv[2]


def save(outdir: str, name: str, obj: Any) -> None:
    """Save ``obj`` as OUTDIR/NAME.rankR.pt (R: the global rank)."""
    r = dist.get_rank() if dist.is_initialized() else int(os.environ.get("PMI_RANK", "0"))
    torch.save(obj, os.path.join(outdir, f"{name}.rank{r}.pt"))


def params(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A model's parameters, detached copies, by name."""
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def sharded_model() -> torch.nn.Module:
    """A small MLP sharded with FSDP2 (``fully_shard`` on each Linear, then the whole) over the default mesh."""
    from torch.distributed.fsdp import fully_shard

    m = torch.nn.Sequential(
        torch.nn.Linear(12, 20), torch.nn.ReLU(), torch.nn.Linear(20, 6), torch.nn.Linear(6, 6, bias=False)
    )
    for layer in m:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer)
    fully_shard(m)
    return m
