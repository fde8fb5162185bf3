"""The ``nccl`` backend: CUDA arrays through NCCL (via ``cupy.cuda.nccl``).

* :mod:`.engine`   — :class:`NCCLEngine`, one NCCL communicator per group;
* :mod:`.types`    — which dtype/op pairs NCCL reduces, and how (the reduction plans);
* :mod:`.work`     — :class:`CudaEventWork`, the Work of an enqueued operation (a CUDA event);
* :mod:`.watchdog` — ends the job when an NCCL operation outlives its timeout.

Importing this package imports no CuPy.
"""

from .engine import NCCLEngine, available, make_communicator, unique_id_bytes
from .work import CudaEventWork

__all__ = ["CudaEventWork", "NCCLEngine", "available", "make_communicator", "unique_id_bytes"]
