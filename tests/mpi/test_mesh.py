"""DeviceMesh: the groups along each dimension, checked against the mesh array."""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as dist


def test_mesh_groups_match_the_grid():
    n = dist.get_world_size()
    shape = (2, n // 2) if n % 2 == 0 else (n,)
    names = ("dp", "tp")[: len(shape)]
    mesh = dist.init_device_mesh("cpu", shape, mesh_dim_names=names)
    grid = np.arange(n).reshape(shape)
    coord = tuple(int(c) for c in np.argwhere(grid == dist.get_rank())[0])
    assert mesh.get_coordinate() == coord and mesh.shape == shape and mesh.ndim == len(shape)
    for dim, name in enumerate(names):
        idx = list(coord)
        idx[dim] = slice(None)
        expect = grid[tuple(idx)].tolist()
        g = mesh.get_group(name)
        assert dist.get_process_group_ranks(g) == expect
        assert mesh.get_local_rank(dim) == coord[dim] == dist.get_rank(g)
        x = np.array([float(dist.get_rank())])
        dist.all_reduce(x, group=mesh[name].get_group())
        assert x[0] == sum(expect)
    with pytest.raises(RuntimeError, match="holds"):  # torch's type
        dist.init_device_mesh("cpu", (n + 1,))
    with pytest.raises(KeyError, match="nope"):
        mesh.get_group("nope")


def _shape3(n: int) -> tuple[int, int, int]:
    """A 3-d shape over n ranks whose outer and inner dimensions have 2 when n allows."""
    if n % 4 == 0:
        return (2, n // 4, 2)
    if n % 2 == 0:
        return (2, n // 2, 1)
    return (1, n, 1)


def test_multi_dimension_slices_keep_the_grid_and_the_groups():
    n = dist.get_world_size()
    shape = _shape3(n)
    mesh = dist.init_device_mesh("cpu", shape, mesh_dim_names=("pp", "dp", "tp"))
    grid = np.arange(n).reshape(shape)
    p, d, t = (int(c) for c in np.argwhere(grid == dist.get_rank())[0])
    sub = mesh["dp", "tp"]
    assert sub.mesh.tolist() == grid[p].tolist() and sub.mesh_dim_names == ("dp", "tp")
    assert sub.get_coordinate() == (d, t) and sub.shape == shape[1:]
    assert sub.get_group("dp") is mesh.get_group("dp") and sub.get_group(1) is mesh.get_group("tp")
    outer = mesh["pp", "tp"]
    assert outer.mesh.tolist() == grid[:, d, :].tolist()
    # the 2-d sub-mesh's groups reduce over exactly its rows and columns
    x = np.array([float(dist.get_rank())])
    dist.all_reduce(x, group=sub.get_group("tp"))
    assert x[0] == grid[p, d, :].sum()
    assert mesh[("tp",)].mesh.tolist() == grid[p, d, :].tolist()
    with pytest.raises(KeyError, match="order"):
        mesh["tp", "dp"]
    with pytest.raises(KeyError, match="order"):
        mesh["dp", "dp"]
    with pytest.raises(KeyError, match="names"):
        mesh[0]


def test_from_group_wraps_existing_groups_without_a_collective():
    n = dist.get_world_size()
    ranks = list(range(n - 1, -1, -1))
    g = dist.new_group(ranks, sort_ranks=False)
    m1 = dist.DeviceMesh.from_group(g, "cpu", mesh_dim_names=("dp",))
    assert m1.mesh.tolist() == ranks and m1.get_group("dp") is g
    assert m1.get_local_rank() == dist.get_rank(g)
    shape = (2, n // 2) if n % 2 == 0 else (1, n)
    full = dist.init_device_mesh("cpu", shape, mesh_dim_names=("a", "b"))
    again = dist.DeviceMesh.from_group(
        [full.get_group(0), full.get_group(1)], "cpu", full.mesh, mesh_dim_names=("a", "b")
    )
    assert again.get_coordinate() == full.get_coordinate() and again.mesh.tolist() == full.mesh.tolist()
    if n > 1:  # at one rank both groups are [0]: swapped, they still fit
        with pytest.raises(ValueError, match="this rank's row"):
            dist.DeviceMesh.from_group([full.get_group(1), full.get_group(0)], "cpu", full.mesh)
    with pytest.raises(ValueError, match="mesh is required"):
        dist.DeviceMesh.from_group([full.get_group(0), full.get_group(1)], "cpu")
    with pytest.raises(TypeError, match="ProcessGroup"):
        dist.DeviceMesh.from_group([], "cpu")


def test_backend_override_is_checked_before_any_group_is_made():
    n = dist.get_world_size()
    mesh = dist.init_device_mesh("cpu", (1, n), mesh_dim_names=("a", "b"), backend_override={"b": "gloo", 0: "mpi"})
    assert dist.get_backend(mesh.get_group("b")) == "gloo" and dist.get_backend(mesh.get_group("a")) == "mpi"
    with pytest.raises(ValueError, match="backend"):
        dist.init_device_mesh("cpu", (1, n), backend_override={0: "carrier-pigeon"})
    with pytest.raises(ValueError, match="twice"):
        dist.init_device_mesh("cpu", (1, n), mesh_dim_names=("a", "b"), backend_override={"a": "mpi", 0: "mpi"})


def test_ranks_given_different_meshes_all_raise_and_the_world_goes_on():
    """Rank 0 lists the ranks in order, the others reversed: each rank's split would group the ranks its own way
    (wrong group ranks, wrong sums, no error); every rank now raises the same ValueError before any split."""
    n = dist.get_world_size()
    if n < 2:
        pytest.skip("needs at least 2 ranks")
    order = list(range(n)) if dist.get_rank() == 0 else list(range(n))[::-1]
    with pytest.raises(ValueError, match=r"init_device_mesh: the ranks were given different groups to make: group "):
        dist.DeviceMesh("cpu", order)
    with pytest.raises(ValueError, match=r"new_subgroups_by_enumeration: the ranks were given different groups"):
        dist.new_subgroups_by_enumeration([order])
    x = np.array([1.0])
    dist.all_reduce(x)  # the world is untouched
    assert x[0] == n
    mesh = dist.DeviceMesh("cpu", list(range(n)))  # agreeing ranks still build one
    assert dist.get_process_group_ranks(mesh.get_group()) == list(range(n))


def test_meshes_of_one_layout_are_equal_and_hash_alike():
    """As torch's DeviceMesh: equal when device type, rank grid and names agree (DTensor keys caches by mesh);
    hpcdist's compared by identity before, so a mesh rebuilt the same way was a different key."""
    n = dist.get_world_size()
    a = dist.init_device_mesh("cpu", (n,), mesh_dim_names=("dp",))
    b = dist.init_device_mesh("cpu", (n,), mesh_dim_names=("dp",))
    assert a == b and hash(a) == hash(b) and {a: 1}[b] == 1
    assert a != dist.init_device_mesh("cpu", (n,), mesh_dim_names=("tp",))
    assert a != dist.init_device_mesh("cpu", (n,))
    assert a != "cpu" and a != [list(range(n))]
    if n > 1:
        rev = dist.DeviceMesh("cpu", list(reversed(range(n))), mesh_dim_names=("dp",))
        assert a != rev
    if n % 2 == 0:
        grid = dist.init_device_mesh("cpu", (2, n // 2), mesh_dim_names=("dp", "tp"))
        transposed = np.arange(n).reshape(2, n // 2).T.tolist()
        assert grid != dist.DeviceMesh("cpu", transposed, mesh_dim_names=("dp", "tp"))
