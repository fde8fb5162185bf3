"""Object collectives, including out-of-band NumPy buffers, against known answers."""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as dist


def me() -> int:
    return dist.get_rank()


def obj_of(r: int, big: bool = False):
    o = {"rank": r, "name": f"r{r}", "t": (r, [r] * r), "arr": np.arange(r + 3, dtype=np.float32) * r}
    if big:
        o["blob"] = np.full(50_000 + r, r, dtype=np.int32)  # > the first broadcast round
    return o


def same(a, b) -> bool:
    return a.keys() == b.keys() and all(
        np.array_equal(a[k], b[k]) if isinstance(a[k], np.ndarray) else a[k] == b[k] for k in a
    )


@pytest.mark.parametrize("big", [False, True])
def test_broadcast_object_list(group, members, big):
    for root in members:
        objs = [obj_of(root, big), "x" * root, None] if me() == root else [None, None, None]
        dist.broadcast_object_list(objs, src=root, group=group)
        assert same(objs[0], obj_of(root, big)) and objs[1] == "x" * root and objs[2] is None


@pytest.mark.parametrize("big", [False, True])
def test_all_gather_object(group, members, big):
    out = [None] * len(members)
    dist.all_gather_object(out, obj_of(me(), big), group=group)
    for r, o in zip(members, out):
        assert same(o, obj_of(r, big))


@pytest.mark.parametrize("size", ["small", "big", "mixed"])
def test_gather_and_scatter_object(group, members, size):
    """Small objects travel in the one collective; big ones (all, or every other rank's) also point to point."""

    def big(r: int) -> bool:
        return size == "big" or (size == "mixed" and r % 2 == 1)

    for root in members:
        out = [None] * len(members) if me() == root else None
        dist.gather_object(obj_of(me(), big(me())), out, dst=root, group=group)
        if me() == root:
            assert all(same(o, obj_of(r, big(r))) for r, o in zip(members, out))
        got = [None]
        inputs = [obj_of(10 + r, big(r)) for r in members] if me() == root else None
        dist.scatter_object_list(got, inputs, src=root, group=group)
        assert same(got[0], obj_of(10 + me(), big(me())))


def test_send_recv_object_list():
    n = dist.get_world_size()
    if n < 2:
        pytest.skip("needs 2 or more ranks")
    if me() == 0:
        for r in range(1, n):
            dist.send_object_list([obj_of(r), {"to": r}], dst=r)
    else:
        got = [None, None]
        assert dist.recv_object_list(got) == 0
        assert same(got[0], obj_of(me())) and got[1] == {"to": me()}


def test_out_of_band_arrays_are_writable_views():
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, np.arange(1000, dtype=np.float64) + me())
    for r, a in enumerate(out):
        assert isinstance(a, np.ndarray) and a.flags.writeable
        assert np.array_equal(a, np.arange(1000, dtype=np.float64) + r)
