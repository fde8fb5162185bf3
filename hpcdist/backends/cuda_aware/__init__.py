"""Device arrays over a CUDA-aware MPI: :class:`CudaAwareEngine` (see :mod:`.engine`)."""

from .engine import CudaAwareEngine

__all__ = ["CudaAwareEngine"]
