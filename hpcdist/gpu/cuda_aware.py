"""Is the MPI library CUDA-aware? The answer and how it was reached.

Order of evidence (first that answers wins):

1. ``HPCDIST_CUDA_AWARE=1/0`` (:func:`hpcdist.config.cuda_aware_override`);
2. the MPI library's own answer: ``MPIX_Query_cuda_support()`` (Open MPI,
   MPICH >= 4, MVAPICH2) or ``MPIX_GPU_query_support(CUDA)`` (MPICH >= 4),
   looked up in the loaded MPI library (MPI must be initialized);
3. vendor settings in the environment (:data:`VENDOR_SETTINGS`, extend it
   with :func:`register_vendor_setting`): Cray ``MPICH_GPU_SUPPORT_ENABLED``,
   MVAPICH2 ``MV2_USE_CUDA``, Open MPI ``OMPI_MCA_opal_cuda_support``, MPICH
   ``MPIR_CVAR_ENABLE_GPU``;
4. otherwise: not CUDA-aware (device arrays are staged through host memory).

:func:`detect` is the pure decision (environment and MPI answer in, result
out); :func:`cuda_aware_mpi` feeds it this process's environment and MPI.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from .. import config

__all__ = [
    "VENDOR_SETTINGS",
    "CudaAwareness",
    "cuda_aware_mpi",
    "detect",
    "query_mpi",
    "register_vendor_setting",
]


@dataclass(frozen=True)
class CudaAwareness:
    """The answer: ``enabled``; ``source`` (override|mpi|vendor|default); ``reason`` in words.

    Truthy when enabled, so ``if hpcdist.cuda_aware_mpi(): ...`` reads naturally.
    """

    enabled: bool
    source: str
    reason: str

    def __bool__(self) -> bool:
        return self.enabled


#: environment variable -> the MPI it belongs to; tried in this order
VENDOR_SETTINGS: dict[str, str] = {
    "MPICH_GPU_SUPPORT_ENABLED": "Cray MPICH",
    "MV2_USE_CUDA": "MVAPICH2",
    "OMPI_MCA_opal_cuda_support": "Open MPI",
    "MPIR_CVAR_ENABLE_GPU": "MPICH",
}

#: the words of the vendors' own variables (HPCDIST_CUDA_AWARE takes the knobs' words, config.env_flag)
_TRUE = {"1", "true", "yes", "on", "enable", "enabled"}
_FALSE = {"0", "false", "no", "off", "disable", "disabled"}


def register_vendor_setting(var: str, vendor: str) -> None:
    """Add an environment variable whose 1/0 value says whether ``vendor``'s MPI moves GPU memory."""
    if not isinstance(var, str) or not var or not isinstance(vendor, str) or not vendor:
        raise ValueError(f"register_vendor_setting needs a variable name and a vendor name, got {var!r}, {vendor!r}")
    if var in VENDOR_SETTINGS:
        raise ValueError(f"vendor setting {var!r} is already registered (for {VENDOR_SETTINGS[var]})")
    VENDOR_SETTINGS[var] = vendor


def _override(env: Mapping[str, str]) -> CudaAwareness | None:
    # one parser for both (the mapping: tests, hpcdist info of another environment): the knobs' boolean words
    value = config.cuda_aware_override() if env is os.environ else config.env_flag("HPCDIST_CUDA_AWARE", None, env)
    if value is None:
        return None
    return CudaAwareness(value, "override", f"HPCDIST_CUDA_AWARE={env.get('HPCDIST_CUDA_AWARE', '').strip()}")


def _vendor(env: Mapping[str, str]) -> CudaAwareness | None:
    for var, vendor in VENDOR_SETTINGS.items():
        raw = env.get(var)
        if raw is None:
            continue
        value = raw.strip().lower()
        if value in _TRUE or value in _FALSE:
            return CudaAwareness(value in _TRUE, "vendor", f"{var}={raw.strip()} ({vendor} setting)")
    return None


def detect(env: Mapping[str, str], mpi_answer: tuple[bool, str] | None) -> CudaAwareness:
    """The decision: override, then the MPI's answer, then vendor settings, else False."""
    hit = _override(env)
    if hit is not None:
        return hit
    if mpi_answer is not None:
        return CudaAwareness(bool(mpi_answer[0]), "mpi", mpi_answer[1])
    hit = _vendor(env)
    if hit is not None:
        return hit
    return CudaAwareness(
        False,
        "default",
        "the MPI library does not answer MPIX_Query_cuda_support and no vendor setting "
        f"({', '.join(VENDOR_SETTINGS)}) is set",
    )


def _mpi_library() -> Any:
    """A ctypes handle that resolves the symbols of the MPI library mpi4py loaded."""
    import ctypes

    mpi: Any = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        from mpi4py import MPI as mpi
    return ctypes.CDLL(mpi.__file__)  # dlsym through the extension finds its libmpi's symbols


def query_mpi() -> tuple[bool, str] | None:
    """The MPI library's own answer, or None when it has no query or MPI is not initialized."""
    try:
        from mpi4py import MPI

        if not MPI.Is_initialized() or MPI.Is_finalized():
            return None
        lib = _mpi_library()
        vendor, version = MPI.get_vendor()
    except Exception:
        return None
    import ctypes

    name = f"{vendor} {'.'.join(map(str, version))}"
    fn = getattr(lib, "MPIX_Query_cuda_support", None)
    if fn is not None:
        fn.restype = ctypes.c_int
        fn.argtypes = []
        ret = int(fn())
        if ret >= 0:
            return (ret == 1, f"MPIX_Query_cuda_support() returned {ret} ({name})")
    fn = getattr(lib, "MPIX_GPU_query_support", None)
    if fn is not None:
        out = ctypes.c_int(0)
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.c_int, ctypes.POINTER(ctypes.c_int)]
        if fn(0, ctypes.byref(out)) == 0:  # 0 = MPIX_GPU_SUPPORT_CUDA
            return (out.value == 1, f"MPIX_GPU_query_support(CUDA) returned {out.value} ({name})")
    return None


_MPI_ANSWER: list[tuple[bool, str]] = []


def cuda_aware_mpi(refresh: bool = False) -> CudaAwareness:
    """Whether device arrays go to MPI directly (True) or are staged through host memory.

    The MPI library's answer is asked once per process (``refresh=True`` asks
    again); ``HPCDIST_CUDA_AWARE`` is read on every call, so setting it before
    a group first moves device arrays decides that group's path.
    """
    hit = _override(os.environ)
    if hit is not None:
        return hit
    if refresh or not _MPI_ANSWER:
        answer = query_mpi()
        if answer is None:  # not initialized yet, or no query: ask again next time
            return detect(os.environ, None)
        _MPI_ANSWER[:] = [answer]
    return detect(os.environ, _MPI_ANSWER[0])
