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
    coord = [int(c) for c in np.argwhere(grid == dist.get_rank())[0]]
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
    with pytest.raises(ValueError, match="holds"):
        dist.init_device_mesh("cpu", (n + 1,))
    with pytest.raises(KeyError, match="nope"):
        mesh.get_group("nope")
