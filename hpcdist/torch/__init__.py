"""hpcdist as a ``torch.distributed`` backend: ``init_process_group("hpcdist")``.

Importing this package registers the backend "hpcdist" (CPU and CUDA
tensors) and the ``mpi://`` rendezvous with torch; it makes no MPI call.
Then unmodified torch code (DDP, FSDP2, DTensor, torch.distributed.checkpoint)
runs over MPI::

    import torch.distributed as dist
    import hpcdist.torch  # noqa: F401  (or run: python -m hpcdist.torch train.py)

    dist.init_process_group("hpcdist")  # under mpiexec/srun: rank and size from MPI

Under torchrun (``env://`` with ``MASTER_ADDR``), ``tcp://`` and
``file://`` the processes join one MPI communicator over MPI ports. See
docs/torch.md.
"""

from __future__ import annotations

from .backend import BACKEND_NAME, HpcdistProcessGroup
from .registration import register
from .work import HpcdistWork

__all__ = ["BACKEND_NAME", "HpcdistProcessGroup", "HpcdistWork", "register"]

register()
