"""Which GPU this rank uses.

:func:`device_for_local_rank` maps the node-local rank (``LOCAL_RANK``, else
the ranks of this node by :mod:`hpcdist.topology`) onto the devices this process can
see: ``local_rank % visible``. CUDA ordinals already count only the devices
``CUDA_VISIBLE_DEVICES`` lists, so a launcher that gives each rank its own
GPU (``srun --gpus-per-task=1``, ``CUDA_VISIBLE_DEVICES=3``) yields ordinal 0
on every rank, and a node where every rank sees all 4 GPUs yields
0, 1, 2, 3. ``init_process_group(device_id=...)`` takes precedence.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from typing import Any

from .._world import WORLD

__all__ = [
    "bound_device_index",
    "current_device",
    "device_count",
    "device_for_local_rank",
    "ordinal_for_local_rank",
    "physical_device",
    "set_device_for_local_rank",
    "visible_devices",
]


def visible_devices(env: Mapping[str, str] | None = None) -> list[str] | None:
    """The entries of ``CUDA_VISIBLE_DEVICES`` CUDA will use, or None when it is unset.

    As CUDA does, the list stops at the first invalid entry (``"0,-1,2"`` ->
    ``["0"]``; ``""`` and ``"-1"`` -> no device). Entries may be indices or
    UUIDs (``GPU-...``, ``MIG-...``).
    """
    raw = (os.environ if env is None else env).get("CUDA_VISIBLE_DEVICES")
    if raw is None:
        return None
    out: list[str] = []
    for token in raw.split(","):
        t = token.strip()
        if not t:
            break
        if t.lstrip("-").isdigit():
            if int(t) < 0:
                break
        elif not t.startswith(("GPU-", "MIG-")):
            break
        out.append(t)
    return out


def physical_device(ordinal: int, env: Mapping[str, str] | None = None) -> str:
    """The ``CUDA_VISIBLE_DEVICES`` entry behind CUDA ordinal ``ordinal`` (the ordinal itself when unset)."""
    vis = visible_devices(env)
    if vis is None:
        return str(ordinal)
    if not 0 <= ordinal < len(vis):
        raise ValueError(
            f"CUDA ordinal {ordinal} is not visible: CUDA_VISIBLE_DEVICES lists {len(vis)} device(s) {vis}"
        )
    return vis[ordinal]


def ordinal_for_local_rank(local_rank: int, runtime_count: int | None, visible: list[str] | None) -> int:
    """``local_rank % n`` where n is the CUDA runtime's device count, else the visible list's length.

    Raises RuntimeError when no device is visible.
    """
    if isinstance(local_rank, bool) or not isinstance(local_rank, int) or local_rank < 0:
        raise ValueError(f"local_rank must be a non-negative int, got {local_rank!r}")
    n = runtime_count if runtime_count is not None else (len(visible) if visible is not None else 0)
    if n <= 0:
        shown = "unset" if visible is None else repr(",".join(visible))
        raise RuntimeError(
            f"no CUDA device is visible to this process (CUDA_VISIBLE_DEVICES {shown}); run on a GPU node, "
            "ask the scheduler for GPUs (e.g. srun --gpus-per-task=1), or keep the arrays on the host"
        )
    return local_rank % n


def device_count() -> int | None:
    """Devices the CUDA runtime sees (CuPy, else an already imported torch); None without either."""
    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is not None:
        try:
            return int(cupy.cuda.runtime.getDeviceCount())
        except Exception:
            return 0
    torch = sys.modules.get("torch")
    if torch is not None:
        return int(torch.cuda.device_count())
    return None


def bound_device_index(device_id: Any) -> int | None:
    """The CUDA ordinal of ``init_process_group(device_id=...)``: an int, ``"cuda:1"`` or ``torch.device``.

    None when ``device_id`` is None; ``"cuda"`` without an index means the
    current device. ValueError for anything that is not a CUDA device.
    """
    if device_id is None:
        return None
    if isinstance(device_id, bool):
        raise TypeError(f"device_id must be an int, 'cuda:N' or a torch.device, got {device_id!r}")
    if isinstance(device_id, int):
        if device_id < 0:
            raise ValueError(f"device_id must be a CUDA ordinal >= 0, got {device_id}")
        return device_id
    kind: Any
    if isinstance(device_id, str):
        kind, _, index = device_id.partition(":")
    else:
        kind = getattr(device_id, "type", None)
        raw_index = getattr(device_id, "index", None)
        index = "" if raw_index is None else str(raw_index)
    if kind != "cuda":
        raise ValueError(f"device_id must be a CUDA device ('cuda:N', an int or a torch.device), got {device_id!r}")
    if index == "":
        return current_device()
    if not index.isdigit():
        raise ValueError(f"device_id {device_id!r}: expected 'cuda:N' with N a non-negative int")
    return int(index)


def current_device() -> int:
    """The calling thread's current CUDA device (needs CuPy, or torch when already imported)."""
    try:
        import cupy
    except ImportError:
        torch = sys.modules.get("torch")
        if torch is not None and torch.cuda.is_available():
            return int(torch.cuda.current_device())
        raise RuntimeError(
            "the current CUDA device cannot be queried without CuPy: pip install 'hpcdist[gpu]'"
        ) from None
    return int(cupy.cuda.runtime.getDevice())


_WORLD_LOCAL: list[int] = []  # node-local rank in COMM_WORLD, found once (a collective: every rank finds it once)


def _local_rank() -> int:
    from .._queries import get_node_local_rank

    try:
        return get_node_local_rank()
    except RuntimeError:
        if not _WORLD_LOCAL:
            from mpi4py import MPI

            from ..config import default_timeout
            from ..topology import split_shared

            hint = "choosing a GPU before init_process_group is collective over COMM_WORLD: every rank must do it"
            limit = default_timeout().total_seconds()
            node = split_shared(MPI.COMM_WORLD, limit, "device_for_local_rank", hint)
            _WORLD_LOCAL.append(int(node.Get_rank()))
            node.Free()
        return _WORLD_LOCAL[0]


def device_for_local_rank(local_rank: int | None = None) -> int:
    """The CUDA ordinal this rank should use.

    ``init_process_group(device_id=...)`` wins when given; else
    ``local_rank % device_count`` with ``local_rank`` from ``LOCAL_RANK`` or
    MPI (ranks sharing this node's memory). Raises RuntimeError without a
    visible GPU.
    """
    bound = bound_device_index(WORLD.device_id) if local_rank is None else None
    if bound is not None:
        return bound
    rank = _local_rank() if local_rank is None else local_rank
    return ordinal_for_local_rank(rank, device_count(), visible_devices())


def set_device_for_local_rank(local_rank: int | None = None) -> int:
    """Make :func:`device_for_local_rank`'s device current (CuPy and torch); return its ordinal.

    Call it before creating device arrays, e.g. right after
    ``init_process_group``.
    """
    index = device_for_local_rank(local_rank)
    done = False
    try:
        import cupy
    except ImportError:
        cupy = None
    if cupy is not None:
        cupy.cuda.Device(index).use()
        done = True
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        torch.cuda.set_device(index)
        done = True
    if not done:
        raise RuntimeError("set_device_for_local_rank needs CuPy or a CUDA build of torch: pip install 'hpcdist[gpu]'")
    return index
