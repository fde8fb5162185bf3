"""GPU support: CUDA-aware MPI detection, device selection, device-array adapters.

Importing this package is cheap (no CuPy, no torch, no MPI call): the array
adapters it registers probe ``sys.modules``, and everything that needs CuPy
imports it when first used.

* :func:`cuda_aware_mpi` — whether device arrays go to MPI directly, and why;
* :func:`device_for_local_rank` / :func:`set_device_for_local_rank` — the GPU
  of this rank from its node-local rank, respecting ``CUDA_VISIBLE_DEVICES``
  and ``init_process_group(device_id=...)``.

The engines live in :mod:`hpcdist.backends.mpi_cuda` (CUDA-aware),
:mod:`hpcdist.backends.mpi_cuda_staged` (staged) and
:mod:`hpcdist.backends.nccl`.
"""

from __future__ import annotations

from .cuda_aware import CudaAwareness, cuda_aware_mpi, register_vendor_setting
from .device import current_device, device_for_local_rank, set_device_for_local_rank, visible_devices

__all__ = [
    "CudaAwareness",
    "cuda_aware_mpi",
    "current_device",
    "device_for_local_rank",
    "register_vendor_setting",
    "set_device_for_local_rank",
    "visible_devices",
]
