"""torch dtypes that NumPy lacks and hpcdist moves as their bits: float8, float4_e2m1fn_x2, complex32.

Every data-movement collective and point-to-point call carries them over the
matrix's groups, through MPI and through shared memory; every reduction
refuses them before any message moves (no arithmetic of theirs runs here),
naming the dtype and the conversion to reduce instead. The reference is the
bytes each rank made: rank ``r``'s tensor holds random bytes drawn from a
generator seeded by ``r`` (NaN and infinity patterns included), so the
expected result of a gather, a scatter or an all-to-all is those bytes put
in the documented order by NumPy.
"""

from __future__ import annotations

import numpy as np
import pytest
from matrix import GROUP_KINDS, make_groups, members_of

import hpcdist as dist
from hpcdist.ops import BITS_ONLY

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")

DTYPES = [name for name in sorted(BITS_ONLY) if hasattr(torch, name)]
COUNT = 37  # elements per rank: uneven, and several MPI packets of nothing in particular


def me() -> int:
    return dist.get_rank()


def made(name: str, rank: int, count: int = COUNT, salt: int = 0):
    """``count`` elements of dtype ``name`` whose bytes rank ``rank`` drew (the reference of every test)."""
    dt = getattr(torch, name)
    size = torch.empty(0, dtype=dt).element_size()
    raw = np.random.default_rng(7919 * rank + salt).integers(0, 256, count * size, dtype=np.uint8)
    return torch.from_numpy(raw).view(dt)


def raw(t) -> np.ndarray:
    """The bytes of a contiguous tensor."""
    return t.view(torch.uint8).numpy()


@pytest.fixture(scope="module")
def groups():
    return make_groups()


@pytest.fixture(params=GROUP_KINDS)
def group(request, groups):
    g = groups[request.param]
    return g, members_of(g)


@pytest.mark.parametrize("name", DTYPES)
def test_broadcast_from_every_root(group, name):
    g, members = group
    for root, src in enumerate(members):
        t = made(name, me(), salt=root)
        dist.broadcast(t, group=g, group_src=root)
        want = made(name, src if members else me(), salt=root)
        assert np.array_equal(raw(t), raw(want)), (name, root)


@pytest.mark.parametrize("name", DTYPES)
def test_all_gather_both_forms(group, name):
    g, members = group
    mine = made(name, me())
    out = torch.empty(len(members) * COUNT, dtype=getattr(torch, name))
    outs = [torch.empty(COUNT, dtype=getattr(torch, name)) for _ in members]
    dist.all_gather_into_tensor(out, mine, group=g)
    dist.all_gather(outs, mine, group=g)
    if not members:
        return
    want = np.concatenate([raw(made(name, r)) for r in members])
    assert np.array_equal(raw(out), want)
    assert np.array_equal(np.concatenate([raw(o) for o in outs]), want)


@pytest.mark.parametrize("name", DTYPES)
def test_gather_and_scatter(group, name):
    g, members = group
    if not members:
        return
    dt = getattr(torch, name)
    i = members.index(me())
    last = len(members) - 1
    outs = [torch.empty(COUNT, dtype=dt) for _ in members] if i == last else None
    dist.gather(made(name, me()), outs, group=g, group_dst=last)
    if outs is not None:
        assert all(np.array_equal(raw(o), raw(made(name, r))) for o, r in zip(outs, members, strict=True))
    chunks = [made(name, 100 + k) for k in range(len(members))] if i == 0 else None
    got = torch.empty(COUNT, dtype=dt)
    dist.scatter(got, chunks, group=g, group_src=0)
    assert np.array_equal(raw(got), raw(made(name, 100 + i)))


@pytest.mark.parametrize("name", DTYPES)
def test_all_to_all_both_forms(group, name):
    g, members = group
    if not members:
        return
    dt, m, i, k = getattr(torch, name), len(members), members.index(me()), 3
    out = torch.empty(m * k, dtype=dt)
    dist.all_to_all_single(out, made(name, me(), m * k), group=g)
    outs = [torch.empty(k, dtype=dt) for _ in members]
    dist.all_to_all(outs, list(made(name, me(), m * k).split(k)), group=g)
    want = np.concatenate([raw(made(name, r, m * k))[i * k * out.element_size() : (i + 1) * k * out.element_size()]
                           for r in members])  # fmt: skip
    assert np.array_equal(raw(out), want)
    assert np.array_equal(np.concatenate([raw(o) for o in outs]), want)


@pytest.mark.parametrize("name", DTYPES)
def test_point_to_point_around_the_ring(name):
    n = dist.get_world_size()
    if n < 2:
        pytest.skip("needs two ranks")
    nxt, prv = (me() + 1) % n, (me() - 1) % n
    got = torch.empty(COUNT, dtype=getattr(torch, name))
    works = [dist.isend(made(name, me()), dst=nxt), dist.irecv(got, src=prv)]
    for w in works:
        w.wait()
    assert np.array_equal(raw(got), raw(made(name, prv)))
    blocking = torch.empty(COUNT, dtype=getattr(torch, name))
    if me() % 2 == 0:
        dist.send(made(name, me(), salt=1), dst=nxt)
        dist.recv(blocking, src=prv)
    else:
        dist.recv(blocking, src=prv)
        dist.send(made(name, me(), salt=1), dst=nxt)
    assert np.array_equal(raw(blocking), raw(made(name, prv, salt=1)))


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2"])
def test_a_strided_output_is_written_back_and_nothing_else(name):
    """A broadcast into every other element: those hold the root's bytes, the others keep theirs."""
    base = made(name, me(), 2 * COUNT, salt=5)
    before = raw(base).copy()
    view = base[::2]
    dist.broadcast(view, src=0)
    got = raw(base)
    assert np.array_equal(got[::2], raw(made(name, 0, 2 * COUNT, salt=5))[::2])  # root 0's every other byte
    assert np.array_equal(got[1::2], before[1::2])


@pytest.mark.parametrize("name", DTYPES)
def test_through_shared_memory(name):
    """A group forced onto the shared-memory engine (small slots: many chunks) moves the bits alike."""
    import os

    saved = os.environ.get("HPCDIST_SHM"), os.environ.get("HPCDIST_SHM_SLOT")
    os.environ.update(HPCDIST_SHM="1", HPCDIST_SHM_SLOT="64")
    try:
        g = dist.new_group()
        g.engine("cpu")
    finally:
        for key, value in zip(("HPCDIST_SHM", "HPCDIST_SHM_SLOT"), saved, strict=True):
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    try:
        n, count = dist.get_world_size(), 301
        t = made(name, me(), count)
        dist.broadcast(t, group=g, group_src=n - 1)
        assert np.array_equal(raw(t), raw(made(name, n - 1, count)))
        out = torch.empty(n * count, dtype=getattr(torch, name))
        dist.all_gather_into_tensor(out, made(name, me(), count), group=g)
        assert np.array_equal(raw(out), np.concatenate([raw(made(name, r, count)) for r in range(n)]))
    finally:
        dist.destroy_process_group(g)


REDUCTIONS = [
    ("all_reduce", lambda t: dist.all_reduce(t)),
    ("all_reduce async", lambda t: dist.all_reduce(t, async_op=True)),
    ("reduce", lambda t: dist.reduce(t, dst=0)),
    ("reduce_scatter_tensor", lambda t: dist.reduce_scatter_tensor(t[:1], t[: dist.get_world_size()])),
    ("all_reduce_coalesced", lambda t: dist.all_reduce_coalesced([t, t.clone()])),
    ("all_reduce_bucketed", lambda t: dist.all_reduce_bucketed([t])),
]


@pytest.mark.parametrize("name", DTYPES)
@pytest.mark.parametrize(("call_name", "call"), REDUCTIONS, ids=[r[0] for r in REDUCTIONS])
def test_reductions_refuse_before_any_message(name, call_name, call):
    """ValueError on every rank alike, naming the dtype and the conversion; the tensor untouched; the group's
    next collective matches (nothing moved)."""
    t = made(name, me())
    before = raw(t).copy()
    convert = "torch.view_as_real" if name == "complex32" else "tensor.float()"
    with pytest.raises(ValueError, match=rf"cannot reduce {name}: .*as their bits only.*{convert}"):
        call(t)
    assert np.array_equal(raw(t), before), call_name
    x = np.ones(3)
    dist.all_reduce(x)
    assert np.all(x == dist.get_world_size())


def test_two_float8_kinds_do_not_mix():
    """The logical dtype is what is compared, not the bytes' carrier: e4m3 into an e5m2 output is refused."""
    out = torch.empty(dist.get_world_size() * 4, dtype=torch.float8_e5m2)
    with pytest.raises(TypeError, match="float8_e4m3fn"):
        dist.all_gather_into_tensor(out, made("float8_e4m3fn", me(), 4))
