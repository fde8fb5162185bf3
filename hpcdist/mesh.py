"""``DeviceMesh`` and ``init_device_mesh``: ranks laid out in an n-d grid with a group per dimension.

SPMD contract: every rank of the world calls :func:`init_device_mesh` (or
builds a :class:`DeviceMesh`) with the same shape and names; it creates one
group per slice of every dimension (one ``MPI_Comm_split`` per dimension),
collectively, in the same order on every rank. A mesh may hold part of the
world (as torch's): the ranks outside it take part in the splits, get no
coordinate (``get_coordinate()`` is None) and ``GroupMember.NON_GROUP_MEMBER``
as their groups, so collectives on them do nothing there, as on any group a
rank is not in. Every split first compares a
checksum of the whole mesh across the ranks, so ranks given different meshes
(another shape, another number of dimensions) all raise the same ValueError
before any group is made.

A mesh made by slicing (``mesh["dp"]``) or flattening (``mesh["dp", "tp"]._flatten()``)
remembers its root mesh and which of the root's dimensions each of its own
dimensions spans, as torch's layouts do: that gives its strides (``repr``) and
lets the root reach flattened dimensions by name.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import numpy as np

from ._world import WORLD, not_initialized
from .backends import parse_backend
from .group import GroupMember, ProcessGroup, _agree, _check_timeout, _split_many, default_pg

__all__ = ["DeviceMesh", "init_device_mesh"]


class DeviceMesh:
    """An n-d grid of global ranks, with one process group along each dimension.

    ``mesh`` is an array of global ranks; ``mesh[i, j]`` is the rank at that
    coordinate. ``get_group(dim)`` is the group of the ranks that share this
    rank's coordinates on every other dimension. Constructing one is
    collective over the world (one ``MPI_Comm_split`` per dimension).

    Args:
        device_type: ``"cpu"`` or ``"cuda"`` (``"cuda:N"`` too), the arrays the mesh's groups move.
        mesh: an n-d array (or nested lists, or an integer tensor) of distinct global ranks: every rank of the
            world, or some of them (the others are not part of the mesh: no coordinate, no groups).
        mesh_dim_names: one name per dimension, for ``get_group("dp")`` and ``mesh["dp"]``.
        backend_override: a backend for some dimensions' groups (default: the default group's), as
            ``{dimension index or name: backend}`` or, as torch's ``DeviceMesh``, one ``(backend, options)``
            pair per dimension (``(None, None)``: the default); options are accepted as torch's and ignored.

    Raises:
        TypeError: ``mesh`` holds other than ints (floats, bools), ``device_type`` is not a string.
        RuntimeError: ``mesh`` holds more ranks than the world (torch's).
        ValueError: ``mesh`` is ragged, repeats a rank or holds one outside the world; bad
            ``mesh_dim_names`` or ``backend_override``.
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
        arr = _rank_array(mesh)
        if arr.ndim == 0:
            raise ValueError("mesh must have at least one dimension")
        _check_ranks(arr, world.size())
        where = np.argwhere(arr == world.rank())
        coord = [int(c) for c in where[0]] if len(where) else None
        self._fill(device_type, arr, mesh_dim_names, [], coord)
        if _init_backend:
            backends = _backends(backend_override, arr.ndim, self._dim)
            tmo = _check_timeout(None)
            shown = arr.tolist()  # every dimension's check compares the whole mesh: no rank splits a dimension alone
            for dim in range(arr.ndim):
                desc = f"mesh_{self.mesh_dim_names[dim]}" if self.mesh_dim_names else f"mesh_dim_{dim}"
                lists = _rows(arr, (dim,))
                self._groups.append(_dim_group(world, lists, tmo, backends[dim], desc, "init_device_mesh", shown))

    def _fill(
        self,
        device_type: str,
        arr: np.ndarray,
        names: tuple[str, ...] | None,
        groups: list[Any],
        coord: list[int] | None,
    ) -> None:
        if names is not None and (
            not isinstance(names, (tuple, list))
            or len(names) != arr.ndim
            or not all(isinstance(x, str) for x in names)
            or len(set(names)) != arr.ndim
        ):
            raise ValueError(f"mesh_dim_names must be {arr.ndim} distinct names (one per dimension), got {names!r}")
        self.device_type = device_type
        self.mesh = arr
        self.mesh_dim_names = tuple(names) if names is not None else None
        self._groups = groups
        self._coord = coord
        # the root mesh (sliced and flattened meshes keep their root's) and the root dimensions each dimension spans
        self._root: DeviceMesh = self
        self._spec: list[tuple[int, ...]] = [(d,) for d in range(arr.ndim)]
        self._flat: dict[str, DeviceMesh] = {}  # on a root: its flattened meshes by name

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
        given, must list exactly those). A list of groups (as torch, even of
        one): ``mesh`` (n-d, of global ranks) and ``mesh_dim_names`` are
        required and ``group[d]`` is this rank's group along dimension ``d``;
        each must hold the ranks of this rank's row of ``mesh`` along ``d``.

        Args:
            group: one :class:`~hpcdist.group.ProcessGroup`, or a list of them, one per dimension.
            device_type: ``"cpu"`` or ``"cuda"`` (``"cuda:N"`` too), the arrays the mesh's groups move.
            mesh: the grid of global ranks (required with a list of groups).
            mesh_dim_names: one name per dimension, for ``get_group("dp")`` and ``mesh["dp"]`` (required
                with a list of groups).

        Returns:
            The :class:`DeviceMesh`.
        """
        _check_device_type(device_type)
        several = isinstance(group, (list, tuple))
        groups: list[Any] = list(group) if isinstance(group, (list, tuple)) else [group]
        if not groups or not all(isinstance(g, ProcessGroup) for g in groups):
            raise TypeError(f"group must be a ProcessGroup or a non-empty list of them, got {group!r}")
        if mesh is None:
            if several:
                raise ValueError(
                    f"mesh is required with a list of {len(groups)} group(s) (one per mesh dimension); "
                    "pass a single ProcessGroup for a 1-d mesh of its ranks"
                )
            arr = np.asarray(groups[0]._ranks, dtype=np.int64)
        else:
            arr = _rank_array(mesh)
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
        if several and mesh_dim_names is None:
            raise ValueError(
                f"mesh_dim_names is required with a list of groups: one name for each of the {len(groups)}"
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
        flat = self._flattened(mesh_dim)
        if flat is not None:
            return int(flat.mesh.size)
        return int(self.mesh.shape[self._dim(mesh_dim)])

    def _dim(self, mesh_dim: int | str | None) -> int:
        if mesh_dim is None:
            if self.ndim != 1:
                raise RuntimeError(
                    f"this mesh has {self.ndim} dimensions: pass mesh_dim (0..{self.ndim - 1} or one of "
                    f"mesh_dim_names {self.mesh_dim_names}); get_all_groups() gives every dimension's group"
                )
            return 0
        if isinstance(mesh_dim, str):
            if not self.mesh_dim_names or mesh_dim not in self.mesh_dim_names:
                raise self._no_dim(mesh_dim, self._root._flat)
            return self.mesh_dim_names.index(mesh_dim)
        if not isinstance(mesh_dim, (int, np.integer)):
            raise TypeError(
                f"mesh_dim must be an int (0..{self.ndim - 1}) or a dimension name, got {type(mesh_dim).__name__}: "
                f"{mesh_dim!r}"
            )
        if not -self.ndim <= mesh_dim < self.ndim:
            raise IndexError(f"mesh_dim must be in 0..{self.ndim - 1} (or -{self.ndim}..-1), got {mesh_dim}")
        return int(mesh_dim) % self.ndim

    def _no_dim(self, name: str, flattened: dict[str, DeviceMesh]) -> KeyError:
        """The KeyError for a dimension name this mesh lacks (naming the ``flattened`` names it could reach)."""
        flat = f" or flattened names {tuple(flattened)}" if flattened else ""
        return KeyError(f"mesh dimension {name!r} not in mesh_dim_names {self.mesh_dim_names}{flat}")

    def _flattened(self, mesh_dim: Any) -> DeviceMesh | None:
        """The root's flattened mesh named ``mesh_dim`` (torch looks names up there too), or None."""
        if isinstance(mesh_dim, str) and not (self.mesh_dim_names and mesh_dim in self.mesh_dim_names):
            return self._root._flat.get(mesh_dim)
        return None

    # groups and coordinates
    def get_group(self, mesh_dim: int | str | None = None) -> Any:
        """The group along ``mesh_dim`` that contains this rank (``GroupMember.NON_GROUP_MEMBER`` on a rank outside
        the mesh, as ``new_group`` returns there: collectives on it do nothing).

        Args:
            mesh_dim: a dimension index or name, or the name of a dimension flattened from the root mesh
                (None: the only dimension of a 1-d mesh).
        """
        flat = self._flattened(mesh_dim)
        if flat is not None:
            return flat._groups[0]
        dim = self._dim(mesh_dim)
        if not self._groups:
            raise RuntimeError("this DeviceMesh was built with _init_backend=False: it has no process groups")
        return self._groups[dim]

    def get_all_groups(self) -> list[Any]:
        """This rank's group along each dimension, in dimension order."""
        return list(self._groups)

    def get_local_rank(self, mesh_dim: int | str | None = None) -> int:
        """This rank's coordinate along ``mesh_dim`` (its rank in that dimension's group).

        Args:
            mesh_dim: a dimension index or name, or the name of a dimension flattened from the root mesh
                (None: the only dimension of a 1-d mesh).
        """
        flat = self._flattened(mesh_dim)
        mesh = self if flat is None else flat
        dim = 0 if flat is not None else self._dim(mesh_dim)
        if mesh._coord is None:
            raise mesh._not_part("get_local_rank")
        return mesh._coord[dim]

    def get_coordinate(self) -> tuple[int, ...] | None:
        """This rank's coordinate along every dimension (a tuple, as torch 2.13's), or None on a rank outside the
        mesh."""
        return None if self._coord is None else tuple(self._coord)

    def _is_current_rank_part_of_mesh(self) -> bool:
        """Whether this rank is in the mesh (torch's name, which DTensor asks)."""
        return self._coord is not None

    def _not_part(self, what: str) -> RuntimeError:
        return RuntimeError(
            f"{what}: global rank {self.get_rank()} is not part of this mesh {self.mesh.tolist()} "
            "(get_coordinate() is None there)"
        )

    def get_rank(self) -> int:
        """This process's global rank."""
        pg = WORLD.default_pg
        if pg is None:
            raise not_initialized()
        return pg.rank()

    def __getitem__(self, names: str | tuple[str, ...]) -> DeviceMesh:
        """The sub-mesh along the named dimensions that contains this rank (``mesh["dp"]``, ``mesh["dp", "tp"]``).

        Names must follow the mesh's own order; the root mesh also takes the
        names of dimensions flattened from it (``mesh["pp", "dp_tp"]``). The
        mesh's own names, all in order, give the mesh itself. The sub-mesh
        reuses this mesh's groups: no collective call.
        """
        if not self.mesh_dim_names:
            raise RuntimeError(
                f"cannot slice a DeviceMesh without mesh_dim_names (asked for {names!r}): build it with mesh_dim_names="
            )
        wanted = (names,) if isinstance(names, str) else tuple(names) if isinstance(names, (tuple, list)) else ()
        if not wanted or not all(isinstance(x, str) for x in wanted):
            raise KeyError(f"slice a mesh by dimension names, got {names!r}")
        if wanted == self.mesh_dim_names:
            return self
        root = self._root
        specs: list[tuple[int, ...]] = []
        groups: list[Any] = []
        for x in wanted:
            if x in self.mesh_dim_names:
                i = self.mesh_dim_names.index(x)
                specs.append(self._spec[i])
                groups.extend(self._groups[i : i + 1])
            elif self is root and x in root._flat:
                specs.append(root._flat[x]._spec[0])
                groups.extend(root._flat[x]._groups)
            else:
                raise self._no_dim(x, root._flat if self is root else {})
        dims = [d for s in specs for d in s]
        if len(set(dims)) != len(dims) or dims != sorted(dims):
            raise KeyError(
                f"mesh dimension names {wanted} must be distinct, not overlap, and be in the mesh's order "
                f"{self.mesh_dim_names}"
            )
        full = root.mesh.shape
        if root._coord is None and any(full[d] != 1 for d in range(len(full)) if d not in dims):
            raise RuntimeError(  # torch's: there is no row of the other dimensions to take
                f"cannot slice {wanted} out of a mesh this rank is not part of (global rank {self.get_rank()}, mesh "
                f"{root.mesh.tolist()}): the sub-mesh is one of several; slice on the mesh's ranks only"
            )
        index: list[Any] = list(root._coord) if root._coord is not None else [0] * len(full)
        for d in dims:
            index[d] = slice(None)
        sizes = [int(np.prod([full[d] for d in s])) for s in specs]
        coord = (
            None
            if root._coord is None
            else [int(np.ravel_multi_index([root._coord[d] for d in s], [full[d] for d in s])) for s in specs]
        )
        sub = DeviceMesh.__new__(DeviceMesh)
        sub._fill(self.device_type, root.mesh[tuple(index)].reshape(sizes), wanted, groups, coord)
        sub._root, sub._spec = root, specs
        return sub

    def _flatten(self, mesh_dim_name: str | None = None, backend_override: Any = None) -> DeviceMesh:
        """A 1-d mesh over this mesh's dimensions flattened into one, with a group per flattened row (torch's).

        Collective over the world the first time (one ``MPI_Comm_split``): every
        rank calls it with the same arguments. The root mesh keeps it:
        calling again returns the same mesh, and ``root.get_group(name)``,
        ``root.get_local_rank(name)`` and ``root[name]`` reach it.

        Args:
            mesh_dim_name: the flattened dimension's name (default: the names joined by ``"_"``);
                a 1-d mesh flattened into its own name is itself.
            backend_override: the new group's backend, or a ``(backend, options)`` pair (options ignored).

        Returns:
            The flattened :class:`DeviceMesh`.
        """
        if not self.mesh_dim_names:
            raise RuntimeError("cannot flatten a DeviceMesh without mesh_dim_names: build it with mesh_dim_names=")
        name = mesh_dim_name or "_".join(self.mesh_dim_names)
        if not isinstance(name, str):
            raise TypeError(f"mesh_dim_name must be a str, got {type(name).__name__}: {name!r}")
        if self.ndim == 1 and name in self.mesh_dim_names:
            return self
        root = self._root
        spec = tuple(d for s in self._spec for d in s)
        if root.mesh_dim_names and name in root.mesh_dim_names:
            raise ValueError(
                f"mesh_dim_name {name!r} already names a dimension of the root mesh {root.mesh_dim_names}: "
                "pass another mesh_dim_name"
            )
        made = root._flat.get(name)
        if made is not None:
            if made._spec[0] == spec:
                return made
            raise ValueError(
                f"a dimension named {name!r} was flattened from other dimensions of the root mesh before: "
                "pass another mesh_dim_name"
            )
        backend = _backend_of(backend_override)
        parse_backend(backend)  # a bad name fails here, before the split
        world = default_pg()
        lists = _rows(root.mesh, spec)
        me = world.rank()
        # a rank outside the mesh has a sub-mesh only where it is the only one (see __getitem__): one row
        row = next((r for r in lists if me in r), lists[0])
        shown = (root.mesh.tolist(), spec)
        group = _dim_group(world, lists, _check_timeout(None), backend, f"mesh_{name}", "DeviceMesh._flatten", shown)
        out = DeviceMesh.__new__(DeviceMesh)
        coord = [row.index(me)] if me in row else None
        out._fill(self.device_type, np.asarray(row, dtype=np.int64), (name,), [group], coord)
        out._root, out._spec = root, [spec]
        root._flat[name] = out
        return out

    def _strides(self) -> tuple[Any, ...]:
        """Each dimension's stride in the root's row-major rank layout, as torch prints them.

        A size-1 root dimension has none; a flattened dimension's root
        dimensions merge where contiguous: one int, else a tuple (``()`` for none).
        """
        full = self._root.mesh.shape
        row_major = [int(np.prod(full[d + 1 :])) for d in range(len(full))]
        out: list[Any] = []
        for spec in self._spec:
            modes: list[list[int]] = []
            for d in spec:
                if full[d] == 1:
                    continue
                if modes and modes[-1][1] == full[d] * row_major[d]:
                    modes[-1] = [modes[-1][0] * full[d], row_major[d]]
                else:
                    modes.append([full[d], row_major[d]])
            strides = tuple(m[1] for m in modes)
            out.append(strides[0] if len(strides) == 1 else strides)
        return tuple(out)

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
        """torch 2.13's: ``DeviceMesh((dp=2, tp=2), 'cpu', stride=(2, 1))``; the ranks too with TORCH_DISTRIBUTED_DEBUG=DETAIL."""
        if self.mesh_dim_names:
            sizes = f"({', '.join(f'{k}={v}' for k, v in zip(self.mesh_dim_names, self.shape))})"
        else:
            sizes = f"{self.shape}"
        out = f"DeviceMesh({sizes}, '{self.device_type}', stride={self._strides()}"
        if os.environ.get("TORCH_DISTRIBUTED_DEBUG", "") == "DETAIL":
            out += f", Mesh: {self.mesh.tolist()}"
        return out + ")"


def _rank_array(mesh: Any) -> np.ndarray:
    """``mesh`` (an array, a tensor or nested lists) as an int64 array; ValueError if ragged, TypeError if not ints."""
    raw = mesh.tolist() if hasattr(mesh, "tolist") else mesh
    bad = [x for x in _leaves(raw) if isinstance(x, bool) or not isinstance(x, (int, np.integer))]
    if bad:
        raise TypeError(
            f"mesh must hold int global ranks, got {type(bad[0]).__name__} entries such as {bad[0]!r}: {raw!r}"
        )
    try:
        return np.asarray(raw, dtype=np.int64)
    except ValueError as exc:  # numpy: "inhomogeneous shape"
        raise ValueError(
            f"mesh must be a rectangular n-d grid of global ranks (rows of one length), got {raw!r}"
        ) from exc


def _dim_group(
    world: ProcessGroup, lists: list[list[int]], tmo: Any, backend: Any, desc: str, what: str, shown: Any
) -> Any:
    """This rank's group along one mesh dimension whose groups are ``lists`` (collective over the world).

    A dimension that is the whole world in rank order, with no backend
    override, is the default group itself, as in torch (no new communicator,
    nor a second NCCL one on GPUs): the ranks still compare ``shown``, so ranks
    given different meshes raise rather than some splitting alone. Otherwise
    one split; a rank in none of the lists gets ``NON_GROUP_MEMBER``.
    """
    if backend is None and len(lists) == 1 and lists[0] == list(range(world.size())):
        _agree(world, shown, tmo.total_seconds(), what)
        return world
    mine, _ = _split_many(world, lists, tmo, backend, desc, what, given=shown)
    return GroupMember.NON_GROUP_MEMBER if mine is None else mine


def _check_ranks(arr: np.ndarray, world: int) -> None:
    """A mesh's ranks: distinct global ranks, at most the world's (RuntimeError above it, as torch)."""
    flat = arr.reshape(-1).tolist()
    if len(flat) > world:
        raise RuntimeError(
            f"a mesh cannot be bigger than the default world: it holds {len(flat)} ranks, the world {world}"
        )
    if len(set(flat)) != len(flat) or not all(0 <= r < world for r in flat):
        raise ValueError(f"mesh must hold distinct global ranks, each in 0..{world - 1}, got {flat}")


def _leaves(x: Any) -> Iterator[Any]:
    """The entries of nested lists/tuples/ranges."""
    if isinstance(x, (list, tuple, range)):
        for y in x:
            yield from _leaves(y)
    else:
        yield x


def _rows(arr: np.ndarray, dims: tuple[int, ...]) -> list[list[int]]:
    """The groups along ``dims`` (root dimensions, ascending): one list of ranks, row-major over ``dims``, per
    coordinate of the other dimensions."""
    moved = np.moveaxis(arr, list(dims), list(range(arr.ndim - len(dims), arr.ndim)))
    return [row.tolist() for row in moved.reshape(-1, int(np.prod([arr.shape[d] for d in dims])))]


def _check_device_type(device_type: Any) -> None:
    if not isinstance(device_type, str):
        raise TypeError(
            f"device_type must be a str, 'cpu' or 'cuda', got {type(device_type).__name__}: {device_type!r}"
            " (for a torch.device pass its .type)"
        )
    if device_type.split(":")[0] not in ("cpu", "cuda"):
        raise ValueError(f"device_type must be 'cpu' or 'cuda', got {device_type!r}")


def _backend_of(value: Any) -> Any:
    """The backend of a ``backend_override`` entry: a backend, or torch's ``(backend, options)`` pair (options are
    not used)."""
    return value[0] if isinstance(value, tuple) else value


def _backends(override: Any, ndim: int, dim_of: Any) -> list[Any]:
    """``backend_override`` as one backend (or None) per dimension.

    A dict ``{dimension index or name: backend}`` (init_device_mesh's), or one
    entry per dimension (torch's DeviceMesh): a ``(backend, options)`` pair, a
    backend or None. Options are not used.
    """
    out: list[Any] = [None] * ndim
    if override is None:
        return out
    if isinstance(override, (tuple, list)):
        if len(override) != ndim:
            raise ValueError(
                f"backend_override should have the same length as the number of mesh dimensions ({ndim}), "
                f"got {len(override)}: {override!r}"
            )
        out = [_backend_of(value) for value in override]
        for backend in out:
            parse_backend(backend)  # a bad name fails here, before any group is split
        return out
    if not isinstance(override, dict):
        raise TypeError(
            "backend_override must be a dict {dimension index or name: backend} or one (backend, options) pair "
            f"per dimension, got {override!r}"
        )
    for key, value in override.items():
        backend = _backend_of(value)
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
    ``prod(mesh_shape)`` may be below the world size, as in torch: the mesh
    then holds the ranks ``0..prod(mesh_shape) - 1`` and the others are not
    part of it (:meth:`DeviceMesh.get_coordinate` is None there).

    Args:
        device_type: ``"cpu"`` or ``"cuda"`` (``"cuda:N"`` too), the arrays the mesh's groups move.
        mesh_shape: the size of each dimension, positive ints (a tuple, list or ``torch.Size``).
        mesh_dim_names: one name per dimension, for ``get_group("dp")`` and ``mesh["dp"]``.
        backend_override: ``{dimension index or name: backend}``, a backend for some dimensions'
            groups (default: the default group's); a ``(backend, options)`` pair is accepted as torch's
            and its options are ignored.

    Returns:
        The :class:`DeviceMesh`.

    Raises:
        TypeError: ``mesh_shape`` is not a sequence of ints; ``device_type`` is not a string.
        RuntimeError: ``mesh_dim_names`` repeats a name or has another length than ``mesh_shape``;
            ``prod(mesh_shape)`` above the world size (torch's).
        ValueError: a size below 1, a bad ``backend_override``.
    """
    world = default_pg()
    if not isinstance(mesh_shape, (tuple, list)) or any(
        isinstance(s, bool) or not isinstance(s, (int, np.integer)) for s in mesh_shape
    ):
        raise TypeError(f"mesh_shape must be a tuple of ints (one size per dimension), got {mesh_shape!r}")
    if not mesh_shape or any(s < 1 for s in mesh_shape):
        raise ValueError(f"mesh_shape must be a non-empty tuple of positive ints, got {mesh_shape!r}")
    if isinstance(mesh_dim_names, (tuple, list)) and all(isinstance(x, str) for x in mesh_dim_names):
        if len(set(mesh_dim_names)) != len(mesh_dim_names):
            raise RuntimeError(f"mesh_dim_names must be distinct (each name once), got {tuple(mesh_dim_names)}")
        if len(mesh_dim_names) != len(mesh_shape):
            raise RuntimeError(
                f"mesh_dim_names must have one name per dimension of mesh_shape {tuple(mesh_shape)} "
                f"({len(mesh_shape)}), got {len(mesh_dim_names)}: {tuple(mesh_dim_names)}"
            )
    ranks = int(np.prod(mesh_shape))
    if ranks > world.size():  # torch's RuntimeError
        raise RuntimeError(
            f"mesh_shape {tuple(mesh_shape)} holds {ranks} ranks, more than the world's {world.size()}: a mesh "
            "cannot be bigger than the default world"
        )
    mesh = np.arange(ranks, dtype=np.int64).reshape(tuple(mesh_shape))
    return DeviceMesh(device_type, mesh, mesh_dim_names=mesh_dim_names, backend_override=backend_override)
