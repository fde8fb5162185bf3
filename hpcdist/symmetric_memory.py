"""Symmetric memory: host arrays that every rank of a node's group reads where they lie.

The host-array counterpart of torch's ``torch.distributed._symmetric_memory``
(and of NCCL's registered buffers): :func:`empty` allocates, collectively,
one array per rank in a shared mapping every rank of the group can see. The
shared-memory engine recognises such arrays (and views of them) and runs
``all_reduce``, ``broadcast``, ``all_gather_into_tensor`` (input) and
``reduce_scatter_tensor`` (input) on them without copying through its
segment: about half the memory traffic; at 2 ranks on the development VM
all_reduce ran at about 2x raw MPI at 1 MiB and 2.3-4.3x from 4 MiB
(docs/benchmarks/symmetric.md).
Everything else about the arrays is ordinary NumPy::

    import numpy as np
    import hpcdist as dist
    from hpcdist import symmetric_memory

    flat = symmetric_memory.empty(25 << 18, dtype=np.float32)   # collective over the group
    flat[:] = local_gradients
    dist.all_reduce(flat)                                          # no copy through the segment

PyTorch CPU tensors share the memory with ``torch.from_numpy(flat)``.
"""

from __future__ import annotations

import operator
from typing import Any

import numpy as np

from .buffers.adapters import adapt
from .buffers.dtypes import supported
from .group import resolve_group

__all__ = ["empty", "is_symmetric"]


def _shape(size: tuple[Any, ...]) -> tuple[int, ...]:
    """``empty``'s ``*size`` (ints, or one tuple or list of them) as a shape."""
    dims = size[0] if len(size) == 1 and isinstance(size[0], (tuple, list)) else size
    try:
        shape = tuple(operator.index(d) for d in dims)
    except TypeError:
        raise TypeError(f"size must be ints (or one tuple of them), got {size!r}") from None
    if any(d < 0 for d in shape):
        raise ValueError(f"size must have no negative dimension, got {shape}")
    return shape


def empty(*size: Any, dtype: Any = np.float32, group: Any = None) -> np.ndarray | None:
    """This rank's array of a new symmetric allocation over ``group`` (zero-filled, C-contiguous).

    SPMD: collective over ``group``; every rank calls it with the same
    ``size`` and ``dtype`` (checked: a ValueError on every rank otherwise),
    and every rank of the group must be on this node. Bounded by the group's
    timeout. The memory lives while the array or any view of it does; nothing
    is left in ``/dev/shm``.

    Collectives on the group take the symmetric path when every rank passes
    an array (or view) of the same allocation, the operation takes shared memory at that size
    (``hpcdist info``), and the dtype and op need no conversion (half floats
    and PREMUL_SUM go through the segment). A rank that passes another array
    where its peers pass symmetric memory gets a DistError on every rank.

    Args:
        size: the shape, as ints or one tuple (``empty(4, 8)``, ``empty((4, 8))``).
        dtype: a NumPy dtype that MPI can reduce (default float32).
        group: the process group (default: the default group).

    Returns:
        The array (None on ranks outside ``group``).
    """
    shape = _shape(size)
    try:
        dt = np.dtype(dtype)
    except TypeError as e:
        raise TypeError(f"dtype must be a NumPy dtype (numpy.float32, 'float64', ...), got {dtype!r}") from e
    pg = resolve_group(group, "symmetric_memory.empty")
    if pg is None:
        return None
    if not supported(dt):
        raise TypeError(f"dtype must be one MPI can move (a numeric NumPy dtype), got {dt}")
    from .backends.shm import symmetric  # MPI is started by now (no MPI work at import)
    from .backends.shm.node import one_node

    if not one_node(pg):
        raise ValueError(
            f"symmetric memory needs every rank of the group on one node; group {pg.group_name!r} spans nodes "
            "(make a group of this node's ranks: hpcdist.new_subgroups() where ranks are placed node by node, "
            "else hpcdist.new_subgroups_by_enumeration() with each node's ranks)"
        )
    return symmetric.allocate(pg, shape, dt)


def is_symmetric(arr: Any, group: Any = None) -> bool:
    """Whether ``arr`` (any array hpcdist takes) lies wholly in this rank's part of a symmetric allocation of
    ``group`` (default: the default group), so the collectives read it where it lies. Local: no message."""
    pg = resolve_group(group, "symmetric_memory.is_symmetric")
    if pg is None:
        return False
    buf = adapt(arr, "arr", False)  # the array as the engines see it (a copy, for one that must be staged)
    if buf.device != "cpu":
        return False
    from .backends.shm import symmetric

    found = symmetric.find(buf.arr)
    return found is not None and found[0].group() is pg
