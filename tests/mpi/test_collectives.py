"""Collectives over the matrix: groups x array kinds x dtypes, against NumPy references.

Every rank computes every other rank's input (``values(rank, ...)``), so the
expected result is computed locally with NumPy, independently of MPI.
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi_arrays import DTYPES, FLOATS, INTS, KINDS, cases, cast, empty, make, need, to_np, torch, values

import hpcdist as dist
from hpcdist import ReduceOp

N = 10  # elements per rank


def me() -> int:
    return dist.get_rank()


def check(actual, ref: np.ndarray, dtype: str) -> None:
    got = to_np(actual).reshape(-1)
    want = cast(np.asarray(ref), dtype).reshape(-1)
    assert got.shape == want.shape, (got.shape, want.shape)
    assert np.array_equal(got, want), f"{dtype}: got {got}, want {want}"


# ------------------------------------------------------------------ group matrix (SUM / data movement)


@pytest.mark.parametrize(("kind", "dtype"), cases(["float32", "int64", "bfloat16"]))
def test_all_reduce_sum_groups(group, members, kind, dtype):
    need(kind, dtype)
    x = make(kind, values(me(), N, dtype), dtype)
    before = to_np(x).copy()
    res = dist.all_reduce(x, group=group)
    assert res is None
    if not members:
        assert np.array_equal(to_np(x), before)  # non-member: nothing happens
        return
    check(x, sum(values(r, N, dtype) for r in members), dtype)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["float64", "int32", "bool", "complex128"])
def test_broadcast_every_root(group, members, kind, dtype):
    need(kind, dtype)
    for root in members:
        x = make(kind, values(me(), N, dtype, salt=root), dtype)
        dist.broadcast(x, src=root, group=group)
        check(x, values(root, N, dtype, salt=root), dtype)
    for grp_root in range(len(members)):  # the same through group_src
        x = make(kind, values(me(), N, dtype, salt=7), dtype)
        dist.broadcast(x, group=group, group_src=grp_root)
        check(x, values(members[grp_root], N, dtype, salt=7), dtype)


@pytest.mark.parametrize("kind", KINDS)
def test_reduce_every_dst(group, members, kind):
    dtype = "float64"
    need(kind, dtype)
    for dst in members:
        mine = values(me(), N, dtype, salt=dst)
        x = make(kind, mine, dtype)
        dist.reduce(x, dst=dst, op=ReduceOp.SUM, group=group)
        if me() == dst:
            check(x, sum(values(r, N, dtype, salt=dst) for r in members), dtype)
        else:
            check(x, mine, dtype)  # non-destination inputs are left as they were


@pytest.mark.parametrize(("kind", "dtype"), cases(["float32", "int64", "bfloat16", "bool"]))
def test_all_gather_uneven(group, members, kind, dtype):
    need(kind, dtype)
    if not members:
        assert dist.all_gather([], make(kind, values(me(), 3, dtype), dtype), group=group) is None
        return
    size_of = {r: 1 + (i % 3) for i, r in enumerate(members)}  # uneven: 1, 2, 3, 1, ...
    outs = [empty(kind, (size_of[r],), dtype) for r in members]
    dist.all_gather(outs, make(kind, values(me(), size_of[me()], dtype), dtype), group=group)
    for r, o in zip(members, outs):
        check(o, values(r, size_of[r], dtype), dtype)


@pytest.mark.parametrize("kind", KINDS)
def test_all_gather_into_one_array_listed_in_every_slot(group, members, kind):
    """The same output in every slot: each slot is written in rank order, so the last rank's data wins on every
    rank (as gloo). Shared memory's staggered reads left each rank a different rank's data (3 ranks)."""
    need(kind, "float64")
    if not members:
        return
    o = empty(kind, (N,), "float64")
    dist.all_gather([o] * len(members), make(kind, values(me(), N, "float64"), "float64"), group=group)
    check(o, values(members[-1], N, "float64"), "float64")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["float64", "int32", "float16"])
def test_all_gather_into_tensor(group, members, kind, dtype):
    need(kind, dtype)
    if not members:
        return
    n = len(members)
    out = empty(kind, (n, 4), dtype)
    dist.all_gather_into_tensor(out, make(kind, values(me(), 4, dtype), dtype), group=group)
    check(out, np.concatenate([values(r, 4, dtype) for r in members]), dtype)
    out2 = empty(kind, (n * 4,), dtype)  # the newer name, flat output
    dist.all_gather_single(out2, make(kind, values(me(), 4, dtype), dtype), group=group)
    check(out2, np.concatenate([values(r, 4, dtype) for r in members]), dtype)


@pytest.mark.parametrize("kind", KINDS)
def test_gather_scatter_every_root(group, members, kind):
    dtype = "int64"
    need(kind, dtype)
    for root in members:
        x = make(kind, values(me(), 5, dtype, salt=root), dtype)
        glist = [empty(kind, (5,), dtype) for _ in members] if me() == root else None
        dist.gather(x, glist, dst=root, group=group)
        if me() == root:
            for r, g in zip(members, glist):
                check(g, values(r, 5, dtype, salt=root), dtype)
        out = empty(kind, (5,), dtype)
        slist = [make(kind, values(r, 5, dtype, salt=100 + root), dtype) for r in members] if me() == root else None
        dist.scatter(out, slist, src=root, group=group)
        check(out, values(me(), 5, dtype, salt=100 + root), dtype)


@pytest.mark.parametrize(("kind", "dtype"), cases(["float32", "int64", "bfloat16"]))
def test_reduce_scatter(group, members, kind, dtype):
    need(kind, dtype)
    if not members:
        return
    n = len(members)
    gr = members.index(me())
    sizes = [2 + (i % 2) for i in range(n)]  # uneven chunks in the list form
    ins = [make(kind, values(me(), sizes[i], dtype, salt=i), dtype) for i in range(n)]
    out = empty(kind, (sizes[gr],), dtype)
    dist.reduce_scatter(out, ins, op=ReduceOp.SUM, group=group)
    check(out, sum(values(r, sizes[gr], dtype, salt=gr) for r in members), dtype)
    # the tensor form
    full = make(kind, values(me(), 3 * n, dtype), dtype)
    out = empty(kind, (3,), dtype)
    dist.reduce_scatter_tensor(out, full, group=group)
    ref = sum(values(r, 3 * n, dtype) for r in members)
    check(out, ref[3 * gr : 3 * gr + 3], dtype)
    out = empty(kind, (3,), dtype)
    dist.reduce_scatter_single(out, full, group=group)
    check(out, ref[3 * gr : 3 * gr + 3], dtype)


@pytest.mark.parametrize("kind", KINDS)
def test_all_to_all(group, members, kind):
    dtype = "float64"
    need(kind, dtype)
    if not members:
        return
    n = len(members)
    gr = members.index(me())
    # rank i sends (i + j + 1) elements to rank j: uneven
    ins = [make(kind, values(me(), gr + j + 1, dtype, salt=j), dtype) for j in range(n)]
    outs = [empty(kind, (i + gr + 1,), dtype) for i in range(n)]
    dist.all_to_all(outs, ins, group=group)
    for i, r in enumerate(members):
        check(outs[i], values(r, i + gr + 1, dtype, salt=gr), dtype)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("uneven", [False, True])
def test_all_to_all_single(group, members, kind, uneven):
    dtype = "int32"
    need(kind, dtype)
    if not members:
        return
    n = len(members)
    gr = members.index(me())

    def rows(i, j):  # rows rank i sends to rank j
        return (i + 2 * j) % 3 + 1 if uneven else 2

    send_rows = [rows(gr, j) for j in range(n)]
    recv_rows = [rows(i, gr) for i in range(n)]
    src = values(me(), sum(send_rows) * 2, dtype).reshape(-1, 2)
    out = empty(kind, (sum(recv_rows), 2), dtype)
    kw = {"output_split_sizes": recv_rows, "input_split_sizes": send_rows} if uneven else {}
    dist.all_to_all_single(out, make(kind, src, dtype), group=group, **kw)
    want = []
    for i, r in enumerate(members):
        theirs = values(r, sum(rows(i, j) for j in range(n)) * 2, dtype).reshape(-1, 2)
        start = sum(rows(i, j) for j in range(gr))
        want.append(theirs[start : start + rows(i, gr)])
    check(out, np.concatenate(want), dtype)


def test_barrier(group, members):
    assert dist.barrier(group=group) is None
    w = dist.barrier(group=group, async_op=True)
    if members:
        assert w.wait() is True and w.is_completed() and w.is_success()
    else:
        assert w is None


# ------------------------------------------------------------------ reduction ops x dtypes


def _ref(op, stack: np.ndarray, dtype: str, n: int) -> np.ndarray:
    if dtype == "bool":
        table = {
            "SUM": np.any,
            "MAX": np.any,
            "BOR": np.any,
            "PRODUCT": np.all,
            "MIN": np.all,
            "BAND": np.all,
            "BXOR": lambda s, axis: np.logical_xor.reduce(s, axis=axis),
        }
        return table[op](stack, axis=0)
    s = stack if dtype.startswith("complex") else stack.astype(np.float64 if dtype in FLOATS else np.int64)
    if op == "SUM":
        return s.sum(0)
    if op == "PREMUL_SUM":
        return (s * 2).sum(0)
    if op == "PRODUCT":
        return s.prod(0)
    if op == "MIN":
        return s.min(0)
    if op == "MAX":
        return s.max(0)
    if op == "AVG":
        return s.sum(0) / n if dtype in FLOATS or dtype.startswith("complex") else np.trunc(s.sum(0) / n)
    return {"BAND": np.bitwise_and, "BOR": np.bitwise_or, "BXOR": np.bitwise_xor}[op].reduce(s, axis=0)


def _applies(op: str, dtype: str) -> bool:
    if op in ("BAND", "BOR", "BXOR"):
        return dtype in INTS or dtype == "bool"
    if dtype.startswith("complex"):
        return op in ("SUM", "AVG", "PREMUL_SUM")
    if dtype == "bool":
        return op not in ("AVG", "PREMUL_SUM")
    return True


OPS = ["SUM", "PRODUCT", "MIN", "MAX", "AVG", "BAND", "BOR", "BXOR", "PREMUL_SUM"]


OP_CASES = [
    (k, d, o) for k in KINDS for d in DTYPES for o in OPS if _applies(o, d) and not (k == "numpy" and d == "bfloat16")
]


@pytest.mark.parametrize(("kind", "dtype", "opname"), OP_CASES)
def test_all_reduce_ops(kind, dtype, opname):
    """Every op on every dtype it is defined for (the others raise: test_errors)."""
    need(kind, dtype)
    n = dist.get_world_size()
    op = ReduceOp.PREMUL_SUM(2.0) if opname == "PREMUL_SUM" else getattr(ReduceOp, opname)
    x = make(kind, values(me(), N, dtype), dtype)
    dist.all_reduce(x, op=op)
    stack = np.stack([values(r, N, dtype) for r in range(n)])
    check(x, _ref(opname, stack, dtype, n), dtype)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_reduce_scatter_tensor_into_its_own_chunk_of_the_input(group, members, kind, dtype):
    """torch allows the output to be this rank's chunk of the input (NCCL runs it in place); MPI forbids aliased
    buffers, so the MPI path must receive aside (a defect found by the shared-memory tests)."""
    need(kind, dtype)
    if not members:
        return
    n, gr, size = len(members), members.index(me()), 5
    x = make(kind, values(me(), n * size, dtype), dtype)
    out = x[gr * size : (gr + 1) * size]
    dist.reduce_scatter_tensor(out, x, group=group)
    full = sum(values(r, n * size, dtype) for r in members)
    check(out, full[gr * size : (gr + 1) * size], dtype)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("opname", ["SUM", "MAX", "AVG", "PREMUL_SUM"])
def test_reduce_and_reduce_scatter_ops(kind, opname):
    dtype = "float32"
    need(kind, dtype)
    n = dist.get_world_size()
    op = ReduceOp.PREMUL_SUM(2.0) if opname == "PREMUL_SUM" else getattr(ReduceOp, opname)
    stack = np.stack([values(r, N, dtype) for r in range(n)])
    x = make(kind, values(me(), N, dtype), dtype)
    dist.reduce(x, dst=n - 1, op=op)
    if me() == n - 1:
        check(x, _ref(opname, stack, dtype, n), dtype)
    full = np.stack([values(r, 2 * n, dtype) for r in range(n)])
    out = empty(kind, (2,), dtype)
    dist.reduce_scatter_tensor(out, make(kind, values(me(), 2 * n, dtype), dtype), op=op)
    check(out, _ref(opname, full, dtype, n)[2 * me() : 2 * me() + 2], dtype)


# ------------------------------------------------------------------ async, coalesced, non-contiguous


@pytest.mark.parametrize("kind", KINDS)
def test_async_ops_and_futures(group, members, kind):
    need(kind)
    xs = [make(kind, values(me(), N, "float64", salt=i), "float64") for i in range(3)]
    works = [dist.all_reduce(x, group=group, async_op=True) for x in xs]
    if not members:
        assert works == [None, None, None]
        return
    fut = works[0].get_future()
    chained = fut.then(lambda f: float(to_np(f.value()[0]).sum()))  # the value is [tensor], as in torch
    for w in works:
        assert w.wait() is True
        assert w.is_completed() and w.is_success() and w.exception() is None
    for i, x in enumerate(xs):
        check(x, sum(values(r, N, "float64", salt=i) for r in members), "float64")
    assert fut.done()
    assert chained.wait() == pytest.approx(float(sum(values(r, N, "float64") for r in members).sum()))


@pytest.mark.parametrize("kind", KINDS)
def test_coalesced(group, members, kind):
    need(kind)
    xs = [make(kind, values(me(), k + 1, "float64", salt=k), "float64") for k in range(3)]
    dist.all_reduce_coalesced(xs, group=group)
    if members:
        for k, x in enumerate(xs):
            check(x, sum(values(r, k + 1, "float64", salt=k) for r in members), "float64")
        outs = [[empty(kind, (k + 1,), "float64") for k in range(2)] for _ in members]  # torch: [rank][input]
        ins = [make(kind, values(me(), k + 1, "float64", salt=k), "float64") for k in range(2)]
        dist.all_gather_coalesced(outs, ins, group=group)
        for r, outl in zip(members, outs):
            for k in range(2):
                check(outl[k], values(r, k + 1, "float64", salt=k), "float64")


@pytest.mark.parametrize("kind", KINDS)
def test_non_contiguous_in_and_out(kind):
    need(kind)
    n = dist.get_world_size()
    base = values(me(), 2 * N, "float64").reshape(N, 2)
    if kind == "numpy":
        arr = base.copy()
        view = arr[:, 1]  # strided view: result must land in the view, around it untouched
    else:
        arr = torch.tensor(base.copy())
        view = arr[:, 1]
    dist.all_reduce(view)
    want = sum(values(r, 2 * N, "float64").reshape(N, 2) for r in range(n))
    check(view, want[:, 1], "float64")
    check(arr[:, 0], base[:, 0], "float64")
    # strided input to a gather, strided outputs
    outs = [empty(kind, (N, 2), "float64")[:, 0] for _ in range(n)]
    dist.all_gather(outs, make(kind, base, "float64")[:, 1])
    for r, o in enumerate(outs):
        check(o, values(r, 2 * N, "float64").reshape(N, 2)[:, 1], "float64")


def test_buffer_protocol_and_array_interface():
    n = dist.get_world_size()
    ba = bytearray(np.arange(4, dtype=np.uint8) + me())
    dist.all_reduce(ba)
    assert list(ba) == [sum(i + r for r in range(n)) for i in range(4)]

    class Wrapped:
        def __init__(self, a):
            self.a = a
            self.__array_interface__ = a.__array_interface__

    w = Wrapped(np.full(3, float(me())))
    dist.all_reduce(w)
    assert np.array_equal(w.a, np.full(3, float(sum(range(n)))))


def test_requires_grad_tensor():
    if torch is None:
        pytest.skip("torch is not installed")
    t = torch.ones(3, requires_grad=True)
    with torch.no_grad():
        dist.all_reduce(t)
    assert torch.equal(t.detach(), torch.full((3,), float(dist.get_world_size())))


def test_zero_size_and_scalar():
    x = np.zeros(0)
    dist.all_reduce(x)
    s = np.array(float(me() + 1))  # 0-d
    dist.all_reduce(s)
    n = dist.get_world_size()
    assert float(s) == n * (n + 1) / 2


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("items", [5, 1 << 19])
def test_all_gather_into_tensor_with_an_output_overlapping_the_input(kind, items):
    """The input is the start of a buffer, the output the same buffer from half an input on: not the in-place
    layout torch allows (this rank's slot), yet sharing memory. MPI's path (2 ranks) aborted in MPICH ("memcpy
    argument memory ranges overlap"); every path must read the input before writing over it."""
    need(kind, "float32")
    n, r = dist.get_world_size(), dist.get_rank()
    host = np.zeros((n + 1) * items, np.float32)
    host[:items] = np.arange(items, dtype=np.float32) + 1000 * r
    buf = make(kind, host, "float32")
    inp, out = buf[:items], buf[items // 2 : items // 2 + n * items]
    dist.all_gather_into_tensor(out, inp)
    want = np.concatenate([np.arange(items, dtype=np.float32) + 1000 * p for p in range(n)])
    check(out, want, "float32")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", ["float64", "int32"])
def test_all_gather_into_tensor_from_its_own_slot_of_the_output(group, members, kind, dtype):
    """torch's in-place form (FSDP2 gathers so): the input is this rank's slot of the output. The MPI path sends
    MPI_IN_PLACE, NCCL runs in place; a device output must be recognized as such too."""
    need(kind, dtype)
    if not members:
        return
    n, gr, size = len(members), members.index(me()), 6
    out = make(kind, np.zeros(n * size), dtype)
    out[gr * size : (gr + 1) * size] = make(kind, values(me(), size, dtype), dtype)
    dist.all_gather_into_tensor(out, out[gr * size : (gr + 1) * size], group=group)
    check(out, np.concatenate([values(r, size, dtype) for r in members]), dtype)


#: (operation, items per rank): the larger sizes are where MPICH went wrong on 2 ranks before the fix
_ALIASED = [
    ("reduce_scatter_tensor", 5),
    ("reduce_scatter_tensor", 1 << 18),
    ("all_to_all_single", 5),
    ("all_to_all_single", 1 << 15),
    ("all_to_all_single in place", 5),
]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("how", "items"), _ALIASED)
def test_outputs_that_share_memory_with_the_input(kind, how, items):
    """MPI forbids aliased buffers: reduce_scatter_tensor into a window of its own input gave rank 0 wrong sums
    silently, all_to_all_single over an overlapping window aborted in MPICH and in place (output is input) raised
    MPI's 'Invalid buffer pointer'. The input is read from a copy; NumPy gives the answers."""
    need(kind, "float32")
    n, r = dist.get_world_size(), dist.get_rank()
    host = np.zeros(n * items + items, np.float32)
    if how == "reduce_scatter_tensor":
        host[: n * items] = np.tile(np.arange(items, dtype=np.float32), n) + r
        buf = make(kind, host, "float32")
        inp, out = buf[: n * items], buf[items // 2 : items // 2 + items]
        dist.reduce_scatter_tensor(out, inp)
        want = np.arange(items, dtype=np.float32) * n + sum(range(n))
    else:
        host[: n * items] = np.repeat(np.arange(n, dtype=np.float32), items) + 100 * r
        buf = make(kind, host, "float32")
        shift = 0 if how.endswith("in place") else items // 2
        inp, out = buf[: n * items], buf[shift : shift + n * items]
        dist.all_to_all_single(out, inp)
        want = np.repeat(100 * np.arange(n, dtype=np.float32), items) + r
    check(out, want, "float32")
