"""Group creation and rank maps, against the ranks the test asked for."""

from __future__ import annotations

import numpy as np
import pytest

import hpcdist as dist


def me() -> int:
    return dist.get_rank()


def n() -> int:
    return dist.get_world_size()


def test_world_queries():
    assert dist.is_initialized() and dist.is_available() and dist.is_mpi_available() and dist.is_gloo_available()
    assert dist.get_backend() == "mpi"
    assert dist.group.WORLD is dist.GroupMember.WORLD
    assert dist.get_process_group_ranks(dist.group.WORLD) == list(range(n()))
    assert dist.get_rank(dist.group.WORLD) == me()
    assert dist.get_backend_config() == "cpu:mpi,cuda:mpi"


def test_group_rank_maps(group, members):
    if not members:
        assert group is dist.GroupMember.NON_GROUP_MEMBER
        assert dist.get_rank(group) == -1 and dist.get_world_size(group) == -1
        return
    assert dist.get_world_size(group) == len(members)
    assert dist.get_rank(group) == members.index(me())
    for gr, glob in enumerate(members):
        assert dist.get_global_rank(group, gr) == glob
        assert dist.get_group_rank(group, glob) == gr


def test_new_subgroups():
    size = 2 if n() % 2 == 0 else 1
    cur, subs = dist.new_subgroups(group_size=size)
    assert len(subs) == n() // size
    mine = me() // size
    assert dist.get_process_group_ranks(cur) == list(range(mine * size, mine * size + size))
    for i, s in enumerate(subs):
        assert (s is dist.GroupMember.NON_GROUP_MEMBER) == (i != mine)
    x = np.array([float(me())])
    dist.all_reduce(x, group=cur)
    assert x[0] == sum(range(mine * size, mine * size + size))
    dist.destroy_process_group(cur)
    with pytest.raises(ValueError, match="destroyed"):
        dist.all_reduce(x, group=cur)


#: pretend node layouts (node of each world rank) -> new_subgroups()' default size, or None: refused
DEFAULT_SIZE_LAYOUTS = {
    1: [([0], 1)],
    2: [([0, 0], 2), ([0, 1], 1)],
    3: [([0, 0, 0], 3), ([0, 1, 2], 1), ([0, 0, 1], None)],
    4: [([0, 0, 1, 1], 2), ([1, 1, 0, 0], 2), ([0, 1, 0, 1], 2), ([0, 0, 0, 1], None), ([0, 1, 2, 3], 1)],
}


def test_new_subgroups_default_is_the_ranks_per_node_or_refused_on_every_rank():
    """The default size is the ranks per node, in blocks of consecutive ranks as torch's (node-local where ranks
    are placed node by node; interleaved, they span nodes, as torch's do). Nodes of unequal sizes made the ranks
    disagree on the size (some raised, one waited for the timeout): now every rank raises the same ValueError,
    before any message moves."""
    from hpcdist._world import WORLD

    real = WORLD.node_of
    try:
        for layout, want in DEFAULT_SIZE_LAYOUTS[n()]:
            WORLD.node_of = list(layout)
            if want is None:
                with pytest.raises(ValueError, match=r"new_subgroups\(group_size=None\) takes the parent's ranks per"):
                    dist.new_subgroups()
                continue
            cur, subs = dist.new_subgroups()
            ranks = dist.get_process_group_ranks(cur)
            assert len(subs) == n() // want and len(ranks) == want, layout
            assert ranks == list(range(me() // want * want, me() // want * want + want))  # consecutive, as torch's
            if layout == sorted(layout) or layout == sorted(layout, reverse=True):  # placed node by node
                assert {layout[r] for r in ranks} == {layout[me()]}, layout
            for s in subs:
                if s is not dist.GroupMember.NON_GROUP_MEMBER:
                    dist.destroy_process_group(s)
    finally:
        WORLD.node_of = real
    dist.barrier()  # every rank went through the same cases, none is left inside one


def test_new_subgroups_by_enumeration():
    lists = [list(range(n() - 1, -1, -2)), list(range(n() - 2, -1, -2))]
    lists = [lst for lst in lists if lst]
    cur, subs = dist.new_subgroups_by_enumeration(lists)
    assert len(subs) == len(lists)
    mine = next(lst for lst in lists if me() in lst)
    assert dist.get_process_group_ranks(cur) == sorted(mine)  # in rank order, as torch's (new_group sorts)
    out = [None] * len(mine)
    dist.all_gather_object(out, me(), group=cur)
    assert out == sorted(mine)
    with pytest.raises(ValueError, match="must not overlap"):
        dist.new_subgroups_by_enumeration([[0], [0]])


def test_split_group_of_subgroup_uses_group_ranks():
    parent = dist.new_group(list(range(n() - 1, -1, -1)), sort_ranks=False)  # group rank g <-> global n-1-g
    sub = dist.split_group(parent, [[0]])  # group rank 0 of parent == global rank n-1
    if me() == n() - 1:
        assert dist.get_process_group_ranks(sub) == [n() - 1]
    else:
        assert sub is None


def test_local_synchronization_group():
    g = dist.new_group([0], use_local_synchronization=True) if me() == 0 else dist.GroupMember.NON_GROUP_MEMBER
    if me() == 0:
        x = np.ones(2)
        dist.all_reduce(x, group=g)
        assert x.tolist() == [1.0, 1.0]


def test_monitored_barrier_passes_when_all_arrive():
    dist.monitored_barrier(wait_all_ranks=True)
    dist.monitored_barrier()


def test_pg_count_grows():
    before = dist.get_pg_count()
    g = dist.new_group()
    assert dist.get_pg_count() == before + 1
    dist.destroy_process_group(g)
    assert dist.get_pg_count() == before


def test_node_local_rank():
    assert 0 <= dist.get_node_local_rank() < n()
