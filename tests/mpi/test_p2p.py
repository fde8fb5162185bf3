"""Point-to-point over the group matrix, against known answers."""

from __future__ import annotations

import numpy as np
import pytest
from matrix import ring
from mpi_arrays import KINDS, empty, make, need, to_np, values

import hpcdist as dist


def me() -> int:
    return dist.get_rank()


@pytest.mark.parametrize("kind", KINDS)
def test_ring_send_recv(group, members, kind):
    need(kind)
    gr, right, left = ring(members)
    x = make(kind, values(me(), 6, "float64"), "float64")
    y = empty(kind, (6,), "float64")
    if gr % 2 == 0:
        dist.send(x, dst=right, group=group, tag=3)
        src = dist.recv(y, src=left, group=group, tag=3)
    else:
        src = dist.recv(y, src=left, group=group, tag=3)
        dist.send(x, dst=right, group=group, tag=3)
    assert src == left
    assert np.array_equal(to_np(y), values(left, 6, "float64"))


@pytest.mark.parametrize("kind", KINDS)
def test_isend_irecv_any_source_and_group_ranks(kind):
    need(kind)
    n = dist.get_world_size()
    if n < 2:
        pytest.skip("needs 2 or more ranks")
    if me() == 0:
        got = {}
        for _ in range(n - 1):
            y = empty(kind, (4,), "int64")
            w = dist.irecv(y, src=None, tag=9)
            w.wait()
            got[w.source_rank()] = to_np(y)
        assert sorted(got) == list(range(1, n))
        for r, y in got.items():
            assert np.array_equal(y, values(r, 4, "int64"))
    else:
        w = dist.isend(make(kind, values(me(), 4, "int64"), "int64"), group_dst=0, tag=9)
        assert w.wait() is True


def test_tags_keep_messages_apart():
    n = dist.get_world_size()
    if n < 2:
        pytest.skip("needs 2 or more ranks")
    if me() == 0:
        dist.send(np.full(2, 1.0), dst=1, tag=1)
        dist.send(np.full(2, 2.0), dst=1, tag=2)
    elif me() == 1:
        b = np.zeros(2)
        a = np.zeros(2)
        dist.recv(b, src=0, tag=2)  # posted first, matches the second message
        dist.recv(a, src=0, tag=1)
        assert a.tolist() == [1.0, 1.0] and b.tolist() == [2.0, 2.0]


@pytest.mark.parametrize("kind", KINDS)
def test_batch_isend_irecv_ring(group, members, kind):
    need(kind)
    _, right, left = ring(members)
    send_buf = make(kind, values(me(), 5, "float32"), "float32")
    recv_buf = empty(kind, (5,), "float32")
    ops = [dist.P2POp(dist.isend, send_buf, right, group=group), dist.P2POp(dist.irecv, recv_buf, left, group=group)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert np.array_equal(to_np(recv_buf), values(left, 5, "float32"))


@pytest.mark.parametrize("kind", KINDS)
def test_batch_isend_irecv_with_this_rank_as_peer(group, members, kind):
    """As torch's NCCL batch (test_batch_isend_irecv_self_nccl): a batch may send to and receive from this rank
    (a ring of one member exchanges with itself), the receive listed before the send; beside a ring exchange
    where the group has more members. It raised 'own rank ... would deadlock' (blocking send/recv still do)."""
    if group is dist.GroupMember.NON_GROUP_MEMBER:
        return
    need(kind)
    mine = make(kind, values(me(), 4, "float32"), "float32")
    back = empty(kind, (4,), "float32")
    ops = [
        dist.P2POp(dist.irecv, back, me(), group=group, tag=3),
        dist.P2POp(dist.isend, mine, me(), group=group, tag=3),
    ]
    n = len(members)
    if n > 1:
        gr = members.index(me())
        right, left = members[(gr + 1) % n], members[(gr - 1) % n]
        from_left = empty(kind, (4,), "float32")
        ops += [dist.P2POp(dist.isend, mine, right, group=group), dist.P2POp(dist.irecv, from_left, left, group=group)]
    for w in dist.batch_isend_irecv(ops):
        w.wait()
    assert np.array_equal(to_np(back), values(me(), 4, "float32"))
    if n > 1:
        assert np.array_equal(to_np(from_left), values(left, 4, "float32"))


def test_the_largest_user_tag_is_mpi_tag_ub_less_16():
    """The documented range: 0..MPI_TAG_UB less hpcdist's 16 reserved tags. The largest works end to end; one more
    (or a negative one) is a ValueError naming the range, on the sender and the receiver, before anything moves."""
    from mpi4py import MPI

    top = MPI.COMM_WORLD.Get_attr(MPI.TAG_UB) - 16
    n = dist.get_world_size()
    if n < 2:
        pytest.skip("needs 2 or more ranks")
    for bad in (top + 1, -1):
        with pytest.raises(ValueError, match=rf"tag must be in 0\.\.{top} \(MPI_TAG_UB less hpcdist's reserved tags\)"):
            dist.isend(np.ones(2), dst=(me() + 1) % n, tag=bad)
        with pytest.raises(ValueError, match=rf"got {bad}$"):
            dist.irecv(np.ones(2), src=(me() - 1) % n, tag=bad)
    x, y = np.full(3, float(me())), np.zeros(3)
    works = [dist.irecv(y, src=(me() - 1) % n, tag=top), dist.isend(x, dst=(me() + 1) % n, tag=top)]
    for w in works:
        w.wait()
    assert y.tolist() == [float((me() - 1) % n)] * 3
