"""Which engine serves a (group, device type) pair: the one place that decides.

The registry maps a backend name to ``(factory, devices)``: ``factory(pg,
device_type)`` builds the :class:`~hpcdist.backends.engine.Engine` of one
group, ``devices`` are the device types the backend serves (stored here
only; :class:`~hpcdist.backends.Backend` and :func:`~hpcdist.backends.parse_backend`
read them). hpcdist's own entries:

``mpi`` (and ``gloo``, which runs on MPI)
    host arrays: the hierarchical engine for a group spanning nodes
    (:func:`hpcdist.backends.hierarchical.hierarchical_or_none`), else the
    shared-memory engine on a node where it wins, else the plain MPI engine
    (:func:`hpcdist.backends.shm.host_engine`). Device arrays: the
    CUDA-aware engine when :func:`hpcdist.gpu.cuda_aware_mpi` says so, else
    the staged engine, warning once with the fix unless
    ``HPCDIST_CUDA_AWARE=0`` chose staging.
``nccl``
    device arrays through NCCL.

Each factory imports its engine's module when first called: nothing here
imports MPI, CuPy or an engine at import time. Third-party backends add an
entry with :func:`register` (through ``Backend.register_backend``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from .engine import Engine

__all__ = ["devices_of", "known", "register", "select_engine", "staging_warning"]

Factory = Callable[[Any, str], Any]


def _mpi(pg: Any, device_type: str) -> Engine:
    if device_type == "cuda":
        return _mpi_device(pg)
    from .hierarchical import hierarchical_or_none
    from .shm import host_engine

    return hierarchical_or_none(pg, device_type) or host_engine(pg, device_type)


_WARNED: list[bool] = []


def staging_warning(why: Any) -> str:
    """The warning shown once when device arrays are staged through host memory without being asked to."""
    return (
        f"hpcdist: this MPI is not CUDA-aware ({why.reason}), so device arrays are copied through pinned host "
        "memory on every call. For direct GPU transfers use a CUDA-aware MPI (Open MPI or MPICH built with CUDA/UCX, "
        "MVAPICH2-GDR with MV2_USE_CUDA=1, Cray MPICH with MPICH_GPU_SUPPORT_ENABLED=1) and mpi4py built against it, "
        "or backend='cpu:mpi,cuda:nccl'. HPCDIST_CUDA_AWARE=1 forces the direct path; HPCDIST_CUDA_AWARE=0 chooses "
        "staging and silences this warning."
    )


def _mpi_device(pg: Any) -> Engine:
    """Device arrays over MPI: CUDA-aware when this MPI is, else staged (warning once unless chosen)."""
    from ..gpu.cuda_aware import cuda_aware_mpi

    aware = cuda_aware_mpi()
    if aware.enabled:
        from .cuda_aware import CudaAwareEngine

        return CudaAwareEngine(pg, "cuda")
    if aware.source != "override" and not _WARNED:
        _WARNED.append(True)
        warnings.warn(staging_warning(aware), RuntimeWarning, stacklevel=5)
    from .staged import StagedEngine

    return StagedEngine(pg, "cuda")


def _nccl(pg: Any, device_type: str) -> Engine:
    from .nccl import NCCLEngine

    return NCCLEngine(pg, device_type)


#: backend name -> (factory(pg, device_type) -> Engine, the device types it serves)
_REGISTRY: dict[str, tuple[Factory, tuple[str, ...]]] = {
    "mpi": (_mpi, ("cpu", "cuda")),
    "gloo": (_mpi, ("cpu", "cuda")),
    "nccl": (_nccl, ("cuda",)),
}


def register(name: str, factory: Factory, devices: tuple[str, ...]) -> None:
    """Add backend ``name`` (lower case); a name already registered raises ValueError."""
    if name in _REGISTRY:
        raise ValueError(f"backend {name!r} is already registered")
    _REGISTRY[name] = (factory, devices)


def known() -> list[str]:
    """The registered backend names, sorted."""
    return sorted(_REGISTRY)


def devices_of(name: str) -> tuple[str, ...]:
    """The device types backend ``name`` serves (ValueError when unknown)."""
    hit = _REGISTRY.get(name)
    if hit is None:
        raise ValueError(f"unknown backend {name!r}: expected one of {known()}")
    return hit[1]


def select_engine(pg: Any, name: str, device_type: str) -> Engine:
    """Build the engine of backend ``name`` moving ``pg``'s arrays of ``device_type`` (see module docstring).

    Args:
        pg: the process group the engine serves (it keeps the engine; see
            :meth:`hpcdist.ProcessGroup.engine`).
        name: a registered backend name.
        device_type: ``"cpu"`` or ``"cuda"``.

    Returns:
        The engine. A factory that returns something else than an
        :class:`~hpcdist.backends.engine.Engine` raises TypeError.
    """
    hit = _REGISTRY.get(name)
    if hit is None:
        raise ValueError(f"unknown backend {name!r}: expected one of {known()}")
    eng = hit[0](pg, device_type)
    if not isinstance(eng, Engine):
        raise TypeError(
            f"backend {name!r}: its factory returned {type(eng).__name__}, not an engine; subclass "
            "hpcdist.backends.Engine (see docs/architecture.md, 'Write an engine')"
        )
    return eng
