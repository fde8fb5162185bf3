"""The flight recorder records every operation, with the same collective numbering on every rank."""

from __future__ import annotations

import numpy as np
import pytest
from matrix import ring

import hpcdist as dist


def _ring(group):
    pg = dist.group.WORLD if group is None else group
    assert pg._flight is not None, "the flight recorder is on by default"
    return pg._flight


def _since(group, coll0, p2p0, p2p=False):
    members = dist.get_process_group_ranks(dist.group.WORLD if group is None else group)
    snap = _ring(group).snapshot(members)
    return [e for e in snap if e["p2p"] == p2p and e["seq"] > (p2p0 if p2p else coll0)]


def test_collectives_are_recorded_alike_on_every_rank(group, members):
    if not members:
        pytest.skip("not a member")
    r = _ring(group)
    coll0, p2p0 = r.n_coll, r.n_p2p
    root = members[-1]
    x = np.arange(4, dtype=np.float32)
    dist.all_reduce(x, group=group)
    dist.broadcast(x, src=root, group=group)
    work = dist.all_reduce(x, group=group, async_op=True)
    dist.reduce(x, dst=root, group=group)
    dist.all_gather([np.empty(4, np.float32) for _ in members], x, group=group)
    dist.barrier(group=group)
    objs = [None] * len(members)
    dist.all_gather_object(objs, dist.get_rank(), group=group)
    got = [
        (e["seq"] - coll0, e["op"], e["dtype"], e["count"], e["root"], e["state"]) for e in _since(group, coll0, p2p0)
    ]
    eng = (dist.group.WORLD if group is None else group).engine("cpu")
    # async, not waited yet: still running on MPI; shared memory (an oversubscribed node) completes it in the call
    async_state = "completed" if eng.path("all_reduce", x.nbytes) == "shm" else "started"
    assert got == [
        (1, "all_reduce", "float32", 4, None, "completed"),
        (2, "broadcast", "float32", 4, root, "completed"),
        (3, "all_reduce", "float32", 4, None, async_state),
        (4, "reduce", "float32", 4, root, "completed"),
        (5, "all_gather", "float32", 4, None, "completed"),
        (6, "barrier", None, 0, None, "completed"),
        (7, "all_gather_object", None, 0, None, "completed"),
    ]
    work.wait()
    assert _since(group, coll0, p2p0)[2]["state"] == "completed"
    # the numbering is the group's: every member holds the same sequence numbers for the same calls
    mine = [(e["seq"], e["op"], e["count"], e["root"]) for e in _since(group, coll0, p2p0)]
    every = [None] * len(members)
    dist.all_gather_object(every, mine, group=group)
    assert all(theirs == every[0] for theirs in every)


def test_point_to_point_is_recorded_with_global_peers(group, members):
    if not members:
        pytest.skip("not a member")
    _, nxt, prev = ring(members)
    r = _ring(group)
    coll0, p2p0 = r.n_coll, r.n_p2p
    x = np.full(3, dist.get_rank(), dtype=np.int64)
    y = np.empty(3, dtype=np.int64)
    send = dist.isend(x, dst=nxt, group=group)
    dist.recv(y, src=prev, group=group)
    send.wait()
    got = [(e["op"], e["peer"], e["count"], e["state"]) for e in _since(group, coll0, p2p0, p2p=True)]
    assert got == [("isend", nxt, 3, "completed"), ("recv", prev, 3, "completed")]
    assert int(y[0]) == prev
