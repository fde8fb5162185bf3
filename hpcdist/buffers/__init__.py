"""Array adapters, dtype maps and packing (see :mod:`.adapters`, :mod:`.dtypes`).

A low layer: it imports no other part of hpcdist but :mod:`hpcdist.ops`.
The device-array adapters register themselves here from :mod:`hpcdist.gpu`
(which ``import hpcdist`` imports), so nothing here knows about devices.
"""

from .adapters import Buf, adapt, adapt_list, register_adapter
from .dtypes import HALF_DTYPES, mpi_datatype

__all__ = ["HALF_DTYPES", "Buf", "adapt", "adapt_list", "mpi_datatype", "register_adapter"]
