"""The shared-memory engine over the matrix, forced on (``HPCDIST_SHM=1``) with tiny slots.

The groups here are made with ``HPCDIST_SHM=1`` and ``HPCDIST_SHM_SLOT=64``
(bytes per rank and pipeline stage), so every array of more than a few
elements crosses several pipelined chunks and set rotations. References are
NumPy (test_collectives' ``_ref``); bitwise equality across ranks is checked
by gathering every rank's result bytes over raw MPI.
"""

from __future__ import annotations

import contextlib
import os

import numpy as np
import pytest
from matrix import GROUP_KINDS, make_groups, members_of
from mpi_arrays import DTYPES, cast, empty, make, need, to_np, values
from test_collectives import OPS, _applies, _ref

import hpcdist as dist
from hpcdist import ReduceOp
from hpcdist.backends.mpi import MPIEngine
from hpcdist.backends.shm import ShmEngine, direct

SLOT = 64  # the smallest slot: arrays of more than 16 bytes per rank cross several chunks
SIZES = [1, 37, 300]  # 300 float64 = 2400 B: ~40-150 chunks


def me() -> int:
    return dist.get_rank()


@contextlib.contextmanager
def knobs_set(knobs: dict[str, str]):
    """``os.environ`` with ``knobs`` set inside the block (a group's engine reads them when it is built)."""
    saved = {k: os.environ.get(k) for k in knobs}
    os.environ.update(knobs)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def groups_with(knobs: dict[str, str]) -> dict:
    """The matrix's groups plus a new ``world`` group (collective), their host engines built with ``knobs`` set."""
    with knobs_set(knobs):
        groups = make_groups()
        groups["world"] = dist.new_group()
        for g in groups.values():
            if members_of(g):
                g.engine("cpu")  # built now, while the knobs are set
    return groups


@pytest.fixture(scope="module", params=["direct", "segment"])
def shm_groups(request):
    """Groups whose engines read peers' arrays directly (``direct``, chunks of 64 bytes) or go through the
    segment only (``segment``: ``HPCDIST_SHM_DIRECT=0``)."""
    knobs = {
        "HPCDIST_SHM": "1",
        "HPCDIST_SHM_SLOT": str(SLOT),
        "HPCDIST_SHM_DIRECT": str(int(request.param == "direct")),
    }
    groups = groups_with(knobs)
    chunk, direct.CHUNK_BYTES = direct.CHUNK_BYTES, SLOT  # the direct reductions cross many chunks too
    yield request.param, groups
    direct.CHUNK_BYTES = chunk


@pytest.fixture(params=GROUP_KINDS)
def sgroup(request, shm_groups):
    g = shm_groups[1][request.param]
    return g, members_of(g)


def check(actual, ref, dtype: str) -> None:
    got = to_np(actual).reshape(-1)
    want = cast(np.asarray(ref), dtype).reshape(-1)
    assert np.array_equal(got, want), f"{dtype}: got {got[:8]}..., want {want[:8]}..."


def same_bytes_everywhere(group, arr) -> None:
    """Every member of ``group`` holds exactly the bytes of ``arr`` (gathered over the group's raw comm)."""
    data = to_np(arr).tobytes() if not isinstance(arr, np.ndarray) else arr.tobytes()
    everyone = group.comm.allgather(data)
    assert all(d == everyone[0] for d in everyone), "results differ between ranks"


def test_engine_is_shared_memory(sgroup, shm_groups):
    g, members = sgroup
    if not members:
        return
    eng = g.engine("cpu")
    if len(members) == 1:
        assert type(eng) is MPIEngine  # one rank: nothing to share
        return
    assert isinstance(eng, ShmEngine)
    assert eng.path("all_reduce", 8) == "shm" and eng.path("broadcast", 1 << 30) == "shm"
    assert eng.path("all_to_all", 1 << 20) == "mpi"
    dist.barrier(group=g)  # a shared-memory call: the segment is set up, the direct reads probed
    assert eng.reads_directly == (shm_groups[0] == "direct")


# NumPy for every dtype; torch where its adapter differs (bfloat16 travels as uint16 bits, float16)
OP_CASES = [("numpy", d, o) for d in DTYPES if d != "bfloat16" for o in OPS if _applies(o, d)]
OP_CASES += [("torch", d, o) for d in ("bfloat16", "float16") for o in OPS if _applies(o, d)]


@pytest.mark.parametrize("which", ["world", "split"])  # the other kinds run in the tests below
@pytest.mark.parametrize(("kind", "dtype", "opname"), OP_CASES)
def test_all_reduce_every_op_dtype(shm_groups, which, kind, dtype, opname):
    g = shm_groups[1][which]
    members = members_of(g)
    need(kind, dtype)
    size = 37  # uneven over 2-4 ranks; several chunks
    op = ReduceOp.PREMUL_SUM(2.0) if opname == "PREMUL_SUM" else getattr(ReduceOp, opname)
    x = make(kind, values(me(), size, dtype), dtype)
    dist.all_reduce(x, op=op, group=g)
    if not members:
        return
    stack = np.stack([values(r, size, dtype) for r in members])
    check(x, _ref(opname, stack, dtype, len(members)), dtype)
    same_bytes_everywhere(g, x)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize("dtype", ["float32", "int64", "float16", "complex128", "bool"])
def test_broadcast_reduce_every_root(sgroup, size, dtype):
    g, members = sgroup
    for gr, root in enumerate(members):
        x = make("numpy", values(me(), size, dtype, salt=root), dtype)
        dist.broadcast(x, group=g, group_src=gr)
        check(x, values(root, size, dtype, salt=root), dtype)
        if dtype == "bool":
            continue
        mine = values(me(), size, dtype, salt=gr)
        y = make("numpy", mine, dtype)
        dist.reduce(y, group=g, group_dst=gr, op=ReduceOp.SUM)
        check(y, sum(values(r, size, dtype, salt=gr) for r in members) if me() == root else mine, dtype)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(("kind", "dtype"), [("numpy", "float64"), ("numpy", "uint8"), ("torch", "bfloat16")])
def test_gathers(sgroup, size, kind, dtype):
    g, members = sgroup
    need(kind, dtype)
    if not members:
        return
    n = len(members)
    out = empty(kind, (n, size), dtype)
    dist.all_gather_into_tensor(out, make(kind, values(me(), size, dtype), dtype), group=g)
    check(out, np.concatenate([values(r, size, dtype) for r in members]), dtype)
    outs = [empty(kind, (size,), dtype) for _ in members]
    dist.all_gather(outs, make(kind, values(me(), size, dtype, salt=3), dtype), group=g)
    for r, o in zip(members, outs):
        check(o, values(r, size, dtype, salt=3), dtype)
    uneven = [empty(kind, (1 + i,), dtype) for i in range(n)]  # uneven sizes: the MPI path, same answer
    dist.all_gather(uneven, make(kind, values(me(), 1 + members.index(me()), dtype), dtype), group=g)
    for i, (r, o) in enumerate(zip(members, uneven)):
        check(o, values(r, 1 + i, dtype), dtype)


@pytest.mark.parametrize("size", SIZES)
@pytest.mark.parametrize(("kind", "dtype"), [("numpy", "float32"), ("numpy", "int32"), ("torch", "bfloat16")])
@pytest.mark.parametrize("opname", ["SUM", "MAX", "AVG", "PREMUL_SUM"])
def test_reduce_scatter_forms(sgroup, size, kind, dtype, opname):
    g, members = sgroup
    need(kind, dtype)
    if not members:
        return
    n = len(members)
    gr = members.index(me())
    op = ReduceOp.PREMUL_SUM(2.0) if opname == "PREMUL_SUM" else getattr(ReduceOp, opname)
    full = np.stack([values(r, n * size, dtype) for r in members])
    ref = _ref(opname, full, dtype, n)[gr * size : (gr + 1) * size]
    out = empty(kind, (size,), dtype)
    dist.reduce_scatter_tensor(out, make(kind, values(me(), n * size, dtype), dtype), op=op, group=g)
    check(out, ref, dtype)
    ins = [make(kind, values(me(), n * size, dtype)[i * size : (i + 1) * size], dtype) for i in range(n)]
    out = empty(kind, (size,), dtype)
    dist.reduce_scatter(out, ins, op=op, group=g)
    check(out, ref, dtype)


@pytest.mark.parametrize("dtype", ["float32", "int64"])
def test_reduce_scatter_into_its_own_part_of_the_input(sgroup, dtype):
    """The output is this rank's chunk of the input (FSDP's in-place form): the rank's own part is read from
    the input it overwrites, so every rank past the first two must compute aside (fixed rank order kept)."""
    g, members = sgroup
    if not members:
        return
    n, gr, size = len(members), members.index(me()), 37
    inputs = [np.random.default_rng(r).standard_normal(n * size).astype(dtype) for r in members]
    ref = inputs[0].copy()
    for a in inputs[1:]:
        ref += a  # rank order
    x = inputs[gr].copy()
    out = x[gr * size : (gr + 1) * size]
    dist.reduce_scatter_tensor(out, x, group=g)
    assert out.tobytes() == ref[gr * size : (gr + 1) * size].tobytes()
    ins = [x[i * size : (i + 1) * size] for i in range(n)]
    x[:] = inputs[gr]
    dist.reduce_scatter(ins[gr], ins, group=g)
    assert ins[gr].tobytes() == ref[gr * size : (gr + 1) * size].tobytes()


def test_bitwise_identical_fixed_order(sgroup):
    """float32 sums of random data: equal bytes on every rank, equal to NumPy adding in rank order, run to run."""
    g, members = sgroup
    if not members:
        return
    size = 10_007  # prime: uneven slices, ~150 chunks
    inputs = [np.random.default_rng(r).standard_normal(size).astype(np.float32) for r in members]
    ref = inputs[0].copy()
    for a in inputs[1:]:
        ref += a  # ((x0 + x1) + x2) + x3: the engine's fixed order
    results = []
    for _ in range(2):
        x = inputs[members.index(me())].copy()
        dist.all_reduce(x, group=g)
        results.append(x)
    assert results[0].tobytes() == ref.tobytes()
    assert results[1].tobytes() == results[0].tobytes()
    same_bytes_everywhere(g, results[0])


def test_async_barrier_and_mixed_paths(sgroup):
    """async_op returns a completed Work; shared-memory and MPI calls interleave in one group."""
    g, members = sgroup
    if not members:
        assert dist.barrier(group=g) is None
        return
    x = np.full(50, float(me()))
    w = dist.all_reduce(x, group=g, async_op=True)
    assert w.wait() is True and w.is_completed()
    assert np.array_equal(x, np.full(50, float(sum(members))))
    ys = [np.full(3, float(me())) for _ in range(3)]
    works = [dist.all_reduce(y, group=g, async_op=True) for y in ys]
    dist.barrier(group=g)
    for w in works:
        w.wait()
    for y in ys:
        assert np.array_equal(y, np.full(3, float(sum(members))))
    objs = [None] * len(members)
    dist.all_gather_object(objs, me(), group=g)  # object collectives (MPI) in between
    assert objs == members


def test_empty_arrays(sgroup):
    """Zero elements: nothing moves, no segment step is taken, the group stays in step."""
    g, members = sgroup
    if not members:
        return
    n = len(members)
    e = np.zeros(0, np.float32)
    dist.all_reduce(e, group=g)
    dist.broadcast(e, group=g, group_src=0)
    dist.all_gather_into_tensor(np.zeros(0, np.float32), e, group=g)
    dist.reduce_scatter_tensor(np.zeros(0, np.float32), e, group=g)
    x = np.full(5, 1.0)
    dist.all_reduce(x, group=g)
    assert np.array_equal(x, np.full(5, float(n)))


@pytest.mark.parametrize("scale", [1, 40])  # 40: blocks larger than a 64-byte slot, so pieces cross chunks
@pytest.mark.parametrize("dtype", ["float64", "int16"])
def test_all_to_all_single_even_and_uneven(sgroup, scale, dtype):
    """all_to_all_single through shared memory against a NumPy reference, with even and uneven splits."""
    g, members = sgroup
    if not members:
        return
    n, i = len(members), members.index(me())

    def count(src: int, dst: int) -> int:
        return scale * (1 + (src * 7 + dst * 3) % 5)

    def block(src: int, dst: int) -> np.ndarray:
        return (1000 * src + 10 * dst + np.arange(count(src, dst))).astype(dtype)

    inp = np.concatenate([block(i, j) for j in range(n)])
    out = np.empty(sum(count(s, i) for s in range(n)), dtype=dtype)
    dist.all_to_all_single(out, inp, [count(s, i) for s in range(n)], [count(i, j) for j in range(n)], group=g)
    assert np.array_equal(out, np.concatenate([block(s, i) for s in range(n)]))
    even_in = np.concatenate([np.full(scale, 100 * i + j, dtype=dtype) for j in range(n)])
    even_out = np.empty_like(even_in)
    dist.all_to_all_single(even_out, even_in, group=g)
    assert np.array_equal(even_out, np.concatenate([np.full(scale, 100 * s + i, dtype=dtype) for s in range(n)]))


def test_all_to_all_single_split_sizes_that_disagree_raise_on_every_rank(sgroup):
    """The last rank expects one item more from the first than it sends: every rank raises DistError naming the
    pair (the shared-memory path wrote the wrong items silently; MPI truncates on one rank), and the group goes
    on working."""
    from hpcdist.errors import DistError

    g, members = sgroup
    if len(members) < 2:
        return
    n, i = len(members), members.index(me())
    sends = [2] * n
    recvs = [2] * n
    if i == n - 1:
        recvs[0] = 3
    out = np.full(sum(recvs), -1.0)
    from hpcdist.debug import DebugLevel, get_debug_level

    detail = get_debug_level() == DebugLevel.DETAIL  # the mpi-3-detail stage: DETAIL's size check catches it first
    said = (
        rf"group rank 0 \(global {members[0]}\) sends 2 items to group rank {n - 1} .* which expects 3"
        if detail
        else rf"group rank {n - 1} expects 3 items from group rank 0 .* sends it 2"
    )
    with pytest.raises(DistError, match=said):
        dist.all_to_all_single(out, np.arange(2.0 * n) + 100 * i, recvs, sends, group=g)
    ok = np.empty(2 * n)
    dist.all_to_all_single(ok, np.arange(2.0 * n) + 100 * i, group=g)
    assert np.array_equal(ok, np.concatenate([np.arange(2.0 * i, 2.0 * i + 2) + 100 * s for s in range(n)]))


def test_detail_mode_refuses_arrays_that_share_memory_in_one_coalesced_call(sgroup):
    """An array listed twice (or overlapping views) would be reduced twice on the shared-memory path, which copies
    results back while it still reads later chunks: DETAIL mode refuses it on every rank, before the operation
    begins on the segment (the group goes on working); distinct arrays pass."""
    from hpcdist.debug import DebugLevel, get_debug_level, set_debug_level

    g, members = sgroup
    if len(members) < 2:
        return
    before = get_debug_level()
    set_debug_level(DebugLevel.DETAIL)
    try:
        x = np.ones(500)
        base = np.ones(1000)
        for arrays, pair in (([x, np.ones(3), x], "tensors\\[0\\] and tensors\\[2\\]"), ([base[:600], base[400:]], "")):
            for fn in (dist.all_reduce_coalesced, dist.all_reduce_bucketed):  # bucketed: before any bucket
                with pytest.raises(ValueError, match=f"{pair}.*share memory"):
                    fn(arrays, group=g)
            assert np.all(x == 1.0) and np.all(base == 1.0)
        a, b = np.ones(500), np.full(300, 2.0)
        dist.all_reduce_coalesced([a, b, base[:400], base[600:]], group=g)
        assert np.all(a == len(members)) and np.all(b == 2 * len(members)) and np.all(base[:400] == len(members))
    finally:
        set_debug_level(before)


def test_direct_reads_are_agreed_one_rank_without_them_turns_them_off_everywhere():
    """The last rank sets HPCDIST_SHM_DIRECT=0: the probe answers no on every rank (ranks taking different
    algorithms would deadlock or exchange garbage), and the collectives still give the right answers."""
    n = dist.get_world_size()
    knobs = {"HPCDIST_SHM": "1", "HPCDIST_SHM_DIRECT": "0" if me() == n - 1 else "1"}
    with knobs_set(knobs):
        g = dist.new_group()
        eng = g.engine("cpu")
    x = np.arange(1000, dtype=np.float64) * (me() + 1)
    dist.all_reduce(x, group=g)
    assert np.array_equal(x, np.arange(1000, dtype=np.float64) * (n * (n + 1) // 2))
    if n > 1:
        assert isinstance(eng, ShmEngine) and eng.direct_allowed == (me() != n - 1)
        assert eng.reads_directly is False


def test_node_cpus_is_the_union_of_its_ranks_affinity_and_the_same_everywhere():
    """init's layout exchange gives every rank its node's CPUs (the union of the node's ranks' affinity sets;
    here they are identical or disjoint, where the count is exact), the same on every rank: the oversubscribed
    table is then chosen alike on every rank."""
    from mpi4py import MPI

    from hpcdist._world import WORLD

    mine = (WORLD.node_of[me()], sorted(os.sched_getaffinity(0)))
    everyone = MPI.COMM_WORLD.allgather(mine)
    sets = [set(cpus) for node, cpus in everyone if node == mine[0]]
    if not all(a == b or not a & b for a in sets for b in sets):
        pytest.skip("the node's ranks have partly overlapping affinity sets: the count is an estimate there")
    assert WORLD.node_cpus[me()] == len(set().union(*sets))
    assert MPI.COMM_WORLD.allgather(WORLD.node_cpus) == [WORLD.node_cpus] * dist.get_world_size()


def test_slot_sizes_that_differ_between_ranks_raise_on_every_rank():
    """HPCDIST_SHM_SLOT is read by each rank: where they differ, the ranks laid the segment out differently (wrong
    sums on one rank, a timeout or a bare mmap ValueError on another, a file left in /dev/shm). Now every rank
    raises the same DistError at setup, naming the variable, and no file is left."""
    import glob

    from hpcdist.errors import DistError

    if dist.get_world_size() < 2:
        pytest.skip("needs two ranks")
    with knobs_set({"HPCDIST_SHM": "1", "HPCDIST_SHM_SLOT": "64" if me() == 0 else "128"}):
        g = dist.new_group()
        g.engine("cpu")
    try:
        x = np.ones(1000)
        for _ in range(2):  # the setup is tried again by the next call, and fails alike
            with pytest.raises(DistError, match=r"the ranks disagree on its size .*HPCDIST_SHM_SLOT"):
                dist.all_reduce(x, group=g)
        assert np.all(x == 1.0)
    finally:
        dist.destroy_process_group(g)
    dist.barrier()
    assert not [p for p in glob.glob("/dev/shm/hpcdist-*") if f"-{os.getpid()}-" in p]


@contextlib.contextmanager
def table_group(rows: dict, tmp_path, name: str = "table.json"):
    """A new group (collective) whose engine was built with ``HPCDIST_SHM=auto`` and ``HPCDIST_SHM_TABLE`` naming
    a file of ``rows`` (each rank writes its own), on a node taken as not oversubscribed (where it is, every
    operation takes shared memory whatever the table says: a rule of its own, tested in test_shm_units)."""
    from hpcdist.backends.shm import engine as shm_engine
    from hpcdist.backends.shm import table

    path = tmp_path / name
    path.write_text(table.dumps(rows, "test rows", "now"))
    real = shm_engine.oversubscribed_node
    shm_engine.oversubscribed_node = lambda: False
    try:
        with knobs_set({"HPCDIST_SHM": "auto", "HPCDIST_SHM_TABLE": str(path)}):
            g = dist.new_group()
            g.engine("cpu")
    finally:
        shm_engine.oversubscribed_node = real
    try:
        yield g, str(path)
    finally:
        dist.destroy_process_group(g)


def test_a_table_file_decides_which_calls_take_shared_memory(tmp_path):
    """HPCDIST_SHM_TABLE's window for all_reduce (64 B to 4 KiB here) is where the segment runs: a call inside
    begins an operation on the segment, one outside does not, and every one gives NumPy's sum; an operation the
    file lacks keeps the built-in row."""
    from hpcdist.backends.shm import table

    n = dist.get_world_size()
    if n < 2:
        pytest.skip("needs two ranks: one rank has nothing to share")
    rows = {"all_reduce": {2: (64, 4096)}}
    with table_group(rows, tmp_path) as (g, path):
        eng = g.engine("cpu")
        assert isinstance(eng, ShmEngine) and eng.selection.source == path
        assert eng.windows["all_reduce"] == (64, 4096)  # the file's row, for any group size (the largest listed)
        assert eng.windows["broadcast"] == table.window("broadcast", n, "auto", False, table.TABLE)
        dist.barrier(group=g)
        for count, where in ((8, "mpi"), (16, "shm"), (1023, "shm"), (1024, "mpi"), (5000, "mpi")):  # float32
            x = np.arange(count, dtype=np.float32) + me()
            seg = eng._seg
            before = seg.seq if seg else 0
            dist.all_reduce(x, group=g)
            seg = eng._seg
            after = seg.seq if seg else 0
            assert np.array_equal(x, n * np.arange(count, dtype=np.float32) + n * (n - 1) / 2), count
            assert ("shm" if after > before else "mpi") == where == eng.path("all_reduce", 4 * count), count


def test_table_files_that_differ_between_ranks_raise_on_every_rank(tmp_path):
    """Ranks of a node that read different tables would take different paths for one call (a timeout, or garbage):
    they compare their choices when the segment is set up, and every rank raises the same DistError naming the
    variables; nothing moved, no file is left, and the next call fails alike."""
    import glob

    from hpcdist.backends.shm import table
    from hpcdist.errors import DistError

    if dist.get_world_size() < 2:
        pytest.skip("needs two ranks")
    rows = {"all_reduce": {2: table.ALWAYS if me() == 0 else (0, 1 << 20)}}
    with table_group(rows, tmp_path) as (g, _):
        x = np.ones(1000)  # 8000 B: shared memory by either table
        for _ in range(2):
            with pytest.raises(DistError, match=r"disagree on which operations take shared memory.*HPCDIST_SHM_TABLE"):
                dist.all_reduce(x, group=g)
        assert np.all(x == 1.0)
    dist.barrier()
    assert not [p for p in glob.glob("/dev/shm/hpcdist-*") if f"-{os.getpid()}-" in p]


def test_table_files_alike_in_content_agree(tmp_path):
    """The comparison is of the choices, not of the files: each rank's own file with the same rows works."""
    from hpcdist.backends.shm import table

    n = dist.get_world_size()
    if n < 2:
        pytest.skip("needs two ranks")
    with table_group({"all_reduce": {2: table.ALWAYS}}, tmp_path, f"rank{me()}.json") as (g, _):
        x = np.full(1000, float(me()))
        dist.all_reduce(x, group=g)
        assert np.all(x == n * (n - 1) / 2) and g.engine("cpu")._seg.seq > 0
