"""Array adapters, dtype maps and staging (see :mod:`.adapters`, :mod:`.dtypes`)."""

from ..gpu import adapters as _gpu_adapters  # noqa: F401  (registers the GPU adapters; imports no CuPy)
from .adapters import Buf, adapt, adapt_list, register_adapter
from .dtypes import HALF_DTYPES, mpi_datatype

__all__ = ["HALF_DTYPES", "Buf", "adapt", "adapt_list", "mpi_datatype", "register_adapter"]
