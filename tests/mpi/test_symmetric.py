"""Symmetric memory (``hpcdist.symmetric_memory``) and the collectives that read it where it lies.

The groups are made with ``HPCDIST_SHM=1`` (shared memory at every size) and
reductions of more than two ranks step through chunks of 64 bytes, so small
arrays cross many. References are NumPy (test_collectives' ``_ref``, rank
order for float sums); bitwise equality across ranks is checked over raw MPI;
a spy on the symmetric algorithms proves which path ran.
"""

from __future__ import annotations

import gc
import os

import numpy as np
import pytest
from matrix import GROUP_KINDS, members_of
from mpi_arrays import cast, need, to_np, torch, values
from test_collectives import OPS, _applies, _ref
from test_shm import groups_with, knobs_set, same_bytes_everywhere

import hpcdist as dist
from hpcdist import ReduceOp, symmetric_memory
from hpcdist.backends.shm import symmetric

DTYPES = ["float32", "float64", "int32", "int64", "complex128", "uint8", "bool"]
SIZES = [1, 37, 300]


def me() -> int:
    return dist.get_rank()


@pytest.fixture(scope="module")
def sym_groups():
    groups = groups_with({"HPCDIST_SHM": "1", "HPCDIST_SHM_DIRECT": "0"})
    chunk, symmetric.CHUNK_BYTES = symmetric.CHUNK_BYTES, 64
    yield groups
    symmetric.CHUNK_BYTES = chunk


@pytest.fixture(params=GROUP_KINDS)
def sgroup(request, sym_groups):
    g = sym_groups[request.param]
    return g, members_of(g)


@pytest.fixture
def spy(monkeypatch):
    """Counts the calls of each symmetric algorithm (the real one runs)."""
    calls: dict[str, int] = {}
    for name in ("all_reduce", "broadcast", "all_gather", "reduce_scatter"):
        real = getattr(symmetric, name)

        def counted(*a, _real=real, _name=name, **k):
            calls[_name] = calls.get(_name, 0) + 1
            return _real(*a, **k)

        monkeypatch.setattr(symmetric, name, counted)
    return calls


def place(g, size: int, dtype: str, at: int = 3) -> np.ndarray:
    """A view of ``size`` items at item ``at`` of a new symmetric allocation of ``g`` (collective)."""
    whole = symmetric_memory.empty(at + size + 2, dtype=dtype, group=g)
    return whole[at : at + size]


def check(actual, ref, dtype: str) -> None:
    got = to_np(actual).reshape(-1)
    want = cast(np.asarray(ref), dtype).reshape(-1)
    assert np.array_equal(got, want), f"{dtype}: got {got[:8]}..., want {want[:8]}..."


CASES = [(d, o) for d in DTYPES for o in OPS if _applies(o, d)]


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(("dtype", "opname"), CASES)
def test_all_reduce_every_op_dtype(sgroup, spy, size, dtype, opname):
    g, members = sgroup
    if not members:
        return
    op = ReduceOp.PREMUL_SUM(2.0) if opname == "PREMUL_SUM" else getattr(ReduceOp, opname)
    x = place(g, size, dtype)
    x[:] = values(me(), size, dtype).astype(dtype)
    assert symmetric_memory.is_symmetric(x, g)
    dist.all_reduce(x, op=op, group=g)
    stack = np.stack([values(r, size, dtype) for r in members])
    check(x, _ref(opname, stack, dtype, len(members)), dtype)
    same_bytes_everywhere(g, x)
    symmetric_path = len(members) > 1 and opname != "PREMUL_SUM"  # PREMUL_SUM converts: the segment's path
    assert spy.get("all_reduce", 0) == int(symmetric_path)


def test_bitwise_identical_fixed_order(sgroup, spy):
    """float32 sums of random data: the bytes of NumPy adding in rank order, on every rank, run to run, and
    the same as the segment's path on an ordinary array."""
    g, members = sgroup
    if not members:
        return
    size = 10_007
    inputs = [np.random.default_rng(r).standard_normal(size).astype(np.float32) for r in members]
    ref = inputs[0].copy()
    for a in inputs[1:]:
        ref += a
    mine = inputs[members.index(me())]
    x = place(g, size, "float32", at=0)
    for _ in range(2):
        x[:] = mine
        dist.all_reduce(x, group=g)
        assert x.tobytes() == ref.tobytes()
    plain = mine.copy()
    dist.all_reduce(plain, group=g)
    assert plain.tobytes() == x.tobytes()
    same_bytes_everywhere(g, x)
    assert spy.get("all_reduce", 0) == (2 if len(members) > 1 else 0)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", ["float32", "int64", "complex128", "bool"])
def test_broadcast_every_root(sgroup, spy, size, dtype):
    g, members = sgroup
    x = place(g, size, dtype) if members else None
    for gr, root in enumerate(members):
        x[:] = values(me(), size, dtype, salt=root).astype(dtype)
        dist.broadcast(x, group=g, group_src=gr)
        check(x, values(root, size, dtype, salt=root), dtype)
    if members:
        assert spy.get("broadcast", 0) == (len(members) if len(members) > 1 else 0)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", ["float64", "uint8"])
def test_all_gather_into_tensor(sgroup, spy, size, dtype):
    """Into a private array, and in place (the output in the same allocation, this rank's row the input)."""
    g, members = sgroup
    if not members:
        return
    n, gr = len(members), members.index(me())
    want = np.concatenate([values(r, size, dtype) for r in members])
    x = place(g, size, dtype)
    x[:] = values(me(), size, dtype).astype(dtype)
    out = np.full(n * size, 99, dtype)
    dist.all_gather_into_tensor(out, x, group=g)
    check(out, want, dtype)
    whole = symmetric_memory.empty(n * size, dtype=dtype, group=g)
    row = whole[gr * size : (gr + 1) * size]
    row[:] = values(me(), size, dtype).astype(dtype)
    dist.all_gather_into_tensor(whole, row, group=g)
    check(whole, want, dtype)
    same_bytes_everywhere(g, whole)
    assert spy.get("all_gather", 0) == (2 if n > 1 else 0)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(("dtype", "opname"), [("float32", "SUM"), ("int32", "MAX"), ("float64", "AVG")])
def test_reduce_scatter_tensor(sgroup, spy, size, dtype, opname):
    """Into a private array, into this rank's own row of the input, and into another row (computed aside)."""
    g, members = sgroup
    if not members:
        return
    n, gr = len(members), members.index(me())
    op = getattr(ReduceOp, opname)
    full = np.stack([values(r, n * size, dtype) for r in members])
    ref = _ref(opname, full, dtype, n)
    x = place(g, n * size, dtype)
    for target in ("private", "own row", "next row"):
        x[:] = values(me(), n * size, dtype).astype(dtype)
        if target == "private":
            out = np.full(size, 99, dtype)
        else:
            at = gr if target == "own row" else (gr + 1) % n
            out = x[at * size : (at + 1) * size]
        dist.reduce_scatter_tensor(out, x, op=op, group=g)
        check(out, ref[gr * size : (gr + 1) * size], dtype)
    assert spy.get("reduce_scatter", 0) == (3 if n > 1 else 0)


def test_torch_tensor_over_symmetric_memory(sgroup, spy):
    g, members = sgroup
    need("torch", "float32")
    if not members:
        return
    x = place(g, 37, "float32")
    t = torch.from_numpy(x)
    t.copy_(torch.from_numpy(values(me(), 37, "float32").astype(np.float32)))
    assert symmetric_memory.is_symmetric(t, g)
    dist.all_reduce(t, group=g)
    check(t, sum(values(r, 37, "float32") for r in members), "float32")
    assert spy.get("all_reduce", 0) == int(len(members) > 1)


def test_half_floats_take_the_segment_and_agree(sgroup, spy):
    g, members = sgroup
    if not members:
        return
    x = place(g, 37, "float16")
    x[:] = values(me(), 37, "float16")
    dist.all_reduce(x, group=g)
    check(x, sum(values(r, 37, "float16") for r in members), "float16")
    assert spy.get("all_reduce", 0) == 0


def test_other_groups_allocation_is_ordinary_memory(sym_groups, spy):
    """An array of the world's allocation passed to a subgroup's call takes that group's ordinary path."""
    g = sym_groups["split"]
    members = members_of(g)
    x = symmetric_memory.empty(37, dtype=np.float64, group=sym_groups["world"])
    assert not symmetric_memory.is_symmetric(x, g)
    x[:] = values(me(), 37, "float64")
    dist.all_reduce(x, group=g)
    check(x, sum(values(r, 37, "float64") for r in members), "float64")
    assert spy.get("all_reduce", 0) == 0


def _world_pair():
    """A new group of every rank, forced to shared memory (its segment may be broken by the test)."""
    with knobs_set({"HPCDIST_SHM": "1", "HPCDIST_SHM_DIRECT": "0"}):
        g = dist.new_group()
        g.engine("cpu")  # built while the knobs are set
    return g


def test_one_rank_passing_ordinary_memory_is_an_error_on_every_rank():
    if dist.get_world_size() < 2:
        pytest.skip("needs 2 ranks")
    g = _world_pair()
    x = symmetric_memory.empty(64, dtype=np.float32, group=g)
    arr = x if me() != 1 else np.ones(64, np.float32)
    with pytest.raises(dist.DistError, match="all_reduce on symmetric memory"):
        dist.all_reduce(arr, group=g)
    dist.destroy_process_group(g)


def test_views_at_different_places_and_another_allocation():
    """Each rank may pass its array anywhere in its part (the peers read it where it said); a rank passing
    another allocation is a DistError on every rank, after which the group goes on (all raised alike)."""
    if dist.get_world_size() < 2:
        pytest.skip("needs 2 ranks")
    g = _world_pair()
    n = dist.get_world_size()
    x = symmetric_memory.empty(64, dtype=np.float32, group=g)
    at = me() % 3
    v = x[at : at + 32]
    v[:] = np.arange(32) + me()
    dist.all_reduce(v, group=g)
    assert np.array_equal(v, n * np.arange(32) + sum(range(n)))
    y = symmetric_memory.empty(64, dtype=np.float32, group=g)
    with pytest.raises(dist.DistError, match="another allocation"):
        dist.all_reduce(x if me() != 1 else y, group=g)
    x[:] = 1
    dist.all_reduce(x, group=g)
    assert (x == n).all()
    dist.destroy_process_group(g)


def test_allocation_arguments_checked_before_any_message():
    for bad, err in [((-1,), ValueError), (("4",), TypeError), ((2.5,), TypeError), (((2, -3),), ValueError)]:
        with pytest.raises(err, match="size"):
            symmetric_memory.empty(*bad)
    with pytest.raises(TypeError, match="dtype"):
        symmetric_memory.empty(4, dtype="not-a-dtype")
    with pytest.raises(TypeError, match="dtype"):
        symmetric_memory.empty(4, dtype=object)


def test_more_than_dev_shm_holds_is_an_error_on_every_rank_not_a_crash():
    """The pages are reserved at allocation: too large is a DistError naming the cause (not SIGBUS later)."""
    before = set(os.listdir("/dev/shm"))
    with pytest.raises(dist.DistError, match="No space left on device"):
        symmetric_memory.empty(1 << 50, dtype=np.uint8)
    dist.barrier()
    assert set(os.listdir("/dev/shm")) <= before
    x = symmetric_memory.empty(8)  # the group goes on
    x[:] = 1
    dist.all_reduce(x)
    assert (x == dist.get_world_size()).all()


def test_empty_and_scalar_shapes():
    empty, scalar, flat = symmetric_memory.empty(3, 0), symmetric_memory.empty(()), symmetric_memory.empty([5])
    assert (empty.shape, scalar.shape, flat.shape) == ((3, 0), (), (5,))
    assert symmetric_memory.is_symmetric(scalar) and symmetric_memory.is_symmetric(flat)
    scalar[...] = me() + 1
    dist.all_reduce(scalar)
    dist.all_reduce(empty)
    assert scalar == sum(range(1, dist.get_world_size() + 1))


def test_shapes_must_agree():
    shape = (4, 2 + (me() == dist.get_world_size() - 1))
    if dist.get_world_size() == 1:
        assert symmetric_memory.empty(shape).shape == shape
        return
    with pytest.raises(ValueError, match="same shape and dtype"):
        symmetric_memory.empty(shape)


def test_memory_lives_with_its_views_and_leaves_nothing_in_dev_shm():
    before = set(os.listdir("/dev/shm"))
    x = symmetric_memory.empty((8, 4), dtype=np.int64)
    assert x.shape == (8, 4) and x.flags.c_contiguous and not x.any()
    dist.barrier()  # rank 0 unlinks the file before it returns
    assert set(os.listdir("/dev/shm")) <= before  # unlinked once every rank mapped it
    x[:] = me()
    v = x[2:5]
    n_live = len(symmetric.LIVE)
    del x
    gc.collect()
    assert symmetric_memory.is_symmetric(v) and (v == me()).all()  # the view keeps it
    dist.all_reduce(v)
    assert (v == sum(range(dist.get_world_size()))).all()
    del v
    gc.collect()
    assert len(symmetric.LIVE) == n_live - 1
    assert not symmetric_memory.is_symmetric(np.zeros(4))


def test_with_shared_memory_off_the_arrays_are_ordinary(spy):
    with knobs_set({"HPCDIST_SHM": "0"}):
        g = dist.new_group()
        g.engine("cpu")
    x = symmetric_memory.empty(37, dtype=np.float64, group=g)
    x[:] = values(me(), 37, "float64")
    dist.all_reduce(x, group=g)
    check(x, sum(values(r, 37, "float64") for r in range(dist.get_world_size())), "float64")
    assert spy.get("all_reduce", 0) == 0
    dist.destroy_process_group(g)
