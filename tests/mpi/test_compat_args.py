"""torch arguments hpcdist accepts and ignores (docs/migration.md, "Accepted for compatibility and ignored").

Each call with the argument gives what the same call without it gives: the
same members, the same data.
"""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as dist

OPTIONS = object()  # what torch would pass as backend options: hpcdist never looks at it


def me() -> int:
    return dist.get_rank()


def n() -> int:
    return dist.get_world_size()


def test_group_constructors_ignore_pg_options_device_id_and_shrink_flags():
    ranks = list(range(0, n(), 2))
    plain = dist.new_group(ranks)
    given = dist.new_group(ranks, pg_options=OPTIONS, device_id=0)
    if me() in ranks:
        assert dist.get_process_group_ranks(given) == dist.get_process_group_ranks(plain) == ranks
    else:
        assert given is plain is dist.GroupMember.NON_GROUP_MEMBER
    sub, subs = dist.new_subgroups(1, pg_options=OPTIONS)
    assert dist.get_process_group_ranks(sub) == [me()] and len(subs) == n()
    sub, _ = dist.new_subgroups_by_enumeration([[r] for r in range(n())], pg_options=OPTIONS)
    assert dist.get_process_group_ranks(sub) == [me()]
    split = dist.split_group(split_ranks=[list(range(n()))], pg_options=OPTIONS)
    assert dist.get_process_group_ranks(split) == list(range(n()))
    if n() > 1:
        if me() != n() - 1:
            shrunk = dist.shrink_group([n() - 1], shrink_flags=1, pg_options=OPTIONS)
            assert dist.get_process_group_ranks(shrunk) == list(range(n() - 1))
        dist.barrier()


def test_barrier_ignores_device_ids():
    dist.barrier(device_ids=[0])
    work = dist.barrier(async_op=True, device_ids=[0])
    assert work is not None and work.wait()


def test_object_calls_ignore_device_and_use_batch():
    objs = [{"from": 0, "data": np.arange(3)}, "x"] if me() == 0 else [None, None]
    dist.broadcast_object_list(objs, src=0, device="cpu")
    assert objs[0]["from"] == 0 and np.array_equal(objs[0]["data"], np.arange(3)) and objs[1] == "x"
    if n() < 2:
        return
    if me() == 0:
        dist.send_object_list([("hello", 1)], dst=1, device="cuda:0", use_batch=True)
    elif me() == 1:
        got = [None]
        assert dist.recv_object_list(got, src=0, device="cuda:0", use_batch=True) == 0
        assert got == [("hello", 1)]
    dist.barrier()


def test_device_mesh_ignores_the_options_of_a_backend_override():
    mesh = dist.init_device_mesh("cpu", (n(),), mesh_dim_names=("dp",), backend_override={"dp": ("mpi", OPTIONS)})
    assert dist.get_process_group_ranks(mesh.get_group("dp")) == list(range(n()))
    assert dist.get_backend(mesh.get_group("dp")) == "mpi"


@pytest.mark.parametrize("use_libuv", [True, False])
def test_tcpstore_ignores_use_libuv(use_libuv, monkeypatch):
    from datetime import timedelta

    from hpcdist.store import TCPStore

    monkeypatch.delenv("HPCDIST_STORE_SECRET", raising=False)
    monkeypatch.delenv("HPCDIST_STORE_SECRET_FILE", raising=False)
    store = TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30), use_libuv=use_libuv)
    try:
        store.set("k", "v")
        assert store.get("k") == b"v"
    finally:
        store.close()
