"""Hierarchical collectives over pretend nodes: every HPCDIST_HIER_ALGO, every op and dtype, against NumPy.

The ranks of this job share one host; each case tells hpcdist that they lie
on two nodes (``WORLD.node_of``, which init computes from the host identity)
while the group's hierarchical engine, its node, leader and rail
communicators and the node groups' shared-memory engines are built — all
real MPI communicators and real segments. The simulated cluster
(tests/integration/test_cluster.py) runs the same paths across real
namespaces at 2 x 2 ranks; here they run at 3 and 4 ranks, with nodes of
equal and unequal sizes, contiguous and interleaved.

Rails (all_reduce: node reduce-scatter, one all-reduce per rail between the
nodes, node all-gather) where the nodes hold equal numbers of ranks and the
item count divides by it — for all_reduce and reduce_scatter_tensor with
``HPCDIST_HIER_ALGO=auto``, for all_gather_into_tensor too with ``rails``;
otherwise, and with ``leaders``, the leaders' path (node reduce, leaders'
all-reduce, node broadcast). References are NumPy (test_collectives' ``_ref``); bitwise equality
across ranks is checked over raw MPI.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI
from mpi_arrays import cast, empty, make, need, to_np, values
from test_collectives import OPS, _applies, _ref
from test_minmax import contribution, equal, reference
from test_shm import knobs_set, same_bytes_everywhere

import hpcdist as dist
from hpcdist import ReduceOp
from hpcdist._world import WORLD
from hpcdist.backends.hierarchical import HierarchicalEngine

#: pretend layouts (node index of each world rank) by world size; one node must hold two or more ranks
LAYOUTS = {
    3: {"2+1": [0, 0, 1]},
    4: {"2+2": [0, 0, 1, 1], "interleaved": [0, 1, 0, 1], "3+1": [0, 0, 0, 1]},
}
ALGOS = ["auto", "rails", "leaders"]
SIZES = [1, 6, 7, 4099]  # divisible by 2 or not: both branches of rails
BIG = 1 << 16  # with SUM: many chunks of the node segments


def _layouts() -> dict[str, list[int]]:
    """This job's pretend layouts (the conftest initialised the world before the tests are collected)."""
    return LAYOUTS.get(dist.get_world_size(), {}) if dist.is_initialized() else {}


CASES = [(layout, algo) for layout in _layouts() for algo in ALGOS]
AR_CASES = [(layout, algo) for layout, algo in CASES if algo != "rails"]  # all_reduce: auto takes rails already
if not CASES:  # one skip with the reason, not one per test
    pytest.skip("pretend two-node layouts need 3 or 4 ranks", allow_module_level=True)


@pytest.fixture(scope="module")
def hier_groups():
    """(layout, algo) -> the world's ranks as a group with a hierarchical engine on that layout (collective).

    Every group is made on every rank in the same order; the engines, their topologies and node engines are
    built (by one all_reduce) while ``WORLD.node_of`` holds the pretend layout.
    """
    groups = {}
    real = WORLD.node_of
    try:
        for layout, node_of in _layouts().items():
            for algo in ALGOS:
                WORLD.node_of = list(node_of)
                with knobs_set({"HPCDIST_HIER": "1", "HPCDIST_HIER_ALGO": algo, "HPCDIST_SHM": "1"}):
                    g = dist.new_group()
                    assert isinstance(g.engine("cpu"), HierarchicalEngine)
                    dist.all_reduce(np.ones(8), group=g)  # the topology and the node engines, now
                groups[layout, algo] = g
    finally:
        WORLD.node_of = real
    yield groups
    for g in groups.values():
        dist.destroy_process_group(g)


def _node_rank(node_of: list[int], r: int) -> int:
    return [q for q in range(len(node_of)) if node_of[q] == node_of[r]].index(r)


@pytest.mark.parametrize(("layout", "algo"), CASES)
def test_the_topology_picks_rails_where_nodes_are_equal(hier_groups, layout, algo, monkeypatch):
    g = hier_groups[layout, algo]
    topo = g.engine("cpu")._topo
    node_of = LAYOUTS[dist.get_world_size()][layout]
    sizes = [node_of.count(j) for j in range(max(node_of) + 1)]
    me = dist.get_rank()
    assert topo.sizes == sizes
    assert topo.node_pg.size() == sizes[node_of[me]]
    rails = algo != "leaders" and len(set(sizes)) == 1
    assert (topo.rails != MPI.COMM_NULL) == rails
    if rails:  # one rank per node: those of this rank's node rank
        peers = topo.rails.allgather(me)
        assert [node_of[r] for r in peers] == list(range(len(sizes)))  # in node order
        assert {_node_rank(node_of, p) for p in peers} == {_node_rank(node_of, me)}
    # which node steps run: a reduce-scatter for rails (item count divisible by the ranks per node), else a reduce
    steps = topo.steps
    calls: list[str] = []

    def counted(name: str):
        real = getattr(steps, name)

        def call(*args, **kwargs):
            calls.append(name)
            return real(*args, **kwargs)

        return call

    for name in ("reduce_scatter_tensor", "reduce", "all_gather_into", "gather", "broadcast", "scatter"):
        monkeypatch.setattr(steps, name, counted(name))
    k = sizes[0]
    for size in (k * 5, k * 5 + 1):
        calls.clear()
        dist.all_reduce(np.ones(size), group=g)
        want = ["reduce_scatter_tensor", "all_gather_into"] if rails and size % k == 0 else ["reduce", "broadcast"]
        assert calls == want, (size, calls)
    calls.clear()
    n = dist.get_world_size()
    dist.all_gather_into_tensor(np.empty(3 * n), np.ones(3), group=g)
    gather_rails = rails and algo == "rails"  # auto: the leaders' path, measured faster for all_gather
    assert calls == (["all_gather_into"] if gather_rails else ["gather", "broadcast"]), calls
    calls.clear()
    dist.reduce_scatter_tensor(np.empty(3), np.ones(3 * n), group=g)
    assert calls == (["reduce_scatter_tensor"] if rails else ["reduce", "scatter"]), calls


# every op on float32, int64 and bfloat16 (torch); the reductions that convert or divide on the other floats
ALL_REDUCE = [(d, o) for d in ("float32", "int64", "bfloat16") for o in OPS if _applies(o, d)]
ALL_REDUCE += [(d, o) for d in ("float64", "float16") for o in ("SUM", "AVG", "PREMUL_SUM", "MAX")]


@pytest.mark.parametrize(("layout", "algo"), AR_CASES)
@pytest.mark.parametrize(("dtype", "opname"), ALL_REDUCE)
def test_all_reduce_every_op_dtype(hier_groups, layout, algo, dtype, opname):
    g = hier_groups[layout, algo]
    kind = "torch" if dtype == "bfloat16" else "numpy"
    need(kind, dtype)
    n = dist.get_world_size()
    op = ReduceOp.PREMUL_SUM(2.0) if opname == "PREMUL_SUM" else getattr(ReduceOp, opname)
    for size in [*SIZES, BIG] if opname == "SUM" else SIZES:
        x = make(kind, values(dist.get_rank(), size, dtype), dtype)
        dist.all_reduce(x, op=op, group=g)
        got = to_np(x).reshape(-1)
        stack = np.stack([values(r, size, dtype) for r in range(n)])
        want = cast(np.asarray(_ref(opname, stack, dtype, n)), dtype).reshape(-1)
        if dtype in ("float16", "bfloat16", "float32") and opname in ("SUM", "AVG", "PREMUL_SUM"):
            tol = {"float32": 1e-5, "float16": 1e-2, "bfloat16": 2e-2}[dtype]
            assert np.allclose(got.astype(np.float64), want.astype(np.float64), rtol=tol, atol=tol), (size, got[:4])
        else:
            assert np.array_equal(got, want), (size, got[:4], want[:4])
        same_bytes_everywhere(g, got)


@pytest.mark.parametrize(("layout", "algo"), CASES)
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("opname", ["MIN", "MAX"])
def test_min_max_with_nan_on_any_rank(hier_groups, layout, algo, dtype, opname):
    """A NaN on any rank gives NaN through every step of the node and between the nodes (test_minmax.py)."""
    g = hier_groups[layout, algo]
    kind = "torch" if dtype == "bfloat16" else "numpy"
    need(kind, dtype)
    n, me = dist.get_world_size(), dist.get_rank()
    op = getattr(ReduceOp, opname)
    for size in (6 * n, 6 * n + 1, 2400 * n):  # rails where the item count divides; both sides of the segments
        want = reference(opname, n, size)
        x = make(kind, contribution(me, n, size), dtype)
        dist.all_reduce(x, op=op, group=g)
        equal(x, cast(want, dtype))
        same_bytes_everywhere(g, to_np(x))
        if size % n == 0:
            out = make(kind, np.zeros(size // n), dtype)
            dist.reduce_scatter_tensor(out, make(kind, contribution(me, n, size), dtype), op=op, group=g)
            equal(out, cast(want, dtype).reshape(n, -1)[me])


@pytest.mark.parametrize(("layout", "algo"), CASES)
def test_all_reduce_in_place_on_a_view(hier_groups, layout, algo):
    """A strided view is reduced in place; the rest of its base is untouched."""
    g = hier_groups[layout, algo]
    n, me = dist.get_world_size(), dist.get_rank()
    base = values(me, 2 * 1002, "float64")
    keep = base[1::2].copy()
    view = base[0::2]
    dist.all_reduce(view, group=g)
    assert np.array_equal(view, sum(values(r, 2 * 1002, "float64")[0::2] for r in range(n)))
    assert np.array_equal(base[1::2], keep)


@pytest.mark.parametrize(("layout", "algo"), CASES)
@pytest.mark.parametrize("dtype", ["float32", "int64", "float16", "bfloat16", "bool", "complex128"])
def test_broadcast_all_gather_reduce_scatter(hier_groups, layout, algo, dtype):
    """Every root of broadcast; all_gather_into_tensor and reduce_scatter_tensor (on rails where the nodes are
    equal: rows back into rank order, each rank its own block) against NumPy, uneven and empty blocks."""
    g = hier_groups[layout, algo]
    kind = "torch" if dtype == "bfloat16" else "numpy"
    need(kind, dtype)
    n, me = dist.get_world_size(), dist.get_rank()
    for root in range(n):
        x = make(kind, values(me, 1001, dtype, salt=root), dtype)
        dist.broadcast(x, src=root, group=g)
        assert np.array_equal(to_np(x), cast(values(root, 1001, dtype, salt=root), dtype))
    for m in (0, 1, 999):
        out = empty(kind, (n * m,), dtype)
        dist.all_gather_into_tensor(out, make(kind, values(me, m, dtype, salt=7), dtype), group=g)
        want = np.concatenate([cast(values(r, m, dtype, salt=7), dtype) for r in range(n)])
        assert np.array_equal(to_np(out), want)
        if dtype == "bool":
            continue
        out = empty(kind, (m,), dtype)
        dist.reduce_scatter_tensor(out, make(kind, values(me, m * n, dtype, salt=8), dtype), group=g)
        stack = np.stack([values(r, m * n, dtype, salt=8) for r in range(n)])
        want = cast(np.asarray(_ref("SUM", stack, dtype, n)), dtype)[me * m : (me + 1) * m]
        assert np.array_equal(to_np(out), want), (m, to_np(out)[:4], want[:4])  # small integers: exact in any dtype


@pytest.mark.parametrize(("layout", "algo"), CASES)
def test_sizes_that_differ_across_nodes_are_caught_by_detail_mode(hier_groups, layout, algo):
    """The last rank (alone on its node in 2+1 and 3+1) passes half the items: no rank's hierarchical path can
    notice (each leader splits by its own count: wrong results everywhere, docs/sharp-bits.md), so DETAIL mode
    is what catches it — on every rank, before any data moves, and the group stays usable."""
    from hpcdist.debug import DebugLevel, get_debug_level, set_debug_level
    from hpcdist.errors import DistError

    g = hier_groups[layout, algo]
    n, me = dist.get_world_size(), dist.get_rank()
    before = get_debug_level()
    set_debug_level(DebugLevel.DETAIL)
    try:
        x = values(me, BIG // 2 if me == n - 1 else BIG, "float64")
        with pytest.raises(DistError, match=rf"collective mismatch.*global rank {n - 1}: all_reduce\(float64, SUM, "
                           rf"shape \({BIG // 2},\)\)"):  # fmt: skip
            dist.all_reduce(x, group=g)
    finally:
        set_debug_level(before)
    y = values(me, BIG, "float64")
    dist.all_reduce(y, group=g)
    assert np.array_equal(y, sum(values(r, BIG, "float64") for r in range(n)))


# -- asynchronous calls: the engine's thread --------------------------------------------------------------------------

THREADED = MPI.Query_thread() == MPI.THREAD_MULTIPLE  # the harness starts MPI at MPI_THREAD_MULTIPLE


def _started(work) -> str:
    """Where an async_op=True call went: "thread" (its Work waits on the engine's thread), "flat" (MPI requests)."""
    from hpcdist.backends.hierarchical import StepJob

    reqs = work._reqs
    return "thread" if len(reqs) == 1 and isinstance(reqs[0], StepJob) else "flat"


def vals(rank: int, size: int, dtype: str, salt: int = 0) -> np.ndarray:
    return values(rank, size, dtype, salt=salt).astype(dtype)


@pytest.mark.parametrize(("layout", "algo"), CASES)
@pytest.mark.parametrize("opname", ["SUM", "AVG", "MAX"])
def test_async_calls_run_hierarchically_in_program_order(hier_groups, layout, algo, opname):
    """Asynchronous all_reduce, broadcast, all_gather_into_tensor and reduce_scatter_tensor run their steps on the
    engine's thread, several in flight at once and a blocking call among them, while ranks mix ``async_op``
    (rank r passes it for the calls i with (i + r) odd): every result bitwise equal to the same call made
    blocking by every rank (the second path), and to NumPy where exact; the same bytes on every rank (but the
    reduce-scatter's blocks)."""
    g = hier_groups[layout, algo]
    n, me = dist.get_world_size(), dist.get_rank()
    op = getattr(ReduceOp, opname)
    size = 2400 * n + 1  # not divisible by the ranks per node: rails take the leaders' shape for all_reduce
    stack = np.stack([vals(r, size, "float32", salt=3) for r in range(n)])

    def calls(asyncs: list[bool]):
        a = vals(me, size, "float32", salt=3)
        b = vals(me, size, "float64", salt=4)
        out = np.empty(n * 999, np.float32)
        rs_in = vals(me, n * 999, "float64", salt=5)
        rs = np.empty(999, np.float64)
        c = vals(me, size, "float32", salt=6)
        works = [
            dist.all_reduce(a, op=op, group=g, async_op=asyncs[0]),
            dist.broadcast(b, src=n - 1, group=g, async_op=asyncs[1]),
            dist.all_gather_into_tensor(out, vals(me, 999, "float32", salt=7), group=g, async_op=asyncs[2]),
            dist.reduce_scatter_tensor(rs, rs_in, op=op, group=g, async_op=asyncs[3]),
            dist.all_reduce(c, group=g, async_op=asyncs[4]),
        ]
        return works, (a, b, out, rs, c)

    mixed = [(i + me) % 2 == 1 for i in range(5)]
    works, got = calls(mixed)
    went = [_started(w) for w in works if w is not None]
    assert went == ["thread" if THREADED else "flat"] * sum(mixed), went
    for w in reversed(works):  # in any order
        if w is not None:
            w.wait()
    _, want = calls([False] * 5)
    for i, (x, y) in enumerate(zip(got, want, strict=True)):
        assert x.tobytes() == y.tobytes(), i
        if i != 3:  # reduce_scatter_tensor: each rank its own block
            same_bytes_everywhere(g, x)
    if opname != "AVG":
        assert np.array_equal(got[0], cast(np.asarray(_ref(opname, stack, "float32", n)), "float32"))
    assert np.array_equal(got[1], vals(n - 1, size, "float64", salt=4))
    assert np.array_equal(got[2], np.concatenate([vals(r, 999, "float32", salt=7) for r in range(n)]))


@pytest.mark.parametrize(("layout", "algo"), CASES[:1])
def test_dropped_async_calls_finish_by_the_barrier_and_off_keeps_the_flat_path(hier_groups, layout, algo):
    """An async hierarchical Work nobody waits on still fills its array by the group's barrier; with
    ``HPCDIST_HIER_ASYNC=0`` asynchronous calls take the flat non-blocking MPI call (blocking ones still go
    hierarchical)."""
    g = hier_groups[layout, algo]
    n, me = dist.get_world_size(), dist.get_rank()
    x = vals(me, 5000, "float64")
    dist.all_reduce(x, group=g, async_op=True)  # dropped at once
    dist.barrier(group=g)
    assert np.array_equal(x, sum(vals(r, 5000, "float64") for r in range(n)))
    real = WORLD.node_of
    try:
        WORLD.node_of = list(LAYOUTS[n][layout])
        with knobs_set({"HPCDIST_HIER": "1", "HPCDIST_HIER_ASYNC": "0", "HPCDIST_SHM": "1"}):
            off = dist.new_group()
            assert off.engine("cpu")._steps_thread is None
    finally:
        WORLD.node_of = real
    try:
        y = vals(me, 5000, "float64")
        w = dist.all_reduce(y, group=off, async_op=True)
        assert _started(w) == "flat" and off.engine("cpu")._topo is None  # no node step ran
        w.wait()
        assert np.array_equal(y, sum(vals(r, 5000, "float64") for r in range(n)))
        dist.all_reduce(y, group=off)
        assert off.engine("cpu")._topo is not None
    finally:
        dist.destroy_process_group(off)


@pytest.mark.parametrize(("layout", "algo"), CASES[:1])
def test_detail_mode_lets_ranks_mix_async_op_where_the_steps_are_the_same(hier_groups, layout, algo):
    """DETAIL mode compares ``async_op`` only where it changes the MPI calls (block wait mode, flat path): ranks
    mixing it for the four hierarchical collectives pass its check and get the right results."""
    from hpcdist.debug import DebugLevel, get_debug_level, set_debug_level

    g = hier_groups[layout, algo]
    n, me = dist.get_world_size(), dist.get_rank()
    mine = me % 2 == 0
    before = get_debug_level()
    set_debug_level(DebugLevel.DETAIL)
    try:
        x = vals(me, 3000, "float64")
        b = vals(me, 3000, "float64", salt=1)
        out = np.empty(n * 100, np.float64)
        rs = np.empty(100, np.float64)
        works = [
            dist.all_reduce(x, group=g, async_op=mine),
            dist.broadcast(b, src=0, group=g, async_op=not mine),
            dist.all_gather_into_tensor(out, vals(me, 100, "float64", salt=2), group=g, async_op=mine),
            dist.reduce_scatter_tensor(rs, vals(me, n * 100, "float64", salt=3), group=g, async_op=not mine),
        ]
        for w in works:
            if w is not None:
                w.wait()
    finally:
        set_debug_level(before)
    assert np.array_equal(x, sum(vals(r, 3000, "float64") for r in range(n)))
    assert np.array_equal(b, vals(0, 3000, "float64", salt=1))
    assert np.array_equal(out, np.concatenate([vals(r, 100, "float64", salt=2) for r in range(n)]))
    assert np.array_equal(rs, sum(vals(r, n * 100, "float64", salt=3) for r in range(n))[me * 100 : (me + 1) * 100])
