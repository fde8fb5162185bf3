"""``Shard``: which slice of a global array this rank holds.

A ``Shard`` is the global shape plus this rank's box in it: an offset and a
size per dimension. It says nothing about how the slicing came about, so a
checkpoint written with one slicing loads with any other (resharding is box
intersection, :mod:`.reshard`). Constructors: from an hpcdist
:class:`~hpcdist.DeviceMesh` and per-dimension placements
(:meth:`Shard.from_mesh`), from a torch ``DTensor`` (:meth:`Shard.from_dtensor`),
or from an even split along one dimension (:meth:`Shard.even`).

:class:`Sharded` pairs a local array with its ``Shard``: put it in the state
dict where an array is sharded. Plain arrays in the state are replicated
(every rank of the group holds the same whole array).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["Shard", "Sharded"]


def _ints(name: str, value: Any) -> tuple[int, ...]:
    try:
        items = tuple(value)
        out = tuple(int(v) for v in items)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a sequence of ints, got {value!r}") from None
    if any(isinstance(v, bool) or o != v for v, o in zip(items, out)):
        raise TypeError(
            f"{name} must be a sequence of ints, got {items!r} (bools and non-integral numbers are refused, not truncated)"
        )
    if any(v < 0 for v in out):
        raise ValueError(f"{name} must be non-negative ints, got {items!r}")
    return out


@dataclass(frozen=True)
class Shard:
    """The box ``[offsets, offsets + sizes)`` of an array of ``global_shape`` held by this rank.

    Args:
        global_shape: the shape of the whole (logical) array.
        offsets: where this rank's piece starts, one int per dimension.
        sizes: the shape of this rank's piece (the local array's shape).

    Raises ``ValueError`` when the box does not fit in the global shape.
    """

    global_shape: tuple[int, ...]
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]

    def __post_init__(self) -> None:
        g = _ints("global_shape", self.global_shape)
        o = _ints("offsets", self.offsets)
        s = _ints("sizes", self.sizes)
        if not len(g) == len(o) == len(s):
            raise ValueError(f"global_shape {g}, offsets {o} and sizes {s} must have one entry per dimension each")
        for d, (gd, od, sd) in enumerate(zip(g, o, s)):
            if od + sd > gd:
                raise ValueError(f"shard box [{od}, {od + sd}) does not fit in dimension {d} of global shape {g}")
        object.__setattr__(self, "global_shape", g)
        object.__setattr__(self, "offsets", o)
        object.__setattr__(self, "sizes", s)

    @classmethod
    def whole(cls, shape: Sequence[int]) -> Shard:
        """The box of a whole (replicated) array."""
        shape = tuple(shape)
        return cls(shape, (0,) * len(shape), shape)

    @classmethod
    def even(cls, global_shape: Sequence[int], dim: int, index: int, parts: int) -> Shard:
        """Piece ``index`` of ``parts`` along ``dim``, split as ``torch.chunk`` does.

        Pieces hold ``ceil(n / parts)`` elements each; the last ones may be
        smaller or empty (DTensor's ``Shard(dim)`` splits the same way).

        Args:
            global_shape: the shape of the whole array.
            dim: the dimension that is split (negative counts from the end, as ``torch.chunk``).
            index: which piece, 0..parts-1 (usually this rank's index along the split).
            parts: into how many pieces ``dim`` is split (at least 1).

        Returns:
            The :class:`Shard` of that piece.
        """
        g = tuple(int(x) for x in global_shape)
        if not g:
            raise ValueError(f"Shard.even: global shape {g} has no dimension to split; use Shard.whole(())")
        if not -len(g) <= dim < len(g):
            raise ValueError(f"dim must be in {-len(g)}..{len(g) - 1} for global shape {g}, got {dim}")
        dim %= len(g)
        if parts < 1:
            raise ValueError(f"parts must be a positive int (how many pieces dim {dim} is split into), got {parts}")
        if not 0 <= index < parts:
            raise ValueError(f"index must be in 0..{parts - 1}, got {index}")
        off, size = _chunk(0, g[dim], index, parts)
        offsets = [0] * len(g)
        sizes = list(g)
        offsets[dim], sizes[dim] = off, size
        return cls(g, tuple(offsets), tuple(sizes))

    @classmethod
    def from_mesh(cls, global_shape: Sequence[int], mesh: Any, placements: Sequence[Any]) -> Shard:
        """This rank's box of an array laid out over an hpcdist :class:`~hpcdist.DeviceMesh`.

        Args:
            global_shape: the shape of the whole array.
            mesh: the mesh (this rank's coordinate comes from ``mesh.get_coordinate()``).
            placements: one entry per mesh dimension: ``"replicate"`` or
                ``("shard", tensor_dim)``; torch's ``Replicate()`` / ``Shard(d)``
                placement objects are accepted too. Several mesh dimensions may
                shard the same tensor dimension (nested, in mesh order, as DTensor).

        Returns:
            The box this rank holds. Ranks that differ only along replicated
            mesh dimensions hold the same box; a checkpoint writes it once.
            A rank outside the mesh holds an empty box (as DTensor's local
            shard there is empty).
        """
        g = tuple(int(x) for x in global_shape)
        shape = list(mesh.shape)
        if len(placements) != len(shape):
            raise ValueError(
                f"placements must have one entry per mesh dimension ({len(shape)}), got {len(placements)}: {placements!r}"
            )
        where = mesh.get_coordinate()
        if where is None:  # not part of the mesh
            return cls(g, (0,) * len(g), (0,) * len(g))
        coord = list(where)
        offsets = [0] * len(g)
        sizes = list(g)
        for mdim, p in enumerate(placements):
            d = _shard_dim(p, len(g))
            if d is None:
                continue
            offsets[d], sizes[d] = _chunk(offsets[d], sizes[d], coord[mdim], shape[mdim])
        return cls(g, tuple(offsets), tuple(sizes))

    @classmethod
    def from_dtensor(cls, dtensor: Any) -> Shard:
        """This rank's box of a torch ``DTensor`` (its global shape, local shape and global offset)."""
        from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

        local_shape, offsets = compute_local_shape_and_global_offset(
            dtensor.shape, dtensor.device_mesh, dtensor.placements
        )
        return cls(tuple(dtensor.shape), tuple(offsets), tuple(local_shape))

    @property
    def ndim(self) -> int:
        return len(self.global_shape)

    @property
    def is_whole(self) -> bool:
        """True when the box covers the whole array."""
        return self.sizes == self.global_shape

    def slices(self) -> tuple[slice, ...]:
        """The box as slices into the global array."""
        return tuple(slice(o, o + s) for o, s in zip(self.offsets, self.sizes))


def _chunk(start: int, n: int, index: int, parts: int) -> tuple[int, int]:
    """(offset, size) of chunk ``index`` of ``parts`` of ``[start, start + n)``, as torch.chunk."""
    step = -(-n // parts) if n else 0
    lo = min(index * step, n)
    hi = min(lo + step, n)
    return start + lo, hi - lo


def _shard_dim(placement: Any, ndim: int) -> int | None:
    """The tensor dimension a placement shards, or None for a replicated one."""
    if isinstance(placement, str):
        if placement == "replicate":
            return None
        raise ValueError(f"placement must be 'replicate' or ('shard', dim), got {placement!r}")
    if isinstance(placement, tuple) and len(placement) == 2 and placement[0] == "shard":
        d = placement[1]
    elif hasattr(placement, "is_shard"):  # torch.distributed.tensor placements
        if placement.is_replicate():
            return None
        if not placement.is_shard():
            raise ValueError(f"only Shard and Replicate placements can be saved, got {placement!r}")
        d = placement.dim
    else:
        raise ValueError(f"placement must be 'replicate' or ('shard', dim), got {placement!r}")
    if not isinstance(d, int) or not -ndim <= d < ndim:
        raise ValueError(f"shard dimension must be in 0..{ndim - 1}, got {d!r}")
    return d % ndim


@dataclass(frozen=True)
class Sharded:
    """A local array and the :class:`Shard` it is of; put it in a state dict for a sharded array.

    Args:
        local: this rank's piece (NumPy array, torch tensor, CuPy array), of
            shape ``shard.sizes``. On load it is filled in place.
        shard: the box ``local`` covers in the global array.
    """

    local: Any
    shard: Shard

    def __post_init__(self) -> None:
        if not isinstance(self.shard, Shard):
            raise TypeError(f"shard must be a hpcdist.checkpoint.Shard, got {type(self.shard).__name__}")
        shape = tuple(int(x) for x in getattr(self.local, "shape", ()))
        if shape != self.shard.sizes:
            raise ValueError(f"local array has shape {shape} but its shard's sizes are {self.shard.sizes}")
