"""The host collective tests (tests/mpi/test_collectives.py), run on CuPy arrays and torch CUDA tensors.

Same bodies, same NumPy references; each runs over every device path of
conftest.py (staged MPI, CUDA-aware MPI, NCCL) and every group of the matrix.
Run with ``pytest tests/gpu`` (one rank) or
``mpiexec -n N python tests/mpi_pytest.py tests/gpu``.
"""

from __future__ import annotations

import pytest
from gpu_arrays import gpu_missing

pytestmark = pytest.mark.timeout(300)

pytest.importorskip("cupy", reason="the GPU tests need CuPy (pip install 'hpcdist[gpu]')")
_why = gpu_missing()
if _why is not None:
    pytest.skip(_why, allow_module_level=True)

from gpu_arrays import host_bodies  # noqa: E402

# host-only bodies: the buffer protocol / __array_interface__ / 0-d NumPy, and the
# non-contiguous and requires_grad tests that build CPU tensors (GPU twins in test_gpu_specific.py)
_HOST_ONLY = {
    "test_buffer_protocol_and_array_interface",
    "test_zero_size_and_scalar",
    "test_non_contiguous_in_and_out",
    "test_requires_grad_tensor",
}

globals().update(host_bodies(_HOST_ONLY))
