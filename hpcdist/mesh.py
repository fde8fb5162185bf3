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
from .backends import parse_backend
from .group import ProcessGroup, _check_timeout, _split_many, default_pg

__all__ = ["DeviceMesh", "init_device_mesh"]


class DeviceMesh:
    """An n-d grid of global ranks, with one process group along each dimension.

    ``mesh`` is an array of global ranks; ``mesh[i, j]`` is the rank at that
    coordinate. ``get_group(dim)`` is the group of the ranks that share this
    rank's coordinates on every other dimension. Constructing one is
    collective over the world (one ``MPI_Comm_split`` per dimension).

    Args:
        device_type: ``"cpu"`` or ``"cuda"`` (``"cuda:N"`` too), the arrays the mesh's groups move.
        mesh: an n-d array (or nested lists) holding every global rank exactly once.
        mesh_dim_names: one name per dimension, for ``get_group("dp")`` and ``mesh["dp"]``.
        backend_override: ``{dimension index or name: backend}``, a backend for some dimensions'
            groups (default: the default group's); a ``(backend, options)`` pair is accepted as torch's
            and its options are ignored.
    """

    def __init__(
        self,
        device_type: str,
        mesh: Any,
        *,
        mesh_dim_names: tuple[str, ...] | None = None,
        backend_override: Any = None,
        _init_backend: bool = True,
    ) -> None:
        _check_device_type(device_type)
        world = default_pg()
        arr = np.asarray(mesh.tolist() if hasattr(mesh, "tolist") else mesh, dtype=np.int64)
        if arr.ndim == 0:
            raise ValueError("mesh must have at least one dimension")
        flat = sorted(arr.reshape(-1).tolist())
        if flat != list(range(world.size())):
            raise ValueError(
                f"mesh must hold every global rank 0..{world.size() - 1} exactly once, got {arr.reshape(-1).tolist()}"
            )
        self._fill(device_type, arr, mesh_dim_names, [], [int(c) for c in np.argwhere(arr == world.rank())[0]])
        if _init_backend:
            backends = _backends(backend_override, arr.ndim, self._dim)
            tmo = _check_timeout(None)
            for dim in range(arr.ndim):
                moved = np.moveaxis(arr, dim, -1).reshape(-1, arr.shape[dim])
                lists = [row.tolist() for row in moved]
                mine, _ = _split_many(world, lists, tmo, backends[dim], f"mesh_dim_{dim}", "init_device_mesh")
                self._groups.append(mine)

    def _fill(
        self,
        device_type: str,
        arr: np.ndarray,
        names: tuple[str, ...] | None,
        groups: list[ProcessGroup],
        coord: list[int],
    ) -> None:
        if names is not None and (
            not isinstance(names, (tuple, list))
            or len(names) != arr.ndim
            or len(set(names)) != arr.ndim
            or not all(isinstance(x, str) for x in names)
        ):
            raise ValueError(f"mesh_dim_names must be {arr.ndim} distinct names (one per dimension), got {names!r}")
        self.device_type = device_type
        self.mesh = arr
        self.mesh_dim_names = tuple(names) if names is not None else None
        self._groups = groups
        self._coord = coord

    @staticmethod
    def from_group(
        group: ProcessGroup | list[ProcessGroup],
        device_type: str,
        mesh: Any = None,
        *,
        mesh_dim_names: tuple[str, ...] | None = None,
    ) -> DeviceMesh:
        """A mesh over existing groups (no collective call).

        One group: a 1-d mesh of its ranks in group-rank order (``mesh``, when
        given, must list exactly those). A list of groups: ``mesh`` (n-d, of
        global ranks) is required and ``group[d]`` is this rank's group along
        dimension ``d``; each must hold the ranks of this rank's row of
        ``mesh`` along ``d``.

        Args:
            group: one :class:`~hpcdist.group.ProcessGroup`, or one per dimension.
            device_type: ``"cpu"`` or ``"cuda"`` (``"cuda:N"`` too), the arrays the mesh's groups move.
            mesh: the grid of global ranks (required with several groups).
            mesh_dim_names: one name per dimension, for ``get_group("dp")`` and ``mesh["dp"]``.

        Returns:
            The :class:`DeviceMesh`.
        """
        _check_device_type(device_type)
        groups = list(group) if isinstance(group, (list, tuple)) else [group]
        if not groups or not all(isinstance(g, ProcessGroup) for g in groups):
            raise TypeError(f"group must be a ProcessGroup or a non-empty list of them, got {group!r}")
        if mesh is None:
            if len(groups) != 1:
                raise ValueError(f"mesh is required with {len(groups)} groups (one per mesh dimension)")
            arr = np.asarray(groups[0]._ranks, dtype=np.int64)
        else:
            arr = np.asarray(mesh.tolist() if hasattr(mesh, "tolist") else mesh, dtype=np.int64)
        if arr.ndim != len(groups):
            raise ValueError(
                f"mesh has {arr.ndim} dimension(s) but {len(groups)} group(s) were given: one per dimension"
            )
        me = default_pg().rank()
        where = np.argwhere(arr == me)
        if len(where) != 1:
            raise ValueError(f"mesh must hold this rank ({me}) exactly once, got {arr.tolist()}")
        coord = [int(c) for c in where[0]]
        for d, g in enumerate(groups):
            index: list[Any] = list(coord)
            index[d] = slice(None)
            row = arr[tuple(index)].tolist()
            if list(g._ranks) != row:
                raise ValueError(
                    f"group {d} ({g.group_name!r}) holds ranks {list(g._ranks)}, but this rank's row of mesh along "
                    f"dimension {d} is {row}"
                )
        out = DeviceMesh.__new__(DeviceMesh)
        out._fill(device_type, arr, mesh_dim_names, groups, coord)
        return out

    # shape queries
    @property
    def ndim(self) -> int:
        return int(self.mesh.ndim)

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self.mesh.shape)

    def size(self, mesh_dim: int | str | None = None) -> int:
        """The number of ranks of the mesh, or along ``mesh_dim``.

        Args:
            mesh_dim: a dimension index or name (None: the whole mesh).
        """
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
        """The group along ``mesh_dim`` that contains this rank.

        Args:
            mesh_dim: a dimension index or name (None: the only dimension of a 1-d mesh).
        """
        return self._groups[self._dim(mesh_dim)]

    def get_all_groups(self) -> list[ProcessGroup]:
        """This rank's group along each dimension, in dimension order."""
        return list(self._groups)

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        """This rank's coordinate along ``mesh_dim`` (its rank in that dimension's group).

        Args:
            mesh_dim: a dimension index or name (None: the only dimension of a 1-d mesh).
        """
        return self._coord[self._dim(mesh_dim)]

    def get_coordinate(self) -> list[int]:
        """This rank's coordinate along every dimension."""
        return list(self._coord)

    def get_rank(self) -> int:
        """This process's global rank."""
        pg = WORLD.default_pg
        if pg is None:
            raise not_initialized()
        return pg.rank()

    def __getitem__(self, names: str | tuple[str, ...]) -> DeviceMesh:
        """The sub-mesh along the named dimensions that contains this rank (``mesh["dp"]``, ``mesh["dp", "tp"]``).

        Names must follow the mesh's own order. The sub-mesh reuses this
        mesh's groups: no collective call.
        """
        wanted = names if isinstance(names, tuple) else (names,)
        if not wanted or not all(isinstance(x, str) for x in wanted):
            raise KeyError(f"slice a mesh by dimension names, got {names!r}")
        dims = [self._dim(x) for x in wanted]
        if len(set(dims)) != len(dims) or dims != sorted(dims):
            raise KeyError(
                f"mesh dimension names {wanted} must be distinct and in the mesh's order {self.mesh_dim_names}"
            )
        index: list[Any] = list(self._coord)
        for d in dims:
            index[d] = slice(None)
        sub = DeviceMesh.__new__(DeviceMesh)
        sub._fill(
            self.device_type,
            self.mesh[tuple(index)],
            tuple(wanted),
            [self._groups[d] for d in dims],
            [self._coord[d] for d in dims],
        )
        return sub

    def _key(self) -> tuple[Any, ...]:
        return (self.device_type, self.mesh.shape, tuple(self.mesh.reshape(-1).tolist()), self.mesh_dim_names)

    def __eq__(self, other: object) -> bool:
        """torch's equality: the same device type, rank grid and dimension names (the groups are not compared)."""
        if self is other:
            return True
        return isinstance(other, DeviceMesh) and self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __repr__(self) -> str:
        names = f", mesh_dim_names={self.mesh_dim_names}" if self.mesh_dim_names else ""
        return f"DeviceMesh('{self.device_type}', {self.mesh.tolist()}{names})"


def _check_device_type(device_type: Any) -> None:
    if not isinstance(device_type, str) or device_type.split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")


def _backends(override: Any, ndim: int, dim_of: Any) -> list[Any]:
    """``backend_override`` ({dimension index or name: backend}) as one backend (or None) per dimension."""
    out: list[Any] = [None] * ndim
    if override is None:
        return out
    if not isinstance(override, dict):
        raise TypeError(f"backend_override must be a dict {{dimension index or name: backend}}, got {override!r}")
    for key, value in override.items():
        backend = value[0] if isinstance(value, tuple) else value  # (backend, options): options are not used
        parse_backend(backend)  # a bad name fails here, before any group is split
        d = dim_of(key)
        if out[d] is not None:
            raise ValueError(f"backend_override names dimension {d} twice")
        out[d] = backend
    return out


def init_device_mesh(
    device_type: str,
    mesh_shape: tuple[int, ...],
    *,
    mesh_dim_names: tuple[str, ...] | None = None,
    backend_override: Any = None,
) -> DeviceMesh:
    """A :class:`DeviceMesh` of ``mesh_shape`` over the world's ranks in row-major order.

    Collective over the world: every rank calls it with the same arguments.
    ``prod(mesh_shape)`` must equal the world size.

    Args:
        device_type: ``"cpu"`` or ``"cuda"`` (``"cuda:N"`` too), the arrays the mesh's groups move.
        mesh_shape: the size of each dimension, positive ints.
        mesh_dim_names: one name per dimension, for ``get_group("dp")`` and ``mesh["dp"]``.
        backend_override: ``{dimension index or name: backend}``, a backend for some dimensions'
            groups (default: the default group's); a ``(backend, options)`` pair is accepted as torch's
            and its options are ignored.

    Returns:
        The :class:`DeviceMesh`.
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
    return DeviceMesh(device_type, mesh, mesh_dim_names=mesh_dim_names, backend_override=backend_override)
