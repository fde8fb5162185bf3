"""The all_reduce lane: a blocking all_reduce of a small NumPy array after the first one of its dtype and op.

The first blocking ``all_reduce`` of a (dtype, op) on a group takes the general
path (adapter, op check, engine) and then asks the engine for its lane
(``Engine.host_all_reduce_lane``); later calls with a writable C-contiguous
NumPy array of that dtype, below the lane's size bound, skip straight to it.
These tests pin that the lane gives NumPy's answer, that it is really taken
(the adapter is not called), that every other call still takes the general
path with its checks, and that both wait modes have it. Each test makes its
own group, so its lanes start empty.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi_arrays import KINDS, need, torch

import hpcdist as dist
from hpcdist import ReduceOp
from hpcdist import collectives as coll
from hpcdist.debug import DebugLevel, get_debug_level, set_debug_level
from hpcdist.flight import END

N = 6

# dtype -> ops MPI computes on the array itself (the lanes); the reference reduces the stacked inputs
OPS = {
    "float64": ["SUM", "PRODUCT", "MIN", "MAX"],
    "float32": ["SUM", "MAX"],
    "int64": ["SUM", "MIN", "BAND", "BOR", "BXOR"],
    "int8": ["SUM", "MAX"],
    "uint16": ["BXOR", "SUM"],
    "complex128": ["SUM"],
    "bool": ["SUM", "PRODUCT"],
}
CASES = [(d, o) for d, ops in OPS.items() for o in ops]


def inputs(rank: int, dtype: str, salt: int) -> np.ndarray:
    i = np.arange(N)
    if dtype == "bool":
        return (i + rank + salt) % 3 == 0
    v = (i * 3 + rank * 5 + salt) % 7 + 1
    if dtype.startswith("complex"):
        return (v + 1j * ((i + rank) % 3)).astype(dtype)
    return v.astype(dtype)


def reference(opname: str, dtype: str, salt: int, n: int) -> np.ndarray:
    stack = np.stack([inputs(r, dtype, salt) for r in range(n)])
    if dtype == "bool":
        return (stack.any(0) if opname == "SUM" else stack.all(0)).astype(bool)
    ufunc = {
        "SUM": np.add,
        "PRODUCT": np.multiply,
        "MIN": np.minimum,
        "MAX": np.maximum,
        "BAND": np.bitwise_and,
        "BOR": np.bitwise_or,
        "BXOR": np.bitwise_xor,
    }[opname]
    return ufunc.reduce(stack, axis=0).astype(dtype)


def all_lanes(pg) -> list:
    """Every lane the group keeps, of every op and dtype."""
    return [lane for by_dtype in pg._lane_tables() for lane in by_dtype.values()]


@pytest.fixture(params=["default", "mpi-engine"])
def pg(request, monkeypatch):
    """A fresh group of every rank (no lanes yet), destroyed after the test: with the engine this run picks
    (shared memory at every size on an oversubscribed node, so no lane), and with MPI's engine alone
    (``HPCDIST_SHM=0``), whose lanes serve every size, so that they run at 3 and 4 ranks on 2 cores too."""
    if request.param == "mpi-engine":
        monkeypatch.setenv("HPCDIST_SHM", "0")  # read when the group builds its engine, at its first call
    g = dist.new_group()
    yield g
    if not g._destroyed:
        dist.destroy_process_group(g)


@pytest.fixture
def no_detail():
    """Lanes exist outside DETAIL mode (the mpi-3-detail stage runs everything in it: these tests skip there)."""
    if get_debug_level() == DebugLevel.DETAIL:
        pytest.skip("DETAIL mode checks every call, so no call takes a lane (test_detail_mode_* covers it)")


@pytest.fixture
def adapter_calls(monkeypatch):
    """Counts calls of the adapter by hpcdist.all_reduce (a lane call makes none)."""
    calls = []
    real = coll.adapt

    def counting(*args, **kwargs):
        calls.append(args[0])
        return real(*args, **kwargs)

    monkeypatch.setattr(coll, "adapt", counting)
    return calls


@pytest.mark.parametrize("kind", ["numpy", "torch"])
@pytest.mark.parametrize(("dtype", "opname"), CASES)
def test_repeated_calls_take_the_lane_and_agree_with_numpy(no_detail, pg, adapter_calls, dtype, opname, kind):
    n, rank = dist.get_world_size(), dist.get_rank()
    op = getattr(ReduceOp, opname)
    for salt in range(4):  # the first call learns the lane, the next three take it
        x = inputs(rank, dtype, salt)
        dist.all_reduce(as_kind(x, kind), op=op, group=pg)
        assert np.array_equal(x, reference(opname, dtype, salt, n)), (salt, x)
    (lane,) = all_lanes(pg)
    if pg.engine("cpu").fast_all_reduce_below == 0:  # HPCDIST_SHM=1: every all_reduce is the engine's own
        assert lane[2] == 0 and len(adapter_calls) == 4
        return
    assert len(adapter_calls) == 1, "only the first call goes through the adapter"
    assert lane[1] == dtype and lane[2] > N * np.dtype(dtype).itemsize


@pytest.mark.parametrize(
    ("call", "dtype", "opname"),
    [
        *[
            (c, d, o)
            for c in ("all_reduce", "reduce")
            for d, o in [("float16", "SUM"), ("float64", "AVG"), ("int32", "AVG")]
        ],
        ("all_reduce", "float16", "MAX"),  # half floats' MIN/MAX: on ordered keys (tests/mpi/test_minmax.py)
        ("reduce", "float64", "MIN"),  # reduce's MIN/MAX of floats: on ordered keys
    ],
)
def test_ops_mpi_cannot_compute_alone_have_no_lane_and_stay_exact(no_detail, pg, adapter_calls, dtype, opname, call):
    n, rank = dist.get_world_size(), dist.get_rank()
    op = getattr(ReduceOp, opname)
    for salt in range(3):
        x = inputs(rank, dtype, salt)
        if call == "all_reduce":
            dist.all_reduce(x, op=op, group=pg)
        else:
            dist.reduce(x, dst=n - 1, op=op, group=pg)
        stack = np.stack([inputs(r, dtype, salt) for r in range(n)]).astype(np.float64)
        want = {"SUM": stack.sum(0), "AVG": stack.sum(0) / n, "MAX": stack.max(0), "MIN": stack.min(0)}[opname]
        if dtype == "int32":
            want = stack.sum(0).astype(np.int64) // n  # inputs are positive: truncation is floor
        if call == "all_reduce" or rank == n - 1:  # (reduce: the result is the root's)
            assert np.array_equal(x, want.astype(dtype)), (salt, x, want)
    assert len(adapter_calls) == 3, "every call goes through the general path"
    assert all(lane[2] == 0 for lane in all_lanes(pg))


def test_the_general_path_serves_what_the_lane_must_not_take(no_detail, pg, adapter_calls):
    n, rank = dist.get_world_size(), dist.get_rank()
    dist.all_reduce(inputs(rank, "float64", 0), group=pg)  # learn the lane
    (lane,) = all_lanes(pg)
    if lane[2] == 0:
        pytest.skip(
            "this group's engine has no lane (shared memory at every size: HPCDIST_SHM=1 or an oversubscribed node)"
        )
    # a strided view: not C-contiguous
    base = np.zeros(2 * N)
    base[::2] = inputs(rank, "float64", 1)
    dist.all_reduce(base[::2], group=pg)
    assert np.array_equal(base[::2], reference("SUM", "float64", 1, n)) and not base[1::2].any()
    # a read-only array: the argument error of the general path, raised before any message moves
    ro = inputs(rank, "float64", 2)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        dist.all_reduce(ro, group=pg)
    # an array as large as the lane's bound (the shared-memory engine's range on a node) and an async call
    if lane[2] < 64 << 20:
        big = np.full(lane[2] // 8, float(rank + 1))
        dist.all_reduce(big, group=pg)
        assert np.all(big == n * (n + 1) / 2)
    work = dist.all_reduce(x := inputs(rank, "float64", 3), group=pg, async_op=True)
    work.wait()
    assert np.array_equal(x, reference("SUM", "float64", 3, n))
    assert len(adapter_calls) == (5 if lane[2] < 64 << 20 else 4)


def test_detail_mode_checks_every_call_so_it_takes_no_lane(pg, adapter_calls):
    before = get_debug_level()
    rank, n = dist.get_rank(), dist.get_world_size()
    dist.all_reduce(inputs(rank, "float64", 0), group=pg)
    set_debug_level(DebugLevel.DETAIL)
    try:
        x = inputs(rank, "float64", 1)
        dist.all_reduce(x, group=pg)
        assert np.array_equal(x, reference("SUM", "float64", 1, n))
    finally:
        set_debug_level(before)
    dist.all_reduce(inputs(rank, "float64", 2), group=pg)
    lanes = before != DebugLevel.DETAIL and pg.engine("cpu").fast_all_reduce_below > 0  # else every call adapts
    assert len(adapter_calls) == (2 if lanes else 3)  # the first call and the DETAIL one


def test_lane_calls_are_recorded_by_the_flight_recorder(no_detail, pg):
    ring = pg._flight
    if ring is None:
        pytest.skip("the flight recorder is off (HPCDIST_FLIGHT_RECORDER=0)")
    rank = dist.get_rank()
    for salt in range(3):
        dist.all_reduce(inputs(rank, "int64", salt), group=pg)
    entries = [e for e in ring.colls if e is not None]
    assert [e[1:5] for e in entries] == [["all_reduce", "int64", N, -1]] * 3
    assert all(e[END] is True for e in entries)


def test_destroying_a_group_drops_its_lanes(no_detail, pg):
    dist.all_reduce(np.ones(3), group=pg)
    assert all_lanes(pg)
    dist.destroy_process_group(pg)
    assert not all_lanes(pg)
    with pytest.raises(ValueError, match="destroyed"):
        dist.all_reduce(np.ones(3), group=pg)


def test_an_engine_with_its_own_path_for_large_arrays_bounds_its_lane(pg, monkeypatch):
    from hpcdist.backends.hierarchical import HierarchicalEngine
    from hpcdist.ops import resolve_op

    rop = resolve_op(ReduceOp.SUM, "float64")
    eng = pg.engine("cpu")
    windows = getattr(eng, "windows", None)  # the shared-memory engine: its all_reduce range starts the lane's end
    bound = (windows["all_reduce"][0] if windows else 1 << 62) or None
    got = eng.host_all_reduce_lane("float64", rop)
    assert (got and got[0]) == bound
    monkeypatch.setenv("HPCDIST_HIER_MIN_BYTES", "4096")
    assert HierarchicalEngine(pg).host_all_reduce_lane("float64", rop)[0] == 4096
    monkeypatch.setenv("HPCDIST_HIER", "1")  # hierarchical at every size: no lane at all
    assert HierarchicalEngine(pg).host_all_reduce_lane("float64", rop) is None


def test_no_hierarchical_engine_where_no_node_holds_two_ranks(monkeypatch):
    """One rank per node, or one node: nothing for node steps to gain; a node of 2+ ranks beside another: hierarchical."""
    from hpcdist._world import WORLD
    from hpcdist.backends.hierarchical import spans_nodes

    n = dist.get_world_size()
    pg = dist.group.WORLD
    monkeypatch.setattr(WORLD, "node_of", list(range(n)))  # every rank a node of its own
    assert not spans_nodes(pg)
    monkeypatch.setattr(WORLD, "node_of", [0] * n)  # all on one node
    assert not spans_nodes(pg)
    if n >= 3:
        monkeypatch.setattr(WORLD, "node_of", [0] * (n - 1) + [1])
        assert spans_nodes(pg)


# ------------------------------------------------------------------ broadcast, all_gather_into_tensor, barrier
# The same mechanism (collectives._learn, Engine.host_lane / host_barrier_lane): the first blocking call on a
# group takes the general path, later ones on plain NumPy arrays that pass the per-array checks take the lane.

MOVE_DTYPES = ["float64", "float32", "int64", "int8", "uint16", "complex128", "bool", "float16"]


def as_kind(arr: np.ndarray, kind: str):
    """``arr`` as a NumPy array or as a torch CPU tensor sharing its memory (CPU tensors take the same lanes,
    through a NumPy view of their memory; skips without torch)."""
    need(kind)
    return arr if kind == "numpy" else torch.from_numpy(arr)


def lane_of(pg, op: str, dtype: str):
    """The group's lane of ``op`` (broadcast, all_gather_into_tensor) for ``dtype`` (None: not learned)."""
    lanes = {"broadcast": pg._bcast_lanes, "all_gather_into_tensor": pg._gather_lanes}[op]
    return lanes.get(id(np.dtype(dtype)))


def lane_taken(pg, op: str, dtype: str, nbytes: int) -> bool:
    """Whether a call of ``op`` on ``nbytes`` (the broadcast array, the gathered output) is the lane's."""
    lane = lane_of(pg, op, dtype)
    assert lane is not None, f"no {op} lane was learned for {dtype}"
    return nbytes < lane[2]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_repeated_broadcasts_take_the_lane_and_deliver_the_roots_array(no_detail, pg, adapter_calls, dtype, kind):
    n, rank = dist.get_world_size(), dist.get_rank()
    calls = 0
    for salt, root in enumerate([0, n - 1, n // 2, 0]):  # the first call learns the lane
        x = inputs(rank, dtype, salt)
        assert dist.broadcast(as_kind(x, kind), src=root, group=pg) is None
        assert np.array_equal(x, inputs(root, dtype, salt)), (salt, root, x)
        calls += 1
    taken = lane_taken(pg, "broadcast", dtype, N * np.dtype(dtype).itemsize)
    assert lane_of(pg, "broadcast", dtype)[1] == dtype
    # HPCDIST_SHM=1, or an oversubscribed node: shared memory from 0 bytes, so the lane's bound is 0
    assert len(adapter_calls) == (1 if taken else calls)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_repeated_all_gathers_take_the_lane_and_agree_with_numpy(no_detail, pg, adapter_calls, dtype, kind):
    n, rank = dist.get_world_size(), dist.get_rank()
    for salt in range(4):
        out = np.zeros(n * N, dtype)
        assert (
            dist.all_gather_into_tensor(as_kind(out, kind), as_kind(inputs(rank, dtype, salt), kind), group=pg) is None
        )
        want = np.concatenate([inputs(r, dtype, salt) for r in range(n)])
        assert np.array_equal(out, want), (salt, out)
    taken = lane_taken(pg, "all_gather_into_tensor", dtype, n * N * np.dtype(dtype).itemsize)
    assert len(adapter_calls) == (2 if taken else 8)  # the general path adapts the output and the input


RS_CASES = [("float64", "SUM"), ("int32", "MAX"), ("int64", "BXOR"), ("int8", "SUM"), ("bool", "PRODUCT")]


def rs_input(rank: int, dtype: str, salt: int, n: int) -> np.ndarray:
    """This rank's reduce_scatter input: ``n`` chunks of ``N``."""
    return np.concatenate([inputs(rank, dtype, salt + 7 * chunk) for chunk in range(n)])


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("dtype", "opname"), RS_CASES)
def test_repeated_reduce_scatters_take_the_lane_and_agree_with_numpy(no_detail, pg, adapter_calls, dtype, opname, kind):
    n, rank = dist.get_world_size(), dist.get_rank()
    op = getattr(ReduceOp, opname)
    for salt in range(4):
        out = np.zeros(N, dtype)
        assert (
            dist.reduce_scatter_tensor(
                as_kind(out, kind), as_kind(rs_input(rank, dtype, salt, n), kind), op=op, group=pg
            )
            is None
        )
        stack = np.stack([rs_input(r, dtype, salt, n) for r in range(n)])[:, rank * N : (rank + 1) * N]
        if dtype == "bool":
            want = stack.all(0)
        else:
            ufunc = {"SUM": np.add, "MAX": np.maximum, "BXOR": np.bitwise_xor}[opname]
            want = ufunc.reduce(stack, axis=0).astype(dtype)
        assert np.array_equal(out, want), (salt, out, want)
    lane = pg._rs_lanes[op][id(np.dtype(dtype))]
    taken = n * N * np.dtype(dtype).itemsize < lane[2]
    assert len(adapter_calls) == (2 if taken else 8)


@pytest.mark.parametrize(
    ("dtype", "opname"), [("float16", "SUM"), ("float64", "AVG"), ("int32", "AVG"), ("float32", "MAX")]
)
def test_reduce_scatters_mpi_cannot_compute_alone_have_no_lane_and_stay_exact(
    no_detail, pg, adapter_calls, dtype, opname
):
    n, rank = dist.get_world_size(), dist.get_rank()
    op = getattr(ReduceOp, opname)
    for salt in range(3):
        out = np.zeros(N, dtype)
        dist.reduce_scatter_tensor(out, rs_input(rank, dtype, salt, n), op=op, group=pg)
        stack = np.stack([rs_input(r, dtype, salt, n) for r in range(n)]).astype(np.float64)
        total = stack.sum(0)[rank * N : (rank + 1) * N]
        want = total if opname == "SUM" else (total.astype(np.int64) // n if dtype == "int32" else total / n)
        if opname == "MAX":  # floats: on ordered keys (a NaN wins: tests/mpi/test_minmax.py)
            want = stack.max(0)[rank * N : (rank + 1) * N]
        assert np.array_equal(out, want.astype(dtype)), (salt, out, want)
    assert len(adapter_calls) == 6, "every call goes through the general path"
    assert not pg._rs_lanes.get(op)


def test_the_general_path_serves_the_reduce_scatters_the_lane_must_not_take(no_detail, pg, adapter_calls):
    """The in-place form (the output is this rank's chunk of the input), views, overlapping tensors, bad sizes."""
    n, rank = dist.get_world_size(), dist.get_rank()
    want = np.stack([rs_input(r, "float64", 0, n) for r in range(n)]).sum(0)[rank * N : (rank + 1) * N]
    dist.reduce_scatter_tensor(np.zeros(N), rs_input(rank, "float64", 0, n), group=pg)  # learn the lane
    learned = len(adapter_calls)
    inp = rs_input(rank, "float64", 0, n)
    dist.reduce_scatter_tensor(inp[rank * N : (rank + 1) * N], inp, group=pg)  # FSDP's in-place form
    assert np.array_equal(inp[rank * N : (rank + 1) * N], want)
    rows = rs_input(rank, "float64", 0, n).reshape(n, N)  # an input that is a view (reshape)
    out = np.zeros(N)
    dist.reduce_scatter_tensor(out, rows.reshape(-1), group=pg)
    assert np.array_equal(out, want)
    with pytest.raises(ValueError, match="input must have group size"):
        dist.reduce_scatter_tensor(np.zeros(N), np.zeros(n * N + 1), group=pg)
    calls = 2 * 3
    if torch is not None:
        t = torch.from_numpy(rs_input(rank, "float64", 0, n))
        dist.reduce_scatter_tensor(t[rank * N : (rank + 1) * N], t, group=pg)  # tensors whose memory overlaps
        assert np.array_equal(t[rank * N : (rank + 1) * N].numpy(), want)
        calls += 2
    assert len(adapter_calls) - learned == calls


REDUCE_CASES = [*RS_CASES, ("float64", "PRODUCT"), ("uint16", "BOR"), ("complex128", "SUM")]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("dtype", "opname"), REDUCE_CASES)
def test_repeated_reduces_take_the_lane_and_leave_the_result_on_the_root_alone(
    no_detail, pg, adapter_calls, dtype, opname, kind
):
    n, rank = dist.get_world_size(), dist.get_rank()
    op = getattr(ReduceOp, opname)
    for salt, root in enumerate([0, n - 1, n // 2, 0]):  # the first call learns the lane
        x = inputs(rank, dtype, salt)
        assert dist.reduce(as_kind(x, kind), dst=root, op=op, group=pg) is None
        want = reference(opname, dtype, salt, n) if rank == root else inputs(rank, dtype, salt)
        assert np.array_equal(x, want), (salt, root, x, want)  # a non-root's input is left as it was
    lane = pg._reduce_lanes[op][id(np.dtype(dtype))]
    assert lane[1] == dtype
    taken = N * np.dtype(dtype).itemsize < lane[2]  # (shared memory from 0 bytes: no lane)
    assert len(adapter_calls) == (1 if taken else 4)


def test_the_general_path_serves_the_reduces_the_lane_must_not_take(no_detail, pg, adapter_calls):
    """Read-only and strided arrays, a read-only root (its argument error), a number for an op: not the lane."""
    n, rank = dist.get_world_size(), dist.get_rank()
    want = reference("SUM", "float64", 0, n)
    dist.reduce(inputs(rank, "float64", 0), dst=0, group=pg)  # learn the lane
    learned = len(adapter_calls)
    ro = inputs(rank, "float64", 0)
    ro.flags.writeable = False
    if rank != 0:  # a non-root only sends: a read-only input is fine, on the general path
        dist.reduce(ro, dst=0, group=pg)
    else:  # while the root takes the lane: one MPI call either way
        x = inputs(rank, "float64", 0)
        dist.reduce(x, dst=0, group=pg)
        assert np.array_equal(x, want)
    strided = np.zeros(2 * N)[::2]  # not contiguous: reduced through a copy, written back on the root
    strided[:] = inputs(rank, "float64", 0)
    dist.reduce(strided, dst=n - 1, group=pg)
    assert np.array_equal(strided, want if rank == n - 1 else inputs(rank, "float64", 0))
    if rank == 0:  # the root writes: a read-only output is the general path's argument error, before any message
        with pytest.raises(ValueError, match="read-only"):
            dist.reduce(ro, dst=0, group=pg)
    with pytest.raises(TypeError, match="op must be a ReduceOp"):
        dist.reduce(inputs(rank, "float64", 0), dst=0, op="broadcast", group=pg)
    taken = pg._reduce_sum_lanes[id(np.dtype("float64"))][2] > N * 8
    assert len(adapter_calls) - learned == 3 + (rank == 0 and not taken)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_repeated_list_all_gathers_take_the_lane_and_agree_with_numpy(no_detail, pg, adapter_calls, dtype, kind):
    n, rank = dist.get_world_size(), dist.get_rank()
    for salt in range(4):  # the first call learns the lane
        outs = [np.zeros(N, dtype) for _ in range(n)]
        assert (
            dist.all_gather([as_kind(o, kind) for o in outs], as_kind(inputs(rank, dtype, salt), kind), group=pg)
            is None
        )
        for r, o in enumerate(outs):
            assert np.array_equal(o, inputs(r, dtype, salt)), (salt, r, o)
    lane = pg._ag_list_lanes[id(np.dtype(dtype))]
    assert lane[1] == dtype
    taken = n * N * np.dtype(dtype).itemsize < lane[2]
    assert len(adapter_calls) == (1 if taken else 4)  # the general path adapts the input (and the list apart)


def test_the_general_path_serves_the_list_all_gathers_the_lane_must_not_take(no_detail, pg, adapter_calls):
    """Uneven sizes, strided or read-only outputs, a short list, mixed dtypes: the general path, its results
    or its argument errors; outputs that overlap each other or the input take the lane, with the general
    path's results (rank order: the last slot written wins)."""
    n, rank = dist.get_world_size(), dist.get_rank()
    dist.all_gather([np.zeros(N) for _ in range(n)], inputs(rank, "float64", 0), group=pg)  # learn the lane
    learned = len(adapter_calls)
    uneven = [np.zeros(r + 1) for r in range(n)]  # rank r gives r + 1 elements (MPI_Allgatherv)
    dist.all_gather(uneven, inputs(rank, "float64", 0)[: rank + 1].copy(), group=pg)
    assert all(np.array_equal(u, inputs(r, "float64", 0)[: r + 1]) for r, u in enumerate(uneven)), uneven
    wide = np.zeros((n, 2 * N))  # strided outputs: each column pair's first half, written back
    dist.all_gather([row[::2] for row in wide], inputs(rank, "float64", 0), group=pg)
    assert all(np.array_equal(wide[r, ::2], inputs(r, "float64", 0)) for r in range(n)), wide
    ro = np.zeros(N)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        dist.all_gather([np.zeros(N) for _ in range(n - 1)] + [ro], inputs(rank, "float64", 0), group=pg)
    with pytest.raises(ValueError, match="tensor_list"):
        dist.all_gather([np.zeros(N) for _ in range(n + 1)], inputs(rank, "float64", 0), group=pg)
    with pytest.raises(TypeError, match="dtype"):
        dist.all_gather([np.zeros(N, np.float32) for _ in range(n)], inputs(rank, "float64", 0), group=pg)
    # one array in every slot, and the input in this rank's slot: the lane (each slot copied from the gathered
    # array in rank order), with the general path's answer
    same = np.zeros(N)
    dist.all_gather([same] * n, inputs(rank, "float64", 0), group=pg)
    assert np.array_equal(same, inputs(n - 1, "float64", 0))
    x = inputs(rank, "float64", 1)
    slots = [np.zeros(N) for _ in range(n)]
    slots[rank] = x
    dist.all_gather(slots, x, group=pg)
    assert all(np.array_equal(s, inputs(r, "float64", 1)) for r, s in enumerate(slots))
    taken = n * N * 8 < pg._ag_list_lanes[id(np.dtype("float64"))][2]
    # the general path adapts the input once (the list apart): the uneven call (even at one rank), the strided
    # one and the three refused; the last two calls take the lane
    assert len(adapter_calls) - learned == ((n > 1) + 4 if taken else 7)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_repeated_gathers_and_scatters_take_their_lanes_and_agree_with_numpy(no_detail, pg, adapter_calls, dtype, kind):
    n, rank = dist.get_world_size(), dist.get_rank()
    for salt, root in enumerate([0, n - 1, n // 2, 0]):  # the first call of each learns its lane
        outs = [np.zeros(N, dtype) for _ in range(n)] if rank == root else None
        dist.gather(as_kind(inputs(rank, dtype, salt), kind), outs and [as_kind(o, kind) for o in outs], root, pg)
        if outs is not None:
            assert all(np.array_equal(o, inputs(r, dtype, salt)) for r, o in enumerate(outs)), (salt, root, outs)
        x = np.zeros(N, dtype)
        parts = [as_kind(inputs(r, dtype, salt + 1), kind) for r in range(n)] if rank == root else None
        dist.scatter(as_kind(x, kind), parts, root, pg)
        assert np.array_equal(x, inputs(rank, dtype, salt + 1)), (salt, root, x)
    for table in (pg._gather_root_lanes, pg._scatter_lanes):
        lane = table[id(np.dtype(dtype))]
        assert lane[1] == dtype
    taken = n * N * np.dtype(dtype).itemsize < lane[2]
    assert len(adapter_calls) == (2 if taken else 8)  # the general path adapts the array (the list apart)


def test_the_general_path_serves_the_gathers_and_scatters_the_lanes_must_not_take(no_detail, pg, adapter_calls):
    """Uneven parts (MPI's Gatherv and Scatterv either way: a root on the general path meets ranks on the lane),
    strided arrays, lists where none belong; a root's entry that is its own array takes the lane."""
    n, rank = dist.get_world_size(), dist.get_rank()
    root = n - 1
    mine = rank == root
    dist.gather(inputs(rank, "float64", 0), [np.zeros(N) for _ in range(n)] if mine else None, root, pg)
    dist.scatter(np.zeros(N), [np.ones(N) for _ in range(n)] if mine else None, root, pg)  # learn the lanes
    learned = len(adapter_calls)
    uneven = [np.zeros(r + 1) for r in range(n)] if mine else None  # rank r gives r + 1 elements
    dist.gather(inputs(rank, "float64", 0)[: rank + 1].copy(), uneven, root, pg)
    if uneven is not None:
        assert all(np.array_equal(u, inputs(r, "float64", 0)[: r + 1]) for r, u in enumerate(uneven)), uneven
    got = np.zeros(rank + 1)
    dist.scatter(got, [inputs(r, "float64", 2)[: r + 1].copy() for r in range(n)] if mine else None, root, pg)
    assert np.array_equal(got, inputs(rank, "float64", 2)[: rank + 1])
    strided = np.zeros(2 * N)[::2]  # received through a copy, written back
    dist.scatter(strided, [inputs(r, "float64", 3) for r in range(n)] if mine else None, root, pg)
    assert np.array_equal(strided, inputs(rank, "float64", 3))
    with pytest.raises(ValueError, match="gather_list"):  # every rank refuses its list: a root's too long one
        dist.gather(np.zeros(N), [np.zeros(N) for _ in range(n + 1)], root, pg)
    with pytest.raises(ValueError, match="scatter_list"):
        dist.scatter(np.zeros(N), [np.zeros(N) for _ in range(n + 1)], root, pg)
    x = inputs(rank, "float64", 4)
    outs = [np.zeros(N) for _ in range(n)]
    outs[root] = x  # the root's own input is its entry of the list: the lane, gathering into a new array
    dist.gather(x, outs if mine else None, root, pg)
    if mine:
        assert all(np.array_equal(o, inputs(r, "float64", 4)) for r, o in enumerate(outs)), outs
    taken = n * N * 8 < pg._gather_root_lanes[id(np.dtype("float64"))][2]
    general = 2 * (mine and n > 1) + 1 + 2  # the uneven root (one rank: even), the strided, the two refused
    assert len(adapter_calls) - learned == (general if taken else 6)


def a2a_input(rank: int, dtype: str, salt: int, n: int) -> np.ndarray:
    """This rank's all_to_all_single input: ``n`` blocks of 2 rows of 3, block ``j`` for rank ``j`` (an array that
    owns its memory, as a lane needs: a reshaped array is a view)."""
    return np.concatenate([inputs(rank, dtype, salt + 7 * j) for j in range(n)]).reshape(2 * n, 3).copy()


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", MOVE_DTYPES)
def test_repeated_all_to_alls_take_the_lane_and_agree_with_numpy(no_detail, pg, adapter_calls, dtype, kind):
    n, rank = dist.get_world_size(), dist.get_rank()
    for salt in range(4):  # the first call learns the lane
        out = np.zeros((2 * n, 3), dtype)
        assert (
            dist.all_to_all_single(as_kind(out, kind), as_kind(a2a_input(rank, dtype, salt, n), kind), group=pg) is None
        )
        want = np.concatenate([a2a_input(r, dtype, salt, n)[2 * rank : 2 * rank + 2] for r in range(n)])
        assert np.array_equal(out, want), (salt, out, want)
    lane = pg._a2a_lanes[id(np.dtype(dtype))]
    assert lane[1] == dtype
    taken = out.nbytes < lane[2]
    assert len(adapter_calls) == (2 if taken else 8)  # the general path adapts the output and the input


def test_the_general_path_serves_the_all_to_alls_the_lane_must_not_take(no_detail, pg, adapter_calls):
    """Split sizes given (even or not), views, one array as input and output, rows that do not split evenly."""
    n, rank = dist.get_world_size(), dist.get_rank()
    want = np.concatenate([a2a_input(r, "float64", 0, n)[2 * rank : 2 * rank + 2] for r in range(n)])
    dist.all_to_all_single(np.zeros((2 * n, 3)), a2a_input(rank, "float64", 0, n), group=pg)  # learn the lane
    learned = len(adapter_calls)
    out = np.zeros((2 * n, 3))
    dist.all_to_all_single(out, a2a_input(rank, "float64", 0, n), [2] * n, [2] * n, group=pg)  # even, but given
    assert np.array_equal(out, want)
    x = a2a_input(rank, "float64", 0, n)  # one array as input and output (sent from a copy)
    dist.all_to_all_single(x, x, group=pg)
    assert np.array_equal(x, want)
    flat = np.zeros(2 * n * 3 + 1)  # a view that does not own its memory
    dist.all_to_all_single(flat[1:], a2a_input(rank, "float64", 0, n).reshape(-1), group=pg)
    assert np.array_equal(flat[1:], want.reshape(-1))
    calls = 2 * 3
    if n > 1:  # 2n + 1 rows do not split into n even blocks: the general path's argument error
        with pytest.raises(ValueError, match="input_split_sizes"):
            dist.all_to_all_single(np.zeros((2 * n + 1, 3)), np.zeros((2 * n + 1, 3)), group=pg)
        calls += 2
    assert len(adapter_calls) - learned == calls


def test_the_general_path_serves_the_gathers_the_lane_must_not_take(no_detail, pg, adapter_calls):
    """Views (which may share memory), in-place slots, overlapping inputs, other dtypes and sizes: not the lane."""
    n, rank = dist.get_world_size(), dist.get_rank()
    want = np.concatenate([inputs(r, "float64", 0) for r in range(n)])
    dist.all_gather_into_tensor(np.zeros(n * N), inputs(rank, "float64", 0), group=pg)  # learn the lane
    learned = len(adapter_calls)
    # the in-place form: the input is this rank's slot of the output (a view)
    out = np.zeros(n * N)
    out[rank * N : (rank + 1) * N] = inputs(rank, "float64", 0)
    dist.all_gather_into_tensor(out, out[rank * N : (rank + 1) * N], group=pg)
    assert np.array_equal(out, want)
    # an input overlapping the output, not as its slot (sent from a copy)
    big = np.zeros(n * N + 1)
    big[1 : N + 1] = inputs(rank, "float64", 0)
    dist.all_gather_into_tensor(big[: n * N], big[1 : N + 1], group=pg)
    assert np.array_equal(big[: n * N], want)
    # an output that is a reshaped view of a 2-D array (rows per rank)
    rows = np.zeros((n, N))
    dist.all_gather_into_tensor(rows.reshape(-1), inputs(rank, "float64", 0), group=pg)
    assert np.array_equal(rows.reshape(-1), want)
    # a read-only output: the general path's argument error, before any message moves
    ro = np.zeros(n * N)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        dist.all_gather_into_tensor(ro, inputs(rank, "float64", 0), group=pg)
    # a wrong output size: the general path's error too
    with pytest.raises(ValueError, match="output_tensor must have group size"):
        dist.all_gather_into_tensor(np.zeros(n * N + 1), inputs(rank, "float64", 0), group=pg)
    # a dtype mismatch between the arrays
    with pytest.raises(TypeError, match="dtype"):
        dist.all_gather_into_tensor(np.zeros(n * N), inputs(rank, "float32", 0), group=pg)
    assert len(adapter_calls) - learned == 2 * 6


def test_lane_calls_are_recorded_as_the_general_path_records_them(no_detail, pg):
    """The flight recorder's entry of a lane call is the general path's (op, dtype, count, root), completed."""
    ring = pg._flight
    if ring is None:
        pytest.skip("the flight recorder is off (HPCDIST_FLIGHT_RECORDER=0)")
    n, rank = dist.get_world_size(), dist.get_rank()
    for _ in range(3):  # the first of each is the general path's
        dist.broadcast(inputs(rank, "int64", 0), src=n - 1, group=pg)
    for _ in range(3):
        dist.all_gather_into_tensor(np.zeros(n * N, np.int32), inputs(rank, "int32", 0), group=pg)
    for _ in range(3):
        dist.barrier(group=pg)
    for _ in range(3):
        dist.reduce_scatter_tensor(np.zeros(N), np.ones(n * N), group=pg)
    for _ in range(3):
        dist.reduce(inputs(rank, "uint16", 0), dst=n // 2, op=ReduceOp.MAX, group=pg)
    for _ in range(3):
        dist.all_to_all_single(np.zeros((2 * n, 3), np.int8), a2a_input(rank, "int8", 0, n), group=pg)
    for _ in range(3):
        dist.all_gather([np.zeros(N, np.complex64) for _ in range(n)], inputs(rank, "complex64", 0), group=pg)
    for _ in range(3):
        dist.gather(inputs(rank, "int16", 0), [np.zeros(N, np.int16) for _ in range(n)] if rank == 0 else None, 0, pg)
    for _ in range(3):
        dist.scatter(np.zeros(N, np.uint8), [np.ones(N, np.uint8)] * n if rank == n - 1 else None, n - 1, pg)
    entries = [e for e in ring.colls if e is not None]
    got = [e[1:5] for e in entries]
    assert len(got) == 27 and got == [g for g in got[::3] for _ in range(3)], got
    assert got[0] == ["broadcast", "int64", N, n - 1] and got[3] == ["all_gather_into", "int32", N, -1]
    assert got[6] == ["barrier", None, 0, -1] and got[9] == ["reduce_scatter_tensor", "float64", N, -1]
    assert got[12] == ["reduce", "uint16", N, n // 2] and got[15] == ["all_to_all_single", "int8", 6 * n, -1]
    assert got[18] == ["all_gather", "complex64", N, -1] and got[21] == ["gather", "int16", N, 0]
    assert got[24] == ["scatter", "uint8", N, n - 1]
    assert all(e[END] is True for e in entries)


def test_the_barrier_lane_is_learned_and_still_waits_for_every_rank(no_detail, pg, monkeypatch):
    import time

    rank = dist.get_rank()
    dist.barrier(group=pg)  # the general path, which learns the engine's blocking barrier
    lane = pg._barrier_lane
    if not lane:  # the shared-memory engine's barrier path (HPCDIST_SHM=1, an oversubscribed node): no lane
        assert pg.engine("cpu").path("barrier", 0) == "shm"
        return
    asked = []
    monkeypatch.setattr(pg, "barrier_engine", lambda: asked.append(1) or pytest.fail("the lane was not taken"))
    for _ in range(3):
        if rank == 0:
            time.sleep(0.3)
        t0 = time.monotonic()
        dist.barrier(group=pg)
        waited = time.monotonic() - t0
        if rank != 0:  # a barrier that did not wait for rank 0 returns in microseconds
            assert waited > 0.2, waited
    assert not asked


def test_detail_mode_takes_no_broadcast_or_gather_lane(pg, adapter_calls):
    before = get_debug_level()
    n, rank = dist.get_world_size(), dist.get_rank()
    dist.broadcast(inputs(rank, "float64", 0), src=0, group=pg)
    dist.all_gather_into_tensor(np.zeros(n * N), inputs(rank, "float64", 0), group=pg)
    first = len(adapter_calls)
    set_debug_level(DebugLevel.DETAIL)
    try:
        x = inputs(rank, "float64", 1)
        dist.broadcast(x, src=0, group=pg)
        out = np.zeros(n * N)
        dist.all_gather_into_tensor(out, inputs(rank, "float64", 1), group=pg)
    finally:
        set_debug_level(before)
    assert np.array_equal(x, inputs(0, "float64", 1))
    assert np.array_equal(out, np.concatenate([inputs(r, "float64", 1) for r in range(n)]))
    assert len(adapter_calls) - first == 3  # every DETAIL call is checked on the general path


def test_the_general_path_serves_the_tensors_the_lanes_must_not_take(no_detail, pg, adapter_calls):
    """Tensors torch gives no NumPy view of (grad, bfloat16), subclasses, strided tensors, overlapping gathers:
    the general path, with its results (or its argument errors)."""
    need("torch")
    n, rank = dist.get_world_size(), dist.get_rank()
    t = torch.from_numpy(inputs(rank, "float64", 0))
    dist.all_reduce(t.clone(), group=pg)
    dist.broadcast(t.clone(), src=0, group=pg)
    dist.all_gather_into_tensor(torch.zeros(n * N, dtype=torch.float64), t.clone(), group=pg)
    learned = len(adapter_calls)
    want_sum = torch.from_numpy(reference("SUM", "float64", 0, n))
    cases = []
    grad = t.clone().requires_grad_(True)  # a leaf that requires grad: written in place through a detached view
    dist.all_reduce(grad, group=pg)
    cases.append(torch.equal(grad.detach(), want_sum))
    param = torch.nn.Parameter(t.clone())  # a subclass: the general path
    dist.broadcast(param, src=n - 1, group=pg)
    cases.append(torch.equal(param.detach(), torch.from_numpy(inputs(n - 1, "float64", 0))))
    strided = torch.zeros(2 * N, dtype=torch.float64)[::2]  # not contiguous: a copy, written back
    strided.copy_(t)
    dist.all_reduce(strided, group=pg)
    cases.append(torch.equal(strided, want_sum))
    bf = t.to(torch.bfloat16)  # torch has no NumPy bfloat16: moved as uint16 by the adapter
    dist.broadcast(bf, src=0, group=pg)
    cases.append(torch.equal(bf, torch.from_numpy(inputs(0, "float64", 0)).to(torch.bfloat16)))
    out = torch.zeros(n * N, dtype=torch.float64)  # the in-place form: the input is this rank's slot
    out[rank * N : (rank + 1) * N] = t
    dist.all_gather_into_tensor(out, out[rank * N : (rank + 1) * N], group=pg)
    want = torch.from_numpy(np.concatenate([inputs(r, "float64", 0) for r in range(n)]))
    cases.append(torch.equal(out, want))
    big = torch.zeros(n * N + 1, dtype=torch.float64)  # an input overlapping the output, not as its slot
    big[1 : N + 1] = t
    dist.all_gather_into_tensor(big[: n * N], big[1 : N + 1], group=pg)
    cases.append(torch.equal(big[: n * N], want))
    assert cases == [True] * 6, cases
    assert len(adapter_calls) - learned == 1 + 1 + 1 + 1 + 2 + 2  # every one adapted: none took a lane
    assert {lane[1] for lane in all_lanes(pg)} == {"float64"}, "only calls on in-place views of their dtype teach lanes"


@pytest.mark.parametrize("op", ["broadcast", "all_gather_into_tensor", "reduce_scatter_tensor", "reduce"])
def test_an_op_that_is_no_reduce_op_gets_the_op_error_not_another_operations_lane(no_detail, pg, op):
    """The lanes of every operation are learned; an all_reduce or reduce_scatter_tensor op that happens to be
    another table's key (an operation's name) is refused by the op check, as on the general path."""
    n, rank = dist.get_world_size(), dist.get_rank()
    x = inputs(rank, "float64", 0)
    dist.broadcast(x, src=0, group=pg)
    dist.all_gather_into_tensor(np.zeros(n * N), inputs(rank, "float64", 0), group=pg)
    dist.reduce_scatter_tensor(np.zeros(N), np.ones(n * N), group=pg)
    dist.reduce(x, dst=0, group=pg)
    dist.all_reduce(x, group=pg)
    with pytest.raises(TypeError, match="op must be a ReduceOp"):
        dist.all_reduce(x, op=op, group=pg)
    with pytest.raises(TypeError, match="op must be a ReduceOp"):
        dist.reduce_scatter_tensor(np.zeros(N), np.ones(n * N), op=op, group=pg)
    with pytest.raises(TypeError, match="op must be a ReduceOp"):
        dist.reduce(x, dst=0, op=op, group=pg)
