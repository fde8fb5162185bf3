"""``DeviceMesh`` and ``init_device_mesh``: ranks laid out in an n-d grid with a group per dimension.

SPMD contract: every rank of the world calls :func:`init_device_mesh` (or
builds a :class:`DeviceMesh`) with the same shape and names; it creates one
group per slice of every dimension (one ``MPI_Comm_split`` per dimension),
collectively, in the same order on every rank.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ._world import WORLD, not_initialized
from .group import ProcessGroup, _check_timeout, _split_many, default_pg

__all__ = ["DeviceMesh", "init_device_mesh"]


class DeviceMesh:
    """An n-d grid of global ranks, with one process group along each dimension.

    ``mesh`` is an array of global ranks; ``mesh[i, j]`` is the rank at that
    coordinate. ``get_group(dim)`` is the group of the ranks that share this
    rank's coordinates on every other dimension.
    """

    def __init__(
        self, device_type: str, mesh: Any, *, mesh_dim_names: tuple[str, ...] | None = None, _init_backend: bool = True
    ) -> None:
        if not isinstance(device_type, str) or device_type.split(":")[0] not in ("cpu", "cuda"):
            raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")
        world = default_pg()
        arr = np.asarray(mesh.tolist() if hasattr(mesh, "tolist") else mesh, dtype=np.int64)
        if arr.ndim == 0:
            raise ValueError("mesh must have at least one dimension")
        flat = sorted(arr.reshape(-1).tolist())
        if flat != list(range(world.size())):
            raise ValueError(
                f"mesh must hold every global rank 0..{world.size() - 1} exactly once, got {arr.reshape(-1).tolist()}"
            )
        if mesh_dim_names is not None and (len(mesh_dim_names) != arr.ndim or len(set(mesh_dim_names)) != arr.ndim):
            raise ValueError(
                f"mesh_dim_names must be {arr.ndim} distinct names (one per dimension), got {mesh_dim_names!r}"
            )
        self.device_type = device_type
        self.mesh = arr
        self.mesh_dim_names = tuple(mesh_dim_names) if mesh_dim_names is not None else None
        me = world.rank()
        where = np.argwhere(arr == me)
        self._coord = [int(c) for c in where[0]]
        self._groups: list[ProcessGroup] = []
        if _init_backend:
            tmo = _check_timeout(None)
            for dim in range(arr.ndim):
                moved = np.moveaxis(arr, dim, -1).reshape(-1, arr.shape[dim])
                lists = [row.tolist() for row in moved]
                mine, _ = _split_many(world, lists, tmo, None, f"mesh_dim_{dim}", "init_device_mesh")
                self._groups.append(mine)

    # shape queries
    @property
    def ndim(self) -> int:
        return int(self.mesh.ndim)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.mesh.shape)

    def size(self, mesh_dim: int | str | None = None) -> int:
        if mesh_dim is None:
            return int(self.mesh.size)
        return int(self.mesh.shape[self._dim(mesh_dim)])

    def _dim(self, mesh_dim: int | str | None) -> int:
        if mesh_dim is None:
            if self.ndim != 1:
                raise ValueError(f"this mesh has {self.ndim} dimensions: name one (mesh_dim=0..{self.ndim - 1})")
            return 0
        if isinstance(mesh_dim, str):
            if not self.mesh_dim_names or mesh_dim not in self.mesh_dim_names:
                raise KeyError(f"mesh dimension {mesh_dim!r} not in mesh_dim_names {self.mesh_dim_names}")
            return self.mesh_dim_names.index(mesh_dim)
        if not isinstance(mesh_dim, int) or not -self.ndim <= mesh_dim < self.ndim:
            raise ValueError(f"mesh_dim must be in 0..{self.ndim - 1} or a dimension name, got {mesh_dim!r}")
        return mesh_dim % self.ndim

    # groups and coordinates
    def get_group(self, mesh_dim: int | str | None = None) -> ProcessGroup:
        """The group along ``mesh_dim`` that contains this rank."""
        return self._groups[self._dim(mesh_dim)]

    def get_all_groups(self) -> list[ProcessGroup]:
        return list(self._groups)

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        """This rank's coordinate along ``mesh_dim`` (its rank in that dimension's group)."""
        return self._coord[self._dim(mesh_dim)]

    def get_coordinate(self) -> list[int]:
        return list(self._coord)

    def get_rank(self) -> int:
        pg = WORLD.default_pg
        if pg is None:
            raise not_initialized()
        return pg.rank()

    def __getitem__(self, name: str | tuple[str, ...]) -> DeviceMesh:
        """The 1-d sub-mesh along the named dimension that contains this rank (``mesh["dp"]``)."""
        if isinstance(name, tuple):
            if len(name) != 1:
                raise NotImplementedError("slicing several dimensions at once is not supported; slice one name")
            name = name[0]
        dim = self._dim(name)
        index = list(self._coord)
        index[dim] = slice(None)  # type: ignore[call-overload]
        sub = DeviceMesh.__new__(DeviceMesh)
        sub.device_type = self.device_type
        sub.mesh = self.mesh[tuple(index)]
        sub.mesh_dim_names = (name,)
        sub._coord = [self._coord[dim]]
        sub._groups = [self._groups[dim]]
        return sub

    def __repr__(self) -> str:
        names = f", mesh_dim_names={self.mesh_dim_names}" if self.mesh_dim_names else ""
        return f"DeviceMesh('{self.device_type}', {self.mesh.tolist()}{names})"


def init_device_mesh(
    device_type: str,
    mesh_shape: tuple[int, ...],
    *,
    mesh_dim_names: tuple[str, ...] | None = None,
    backend_override: Any = None,
) -> DeviceMesh:
    """A :class:`DeviceMesh` of ``mesh_shape`` over the world's ranks in row-major order.

    Collective over the world. ``prod(mesh_shape)`` must equal the world size.
    """
    world = default_pg()
    if (
        not isinstance(mesh_shape, (tuple, list))
        or not mesh_shape
        or any(isinstance(s, bool) or not isinstance(s, int) or s < 1 for s in mesh_shape)
    ):
        raise ValueError(f"mesh_shape must be a non-empty tuple of positive ints, got {mesh_shape!r}")
    if int(np.prod(mesh_shape)) != world.size():
        raise ValueError(
            f"mesh_shape {tuple(mesh_shape)} holds {int(np.prod(mesh_shape))} ranks but the world has {world.size()}"
        )
    mesh = np.arange(world.size(), dtype=np.int64).reshape(tuple(mesh_shape))
    return DeviceMesh(device_type, mesh, mesh_dim_names=mesh_dim_names)
