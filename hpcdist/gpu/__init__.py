"""GPU support: CUDA-aware MPI detection, device selection, device-array adapters.

Importing this package is cheap (no CuPy, no torch, no MPI call): the array
adapters it registers probe ``sys.modules``, and everything that needs CuPy
imports it when first used.

* :func:`cuda_aware_mpi` — whether device arrays go to MPI directly, and why;
* :func:`device_for_local_rank` / :func:`set_device_for_local_rank` — the GPU
  of this rank from its node-local rank, respecting ``CUDA_VISIBLE_DEVICES``
  and ``init_process_group(device_id=...)``.

Device plumbing only: the engines that move device arrays live in
:mod:`hpcdist.backends.cuda_aware`, :mod:`hpcdist.backends.staged` and
:mod:`hpcdist.backends.nccl`.
"""

from __future__ import annotations

from . import adapters as _adapters  # noqa: F401  (registers the device-array adapters; imports no CuPy)
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
