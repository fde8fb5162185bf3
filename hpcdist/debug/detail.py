"""``DETAIL`` debug mode: check that every rank enters the same collective.

The collectives call :func:`check_collective` only while
:data:`hpcdist.debug.levels.DETAIL` is set.
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

from ..errors import DistError
from ..work import timeout_error, wait_requests

__all__ = ["check_collective"]


def check_collective(pg: Any, desc: str) -> None:
    """DETAIL mode: verify every rank of ``pg`` is entering the same collective (``desc``).

    One all-gather of a 64-bit fingerprint (op, dtype, root/op) before the
    collective; on a mismatch every rank raises a DistError that lists what
    each rank called, instead of hanging or exchanging wrong data.
    """
    mine = np.array([zlib.crc32(desc.encode())], dtype=np.int64)
    table = np.empty(pg._size, dtype=np.int64)
    if not wait_requests([pg._comm.Iallgather(mine, table)], pg._timeout_s):
        raise timeout_error((f"{desc} (debug DETAIL fingerprint check)", pg), pg._timeout_s)
    if (table == mine[0]).all():
        return
    descs = pg._comm.allgather(desc)
    calls = "; ".join(f"global rank {pg._ranks[r]}: {d}" for r, d in enumerate(descs))
    raise DistError(f"collective mismatch on {pg!r} (ranks must call the same collectives in the same order): {calls}")
