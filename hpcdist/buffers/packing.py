"""Pack several arrays into one flat buffer and back (list collectives, coalesced calls).

Written once for NumPy and CuPy arrays: ``unpack`` only slices and assigns,
``pack`` takes the array module to allocate with when the list is empty.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .adapters import Buf

__all__ = ["OWN_BLOCK_MIN", "displacements", "own_block", "pack", "unpack", "unpack_arrays"]

#: bytes from which an all-to-all's own block is copied outside MPI (:func:`own_block`); smaller ones go in the call
OWN_BLOCK_MIN = 32 << 10


def displacements(counts: list[int]) -> list[int]:
    """Where each of ``counts`` starts in one flat buffer: ``[0, c0, c0 + c1, ...]`` (MPI's ``displs``)."""
    out, pos = [], 0
    for n in counts:
        out.append(pos)
        pos += n
    return out


def pack(bufs: list[Buf], dtype: Any, xp: Any = np) -> Any:
    """The arrays of ``bufs`` concatenated (flattened) into one new array of ``xp``."""
    if not bufs:
        return xp.empty(0, dtype=dtype)
    return xp.concatenate([b.arr.reshape(-1) for b in bufs])


def unpack(flat: Any, outs: list[Buf]) -> None:
    """Scatter ``flat`` back into ``outs`` in order, each one's write-back right after its part."""
    pos = 0
    for o in outs:
        pos = _put(flat, pos, o.arr)
        if o.writeback is not None:
            o.writeback()


def unpack_arrays(flat: Any, arrays: list[Any]) -> None:
    """Scatter ``flat`` back into C-contiguous ``arrays`` in order (one that appears twice: the later part wins)."""
    pos = 0
    for a in arrays:
        pos = _put(flat, pos, a)


def _put(flat: Any, pos: int, arr: Any) -> int:
    """Copy ``arr.size`` items of ``flat`` from ``pos`` into ``arr``; return where the next part starts."""
    end = pos + arr.size
    arr.reshape(-1)[...] = flat[pos:end]
    return end


def own_block(inp: Any, out: Any, src: int, dst: int, count: int) -> bool:
    """Copy a rank's own block of an all-to-all (``count`` items of ``inp`` at ``src``) into ``out`` at ``dst``
    if it has :data:`OWN_BLOCK_MIN` bytes or more; True: copied, so MPI must move only the peers' blocks (the
    caller gives the rank's own counts as 0). False: nothing copied, the block goes in the MPI call.

    With its own block in the call, MPICH's Alltoallv took 13-27% longer than its Alltoall at 2 ranks
    (8 B to 8 MiB per rank); with the block copied here, 0.95-1.02x from 1 MiB per rank, 1.04-1.09x at
    64 KiB, but no gain at 8 KiB and below, where the copy's own cost (about 1 µs) is what MPI saves
    (docs/performance.md): hence :data:`OWN_BLOCK_MIN`.
    """
    if count * inp.itemsize < OWN_BLOCK_MIN:
        return False
    out.reshape(-1)[dst : dst + count] = inp.reshape(-1)[src : src + count]
    return True
