"""Audit of the hierarchical engine on pretend node layouts (one host, 3 or 4 ranks), beyond test_hierarchical.py.

As in test_hierarchical.py, each case sets ``WORLD.node_of`` to a pretend layout while a group's hierarchical
engine, its node/leader/rail communicators and node engines are built (real communicators, real segments), then
restores it. What this file adds: groups that hold only some ranks of a node, one node's ranks and one of another's,
unsorted groups (``sort_ranks=False``) whose group order interleaves the nodes; the in-place forms (FSDP's
all_gather input in its output row, reduce_scatter output in its input row); sizes around
``HPCDIST_HIER_MIN_BYTES`` and the lanes below it; ``async_op=True``; destroy and recreate; and the group's timeout.

Docstrings say ``DEFECT:`` (fails on the code audited, file:line) or ``GUARD:`` (a risky edge that works).
Run: ``mpiexec -n 4 python tests/mpi_pytest.py tests/mpi/test_hierarchical_audit.py -q`` (and ``-n 3``).
"""

from __future__ import annotations

import glob
import os
from contextlib import contextmanager
from datetime import timedelta

import numpy as np
import pytest
from test_shm import knobs_set, same_bytes_everywhere

import hpcdist as dist
from hpcdist import ReduceOp
from hpcdist._world import WORLD
from hpcdist.backends.hierarchical import HierarchicalEngine

#: world size -> pretend layouts (node index of each world rank)
LAYOUTS = {
    3: {"2+1": [0, 0, 1], "1+2": [0, 1, 1], "split": [0, 1, 0]},
    4: {"2+2": [0, 0, 1, 1], "interleaved": [0, 1, 0, 1], "3+1": [0, 0, 0, 1], "1+3": [1, 0, 0, 0]},
}


def _layouts() -> dict[str, list[int]]:
    return LAYOUTS.get(dist.get_world_size(), {}) if dist.is_initialized() else {}


if not _layouts():
    pytest.skip("pretend layouts need 3 or 4 ranks", allow_module_level=True)


def _spans(layout: list[int], ranks: list[int]) -> bool:
    nodes = [layout[r] for r in ranks]
    return 1 < len(set(nodes)) < len(nodes)


def _groups_of(layout: list[int]) -> list[tuple[list[int], bool]]:
    """(ranks, sorted) of the groups that take the hierarchical engine on ``layout``: every spanning subset of 3 or
    more ranks, sorted, and the world in two unsorted orders (reversed; nodes interleaved)."""
    n = len(layout)
    subsets = [[r for r in range(n) if r != skip] for skip in range(n)] if n == 4 else []
    out = [(s, True) for s in subsets if _spans(layout, s)]
    out += [(list(range(n))[::-1], False)]
    if n == 4:
        out.append(([3, 0, 2, 1], False))
    return [(ranks, srt) for ranks, srt in out if _spans(layout, ranks)]


@contextmanager
def pretend(layout: list[int], **knobs: str):
    """``WORLD.node_of`` is ``layout`` (and the knobs are set) inside the block."""
    real = WORLD.node_of
    WORLD.node_of = list(layout)
    try:
        with knobs_set({"HPCDIST_HIER": "1", "HPCDIST_SHM": "1", **knobs}):
            yield
    finally:
        WORLD.node_of = real


def hier_group(layout: list[int], ranks: list[int] | None = None, srt: bool = True, **knobs: str):
    """A group (collective over the world) whose engine and topology were built on ``layout``; None on non-members."""
    with pretend(layout, **knobs):
        g = dist.new_group(ranks, sort_ranks=srt)
        if ranks is not None and dist.get_rank() not in ranks:
            return None
        assert isinstance(g.engine("cpu"), HierarchicalEngine)
        dist.all_reduce(np.ones(8), group=g)  # topology + node engines now, on the pretend layout
        assert g.engine("cpu")._topo is not None
    return g


def vals(r: int, n: int, dtype: str = "float64", salt: int = 0) -> np.ndarray:
    i = np.arange(n)
    return ((i * 3 + r * 5 + salt) % 7 + 1).astype(dtype)


def _check_all_ops(g, tag: str) -> None:
    """all_reduce (SUM, AVG, MAX with a NaN), broadcast from every root, all_gather_into_tensor and
    reduce_scatter_tensor (plain and in place), against NumPy and bitwise across the group."""
    n, gr = g.size(), g.rank()
    for size in (1, 6, 7, 1001):
        x = vals(gr, size, "float32")
        dist.all_reduce(x, group=g)
        assert np.array_equal(x, sum(vals(r, size, "float64") for r in range(n)).astype(np.float32)), (tag, size)
        same_bytes_everywhere(g, x)
        x = vals(gr, size, "float32")
        dist.all_reduce(x, op=ReduceOp.AVG, group=g)
        assert np.allclose(x, np.mean([vals(r, size) for r in range(n)], 0), rtol=1e-6), (tag, size)
        same_bytes_everywhere(g, x)
        x = vals(gr, size, "float32")
        if gr == n - 1:
            x[-1] = np.nan
        dist.all_reduce(x, op=ReduceOp.MAX, group=g)
        assert np.isnan(x[-1]) and np.array_equal(x[:-1], np.max([vals(r, size) for r in range(n)], 0)[:-1]), tag
    for root in range(n):
        x = vals(gr, 1001, salt=root)
        dist.broadcast(x, group_src=root, group=g)
        assert np.array_equal(x, vals(root, 1001, salt=root)), (tag, root)
    for m in (0, 1, 7, 333):
        want = np.concatenate([vals(r, m, salt=9) for r in range(n)])
        out = np.full(n * m, -1.0)
        dist.all_gather_into_tensor(out, vals(gr, m, salt=9), group=g)
        assert np.array_equal(out, want), (tag, m)
        out = np.full(n * m, -1.0)
        out[gr * m : (gr + 1) * m] = vals(gr, m, salt=9)
        dist.all_gather_into_tensor(out, out[gr * m : (gr + 1) * m], group=g)  # FSDP: the input is its own row
        assert np.array_equal(out, want), (tag, "in place", m)
        total = sum(vals(r, n * m, salt=11) for r in range(n))
        inp = vals(gr, n * m, salt=11)
        keep = inp.copy()
        o = np.full(m, -1.0)
        dist.reduce_scatter_tensor(o, inp, group=g)
        assert np.array_equal(o, total[gr * m : (gr + 1) * m]) and np.array_equal(inp, keep), (tag, m)
        dist.reduce_scatter_tensor(inp[gr * m : (gr + 1) * m], inp, group=g)  # the output is its own input row
        assert np.array_equal(inp[gr * m : (gr + 1) * m], total[gr * m : (gr + 1) * m]), (tag, "in place", m)


CASES = [(name, algo) for name in _layouts() for algo in ("auto", "rails", "leaders")]


@pytest.mark.parametrize(("layout", "algo"), CASES)
def test_groups_of_some_ranks_and_unsorted_groups(layout, algo):
    """GUARD: groups holding some ranks of a node (one node's ranks and one of another's), and unsorted groups whose
    group order interleaves the nodes, take the hierarchical engine and give NumPy's results, the same bits on every
    rank, in place too."""
    node_of = LAYOUTS[dist.get_world_size()][layout]
    for ranks, srt in _groups_of(node_of):
        g = hier_group(node_of, ranks, srt, HPCDIST_HIER_ALGO=algo)
        if g is not None:
            assert dist.get_process_group_ranks(g) == (ranks if not srt else sorted(ranks))
            _check_all_ops(g, f"{layout} {algo} {ranks} sorted={srt}")
            dist.destroy_process_group(g)


def _count_steps(monkeypatch, g) -> list[str]:
    steps = g.engine("cpu")._topo.steps
    calls: list[str] = []
    for name in ("reduce_scatter_tensor", "reduce", "all_gather_into", "gather", "broadcast", "scatter"):
        real = getattr(steps, name)

        def call(*args, _name=name, _real=real, **kwargs):
            calls.append(_name)
            return _real(*args, **kwargs)

        monkeypatch.setattr(steps, name, call)
    return calls


def test_sizes_around_the_threshold_and_the_lanes_below_it(monkeypatch):
    """GUARD: with ``HPCDIST_HIER_MIN_BYTES=4096``, calls of 4092, 4096 and 4100 bytes, repeated (so that the
    group's lanes, learned below the threshold, serve the small ones) and interleaved: below the threshold no node
    step runs, from it the node steps do, on every rank alike, and every result is NumPy's."""
    layout = next(iter(_layouts().values()))
    with pretend(layout, HPCDIST_HIER="auto", HPCDIST_HIER_MIN_BYTES="4096"):
        g = dist.new_group()
        assert isinstance(g.engine("cpu"), HierarchicalEngine)
        dist.all_reduce(np.ones(1024, np.float32), group=g)  # at the threshold: the topology now
    calls = _count_steps(monkeypatch, g)
    n, me = g.size(), g.rank()
    for _ in range(3):
        for items in (1023, 1024, 1025, 1023):
            big = items * 4 >= 4096
            calls.clear()
            x = vals(me, items, "float32")
            dist.all_reduce(x, group=g)
            assert np.array_equal(x, sum(vals(r, items) for r in range(n)).astype(np.float32))
            assert bool(calls) == big, (items, calls)
            calls.clear()
            x = vals(me, items, "float32", salt=1)
            dist.broadcast(x, group_src=n - 1, group=g)
            assert np.array_equal(x, vals(n - 1, items, "float32", salt=1)) and bool(calls) == big, (items, calls)
            calls.clear()
            m = -(-items // n)  # output of about `items` items
            out = np.empty(n * m, np.float32)
            dist.all_gather_into_tensor(out, vals(me, m, "float32"), group=g)
            assert np.array_equal(out, np.concatenate([vals(r, m, "float32") for r in range(n)]))
            assert bool(calls) == (n * m * 4 >= 4096), (items, calls)
            calls.clear()
            o = np.empty(m, np.float32)
            dist.reduce_scatter_tensor(o, vals(me, n * m, "float32"), group=g)
            assert np.array_equal(o, sum(vals(r, n * m) for r in range(n))[me * m : (me + 1) * m].astype(np.float32))
            assert bool(calls) == (n * m * 4 >= 4096), (items, calls)
    monkeypatch.undo()
    dist.destroy_process_group(g)


def test_async_op_takes_the_flat_call_and_agrees():
    """GUARD: ``async_op=True`` on a hierarchical group runs the flat non-blocking MPI call (no node step), gives
    NumPy's answer and the same bits everywhere, and interleaves with blocking hierarchical calls on the group."""
    layout = next(iter(_layouts().values()))
    g = hier_group(layout)
    n, me = g.size(), g.rank()
    x = vals(me, 1 << 14, "float32")
    y = vals(me, 1 << 14, "float32", salt=3)
    w = dist.all_reduce(x, group=g, async_op=True)
    dist.all_reduce(y, group=g)  # a blocking hierarchical call while the async one is in flight
    w.wait()
    assert np.array_equal(x, sum(vals(r, 1 << 14) for r in range(n)).astype(np.float32))
    assert np.array_equal(y, sum(vals(r, 1 << 14, salt=3) for r in range(n)).astype(np.float32))
    same_bytes_everywhere(g, x)
    out = np.empty(n * 100)
    dist.all_gather_into_tensor(out, vals(me, 100), group=g, async_op=True).wait()
    assert np.array_equal(out, np.concatenate([vals(r, 100) for r in range(n)]))
    dist.destroy_process_group(g)


def test_destroy_and_recreate_leaves_nothing_behind():
    """GUARD: a hierarchical group created, used (node segments set up) and destroyed ten times: every round
    right, and no shared-memory file of this process stays in /dev/shm."""
    layout = next(iter(_layouts().values()))
    n = dist.get_world_size()
    for i in range(10):
        g = hier_group(layout, HPCDIST_HIER_ALGO=("auto", "rails", "leaders")[i % 3])
        x = vals(g.rank(), 4099, salt=i)
        dist.all_reduce(x, group=g)
        assert np.array_equal(x, sum(vals(r, 4099, salt=i) for r in range(n)))
        dist.destroy_process_group(g)
    assert not [p for p in glob.glob("/dev/shm/hpcdist-*") if f"-{os.getpid()}-" in p]


def test_set_timeout_reaches_the_node_steps():
    """DEFECT: ``ProcessGroup.set_timeout`` on a hierarchical group does not reach its node-local steps.

    hpcdist/backends/hierarchical.py:146-154 copies the group's timeout into the node group once, when the
    topology is built (the first hierarchical call); hpcdist/group.py:141 ``set_timeout`` then changes the
    parent's only. The step between the nodes honours the new timeout (hierarchical.py:227 reads
    ``pg._timeout_s``), the node steps (their segment waits, their MPI calls) keep the old one: a rank whose node
    peer is gone waits the old timeout (tests/integration/test_cluster_audit.py shows 30 s instead of 3 s).
    """
    layout = next(iter(_layouts().values()))
    g = hier_group(layout)
    try:
        g.set_timeout(timedelta(seconds=7))
        dist.all_reduce(np.ones(8), group=g)  # the next hierarchical call: its node steps take the new timeout
        topo = g.engine("cpu")._topo
        assert topo.node_pg.timeout == timedelta(seconds=7), (
            f"the node steps keep {topo.node_pg.timeout} after set_timeout(7 s)"
        )
    finally:
        dist.destroy_process_group(g)


def test_lanes_stop_only_where_the_node_steps_start():
    """GUARD (found by the audit, fixed): the engine's lanes stop at ``HPCDIST_HIER_MIN_BYTES`` only for the four
    collectives it runs in node steps; reduce, gather, scatter, list all_gather and all_to_all_single are MPIEngine's
    at every size, so their lanes serve every size too (they lost them from 512 KiB for no change of path)."""
    layout = next(iter(_layouts().values()))
    with pretend(layout, HPCDIST_HIER="auto", HPCDIST_HIER_MIN_BYTES="4096"):
        g = dist.new_group()
        eng = g.engine("cpu")  # chosen on the pretend layout
    try:
        assert isinstance(eng, HierarchicalEngine)
        for op in ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor"):
            assert eng.lane_below(op) == 4096, op
        for op in ("reduce", "gather", "scatter", "all_gather", "all_to_all_single"):
            assert eng.lane_below(op) == float("inf"), op
    finally:
        dist.destroy_process_group(g)
