"""MIN and MAX of floats: a NaN on any rank gives NaN, on every path, the same bits on every rank.

MPI's own MIN/MAX compare with ``<``: combined in MPI's order, a NaN was lost
or kept depending on which rank held it, and with a NaN on one of 4 ranks
MIN could return a value that is not the minimum of the others (MPICH: 2.0
where the others held 1, 3 and 2). hpcdist runs them on ordered integer keys
(``hpcdist.buffers.reduction.order_keys``; unit-tested exhaustively in
tests/unit/test_order_keys.py); the shared-memory engine reduces with NumPy.

The reference is NumPy's ``minimum``/``maximum`` (which propagate NaN) over
every rank's input, computed locally. Each element position has its NaN on a
different rank (or on none), next to zeros of both signs and infinities.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi_arrays import cases, make, need, to_np, torch
from test_shm import knobs_set

import hpcdist as dist
from hpcdist import ReduceOp

CALLS = ["all_reduce", "all_reduce_async", "reduce", "reduce_scatter", "reduce_scatter_tensor", "all_reduce_coalesced"]
#: (items per rank, array kind, dtype): 12 items hold a NaN on each rank and on none, up to 4 ranks; 40000 float32
#: items are the shared-memory path's sizes (several 64 KiB slots), on three dtypes
CASES = [(12, k, d) for k, d in cases(["float32", "float64", "float16", "bfloat16"])]
CASES += [(40000, "numpy", "float32"), (40000, "numpy", "float16"), (40000, "torch", "bfloat16")]


@pytest.fixture(scope="module")
def paths():
    """The world as a group on MPI's path ("mpi") and on the shared-memory engine ("shm"); collective."""
    out = {}
    for name, shm in (("mpi", "0"), ("shm", "1")):
        with knobs_set({"HPCDIST_SHM": shm}):
            out[name] = dist.new_group()
            dist.barrier(group=out[name])  # its engine, now
    yield out
    for g in out.values():
        dist.destroy_process_group(g)


def contribution(rank: int, n: int, size: int) -> np.ndarray:
    """Rank ``rank``'s input: element i holds NaN on rank i % (n + 1) (none when that is n), a signed zero on
    every third element, infinities on some, small numbers elsewhere."""
    i = np.arange(size)
    x = ((i * 5 + rank * 3) % 7 - 3).astype(np.float64)
    x[i % 3 == 1] = -0.0 if rank % 2 else 0.0
    x[(i % 11 == 5) & (rank == 0)] = np.inf
    x[(i % 13 == 6) & (rank == n - 1)] = -np.inf
    x[i % (n + 1) == rank] = np.nan
    return x


def reference(opname: str, n: int, size: int) -> np.ndarray:
    fn = np.minimum if opname == "MIN" else np.maximum
    return fn.reduce(np.stack([contribution(r, n, size) for r in range(n)]), axis=0)


def equal(got, want: np.ndarray) -> None:
    got = to_np(got).reshape(-1)
    assert np.array_equal(np.isnan(got), np.isnan(want)), (
        f"NaN where {np.flatnonzero(np.isnan(got))[:8]}, want {np.flatnonzero(np.isnan(want))[:8]}"
    )
    assert np.array_equal(got, want, equal_nan=True), f"got {got[:12]}, want {want[:12]}"


@pytest.mark.parametrize("path", ["mpi", "shm"])
@pytest.mark.parametrize("opname", ["MIN", "MAX"])
@pytest.mark.parametrize("call", CALLS)
@pytest.mark.parametrize(("size", "kind", "dtype"), CASES)
def test_nan_on_any_rank_wins(paths, path, kind, dtype, opname, call, size):
    need(kind, dtype)
    g = paths[path]
    n, r = g.size(), g.rank()
    op = getattr(ReduceOp, opname)
    want = reference(opname, n, size * n)  # size items per rank in the scattering calls
    x = make(kind, contribution(r, n, size * n), dtype)
    if call == "all_reduce":
        dist.all_reduce(x, op=op, group=g)
    elif call == "all_reduce_async":
        dist.all_reduce(x, op=op, group=g, async_op=True).wait()
    elif call == "all_reduce_coalesced":
        parts = [x[: size * n // 2], x[size * n // 2 :]]
        dist.all_reduce_coalesced(parts, op=op, group=g)
    elif call == "reduce":
        dist.reduce(x, dst=n - 1, op=op, group=g)
        if r == n - 1:
            equal(x, want)
        return
    else:
        out = make(kind, np.zeros(size), dtype)
        if call == "reduce_scatter":
            dist.reduce_scatter(out, list(x.reshape(n, size)), op=op, group=g)
        else:
            dist.reduce_scatter_tensor(out, x, op=op, group=g)
        equal(out, want.reshape(n, size)[r])
        return
    equal(x, want)
    raw = x.tobytes() if kind == "numpy" else x.reshape(-1).view(torch.uint8).numpy().tobytes()
    everyone = g.comm.allgather(raw)
    assert all(b == everyone[0] for b in everyone), "results differ between ranks"


@pytest.mark.parametrize("opname", ["MIN", "MAX"])
def test_integers_and_inputs_are_untouched_by_the_keys(paths, opname):
    """Integer MIN/MAX stay MPI's own; reduce's non-root input and reduce_scatter's input are left as they were
    (the keys are a copy)."""
    g = paths["mpi"]
    n, r = g.size(), g.rank()
    op = getattr(ReduceOp, opname)
    ints = np.array([r * 7 - 10, -r, 2**40 + r], dtype=np.int64)
    dist.all_reduce(ints, op=op, group=g)
    fn = min if opname == "MIN" else max
    assert ints.tolist() == [
        fn(q * 7 - 10 for q in range(n)),
        fn(-q for q in range(n)),
        fn(2**40 + q for q in range(n)),
    ]
    x = contribution(r, n, 4 * n).astype(np.float32)
    before = x.tobytes()
    out = np.zeros(4, np.float32)
    dist.reduce_scatter_tensor(out, x, op=op, group=g)
    assert x.tobytes() == before
    dist.reduce(x, dst=0, op=op, group=g)
    if r != 0:
        assert x.tobytes() == before
