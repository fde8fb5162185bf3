"""Host arrays over MPI: :class:`MPIEngine`, every operation as one MPI call (see :mod:`.engine`)."""

from .engine import MPIEngine

__all__ = ["MPIEngine"]
