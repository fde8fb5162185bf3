"""Bucketing: all-reduce many small arrays as a few large ones.

One collective call costs microseconds of fixed overhead (Python, MPI
latency); a gradient list of a thousand small arrays pays it a thousand
times. :func:`all_reduce_bucketed` packs the arrays, in order, into buckets
of at most ``bucket_cap_mb`` MiB per dtype and device (torch DDP's default
cap: 25 MiB), all-reduces each bucket with one call
(:func:`~hpcdist.all_reduce_coalesced`), and copies the results back.
:func:`bucket_indices` is the packing plan alone, for code that schedules its
own buckets (e.g. as gradients become ready).
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np

from .buffers.adapters import adapt, adapt_list
from .collectives import SUM, all_reduce, coalesced_desc, combine, reduce_list, refuse_overlap
from .debug import DETAIL, check_collective
from .flight import END
from .group import resolve_group
from .ops import resolve_op
from .work import Work

__all__ = ["DEFAULT_BUCKET_CAP_MB", "all_reduce_bucketed", "bucket_indices", "bucket_views"]

DEFAULT_BUCKET_CAP_MB = 25.0


def bucket_indices(nbytes: Sequence[int], keys: Sequence[Any], cap_bytes: int) -> list[list[int]]:
    """Plan buckets: indices of arrays, in order, grouped by ``keys[i]`` (dtype, device), each at most ``cap_bytes``.

    An array larger than the cap gets a bucket of its own. Deterministic
    (the same plan on every rank for the same sizes and keys).

    Args:
        nbytes: size in bytes of each array.
        keys: what must match inside one bucket, per array (e.g. ``(dtype, device)``).
        cap_bytes: the most bytes one bucket holds (a finite number > 0; below the smallest array: one
            bucket per array).

    Returns:
        A list of buckets, each a list of indices into ``nbytes``.
    """
    if len(nbytes) != len(keys):
        raise ValueError(f"nbytes and keys must have the same length, got {len(nbytes)} and {len(keys)}")
    _check_cap(cap_bytes, "cap_bytes", "bytes")
    if len(set(keys)) == 1:  # one kind (the common case): the same greedy fill, by cumulative sums
        return _one_kind(nbytes, cap_bytes)
    open_: dict[Any, list[int]] = {}
    fill: dict[Any, int] = {}
    out: list[list[int]] = []
    for i, (nb, key) in enumerate(zip(nbytes, keys)):
        cur = open_.get(key)
        if cur is not None and fill[key] + nb > cap_bytes:
            out.append(cur)
            cur = None
        if cur is None:
            cur = open_[key] = []
            fill[key] = 0
        cur.append(i)
        fill[key] += nb
    out.extend(open_.values())
    return sorted(out, key=lambda b: b[0])


def bucket_views(
    shapes: Sequence[Any], dtype: Any = np.float32, *, symmetric: bool = False, group: Any = None
) -> tuple[np.ndarray, list[np.ndarray]]:
    """One flat NumPy buffer and a view of it per shape, in order: arrays that one collective on the buffer
    reduces at once, with nothing to pack or unpack (torch DDP's ``gradient_as_bucket_view``).

    Write into the views in place (``g[...] = ...``; rebinding a name to a new array leaves the buffer)
    and all-reduce the buffer: ``hpcdist.all_reduce(flat)`` reduces every view. Where arrays cannot live
    in one buffer, :func:`all_reduce_bucketed` packs them.

    With ``symmetric=True`` the buffer is symmetric memory of ``group``
    (:func:`hpcdist.symmetric_memory.empty`: collective, every rank of the
    group on this node, the same shapes and dtype), which the node's
    collectives read where it lies, without copying it through the segment.

    Args:
        shapes: the shape of each view (an int is a 1-D length).
        dtype: their dtype (default float32).
        symmetric: allocate the buffer as symmetric memory of ``group`` (default False: private memory).
        group: the process group of a symmetric buffer (default: the default group).

    Returns:
        ``(flat, views)``: the zero-filled C-contiguous buffer and the views, ``views[i].shape == shapes[i]``.
    """
    try:
        if isinstance(shapes, (str, bytes)):
            raise TypeError
        listed = list(shapes)
    except TypeError:
        raise TypeError(f"shapes must be a list of shapes (ints or tuples of ints), got {shapes!r}") from None
    dims = [_shape(s, i) for i, s in enumerate(listed)]
    if any(d < 0 for dim in dims for d in dim):
        raise ValueError(f"shapes must have no negative dimension, got {shapes!r}")
    sizes = [math.prod(d) for d in dims]
    from .symmetric_memory import empty

    if not symmetric:  # (symmetric memory checks its dtype itself, on every rank)
        try:
            dtype = np.dtype(dtype)
        except TypeError as e:
            raise TypeError(f"dtype must be a NumPy dtype (numpy.float32, 'float64', ...), got {dtype!r}") from e
    flat = empty(sum(sizes), dtype=dtype, group=group) if symmetric else np.zeros(sum(sizes), dtype=dtype)
    if flat is None:  # symmetric, and this rank is not in group
        raise ValueError("bucket_views(symmetric=True): this rank is not a member of group")
    views, at = [], 0
    for d, n in zip(dims, sizes):
        views.append(flat[at : at + n].reshape(d))
        at += n
    return flat, views


def _shape(shape: Any, i: int) -> tuple[int, ...]:
    """``shapes[i]`` of :func:`bucket_views` as a tuple of ints (an integer: a 1-D length), else TypeError."""
    if isinstance(shape, numbers.Integral) and not isinstance(shape, bool):
        return (int(shape),)
    try:
        if isinstance(shape, (str, bytes)):
            raise TypeError
        return tuple(operator.index(d) for d in shape)
    except TypeError:
        raise TypeError(f"shapes[{i}] must be an int or a tuple of ints, got {shape!r}") from None


def _check_cap(cap: Any, argname: str, unit: str) -> int | float:
    """``cap`` (argument ``argname``, a bucket cap in ``unit``) as a Python int or float if it is a finite real
    number > 0, else ValueError. Integers stay exact ints (a NumPy integer would wrap around when scaled, a
    huge Python one overflow a float)."""
    integral = isinstance(cap, numbers.Integral)  # (bool too, refused)
    if integral and not isinstance(cap, bool) and int(cap) > 0:
        return int(cap)
    if not integral and isinstance(cap, numbers.Real) and math.isfinite(cap) and float(cap) > 0:
        return float(cap)
    raise ValueError(f"{argname} must be a finite number of {unit} > 0, got {cap!r}")


def _one_kind(nbytes: Sequence[int], cap_bytes: int) -> list[list[int]]:
    """:func:`bucket_indices` when every array has the same key: consecutive runs of at most ``cap_bytes``."""
    cum = np.cumsum(np.asarray(nbytes, dtype=np.int64))
    out: list[list[int]] = []
    start, base = 0, 0
    while start < len(cum):
        end = max(int(np.searchsorted(cum, base + cap_bytes, side="right")), start + 1)  # an oversized one alone
        out.append(list(range(start, end)))
        base, start = int(cum[end - 1]), end
    return out


def all_reduce_bucketed(
    tensors: list[Any],
    op: Any = SUM,
    group: Any = None,
    async_op: bool = False,
    bucket_cap_mb: float = DEFAULT_BUCKET_CAP_MB,
) -> Work | None:
    """All-reduce every array of ``tensors`` in place, packed into buckets (one collective per bucket).

    SPMD: every rank of ``group`` calls it with the same number of arrays,
    of the same dtypes and sizes, in the same order, and the same
    ``bucket_cap_mb``. The plan must agree: buckets of different sizes
    mismatch (an error, or a timeout), and lists split otherwise into
    buckets of the same sizes are reduced across the arrays' boundaries
    without an error (DETAIL mode catches it: ``docs/sharp-bits.md``).
    Arrays may mix dtypes and devices; each bucket holds one kind.

    Args:
        tensors: the arrays (NumPy, torch, CuPy, ...), reduced in place.
        op: the reduction (a ReduceOp), as in :func:`~hpcdist.all_reduce`.
        group: the process group (default: the default group).
        async_op: return a Work that completes when every bucket did; its ``result()`` is the list of
            ``tensors``, in order (as ``all_reduce_coalesced``'s).
        bucket_cap_mb: the most MiB one bucket holds (default 25, as torch DDP): a finite number > 0; a cap
            below an array's size gives that array a bucket of its own.

    Returns:
        None, or a Work when ``async_op`` (None on ranks outside ``group``).

    Raises:
        ValueError, TypeError: a bad argument (``bucket_cap_mb``, an array of ``tensors`` or a dtype it
            holds, ``op`` for one of those dtypes), on every rank that passes it, before any bucket moves.
    """
    pg = resolve_group(group, "all_reduce_bucketed")
    if pg is None:
        return None
    mib = _check_cap(bucket_cap_mb, "bucket_cap_mb", "MiB")
    # at least a byte; a float cap beyond 2**62 MiB is unbounded anyway (scaled as it is, it overflowed to inf)
    cap = mib << 20 if isinstance(mib, int) else max(1, int(min(mib, 2.0**62) * (1 << 20)))
    if not isinstance(tensors, (list, tuple)):
        raise TypeError(f"tensors must be a list of arrays, got {type(tensors).__name__}")
    if not tensors:  # nothing to reduce; async_op still gets the Work it asked for (complete, result [])
        return combine([], "all_reduce_bucketed", pg, []) if async_op else None
    if not async_op and all(type(t) is np.ndarray and t.flags.carray for t in tensors):
        _numpy_buckets(tensors, op, pg, cap)
        return None
    bufs = adapt_list(tensors, "tensors", True)  # every array checked, then the op for each dtype and engine
    for dtype, device in dict.fromkeys((b.dtype, b.device) for b in bufs):
        pg.engine(device).check_reduction(dtype, resolve_op(op, dtype, "op"))  # a group without the device raises
    if DETAIL[0]:
        refuse_overlap([b.arr for b in bufs if b.device == "cpu"])
    plan = bucket_indices([b.arr.nbytes for b in bufs], [(b.dtype, b.device, b.index) for b in bufs], cap)
    works = [reduce_list([tensors[i] for i in idx], op, pg, async_op, "all_reduce_bucketed") for idx in plan]
    if not async_op:
        return None
    return combine([w for w in works if w is not None], "all_reduce_bucketed", pg, list(tensors))


def _numpy_buckets(arrays: list[np.ndarray], op: Any, pg: Any, cap: int) -> None:
    """The blocking path for writable C-contiguous NumPy arrays: plan, then one collective per bucket through
    the engine's :meth:`~hpcdist.backends.Engine.host_all_reduce_many` (no per-array adapter objects; the
    shared-memory engine packs the arrays straight into its segment and copies the results straight back)."""
    if DETAIL[0]:  # an array listed twice would be reduced twice (buckets run one after another)
        refuse_overlap(arrays)
    dtypes = [a.dtype for a in arrays]
    kinds: dict[Any, tuple[str, Any]] = {}  # NumPy dtype -> (its name for the engines, the op resolved for it)
    for dt in dict.fromkeys(dtypes):  # every argument checked before the first bucket moves: once per dtype
        i = dtypes.index(dt)  # the first array of that dtype (a dtype hpcdist cannot communicate: TypeError)
        name = adapt(arrays[i], f"tensors[{i}]", True).dtype
        kinds[dt] = (name, resolve_op(op, name, "op"))
    sizes = [a.nbytes for a in arrays]
    plan = bucket_indices(sizes, dtypes, cap)
    eng = pg.engine("cpu")
    fr = pg._flight
    for idx in plan:
        if len(idx) == 1 and not DETAIL[0]:  # DETAIL: described as a bucket, as on the general path
            all_reduce(arrays[idx[0]], op, pg)
            continue
        dtype, rop = kinds[arrays[idx[0]].dtype]  # (one dtype per bucket)
        flats = [a if a.ndim == 1 else a.reshape(-1) for a in (arrays[i] for i in idx)]
        nbytes = sum(sizes[i] for i in idx)
        count = nbytes // arrays[idx[0]].itemsize
        entry = None if fr is None else fr.coll("all_reduce_bucketed", dtype, count, -1)
        if DETAIL[0]:
            check_collective(
                pg, coalesced_desc("all_reduce_bucketed", dtype, rop, [arrays[i].shape for i in idx], count)
            )
        eng.host_all_reduce_many(flats, dtype, rop, nbytes)
        if entry is not None:
            entry[END] = True
