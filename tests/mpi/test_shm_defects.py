"""Defects of the shared-memory engine found by adversarial rounds, each pinned over the group matrix.

The groups are forced onto shared memory (``HPCDIST_SHM=1``) with 64-byte
slots, through the segment and with direct reads (whose reductions also step
through 64-byte chunks), so small arrays cross many pipelined chunks. The
references are NumPy: what MPI's path gives (each output slot written in rank
order, every input read before any output is written).
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from matrix import GROUP_KINDS, members_of
from mpi_arrays import values
from test_shm import SLOT, groups_with, knobs_set, same_bytes_everywhere

import hpcdist as dist
from hpcdist.backends.shm import ShmEngine, direct
from hpcdist.bucketing import bucket_views

M = 40  # items per rank: several 64-byte chunks


def me() -> int:
    return dist.get_rank()


@pytest.fixture(scope="module", params=["direct", "segment"])
def shm_groups(request):
    knobs = {
        "HPCDIST_SHM": "1",
        "HPCDIST_SHM_SLOT": str(SLOT),
        "HPCDIST_SHM_DIRECT": str(int(request.param == "direct")),
    }
    groups = groups_with(knobs)
    chunk, direct.CHUNK_BYTES = direct.CHUNK_BYTES, SLOT
    yield groups
    direct.CHUNK_BYTES = chunk
    for g in groups.values():
        if g is not None and members_of(g):
            dist.destroy_process_group(g)


@pytest.fixture(params=GROUP_KINDS)
def sgroup(request, shm_groups):
    g = shm_groups[request.param]
    members = members_of(g)
    if len(members) < 2:
        pytest.skip("needs a shared-memory group of 2 or more ranks")
    assert isinstance(g.engine("cpu"), ShmEngine)
    return g, members


@pytest.mark.parametrize("step", [1, 3, M // 2])
def test_all_gather_into_overlapping_views_writes_slots_in_rank_order(sgroup, step):
    """The output slots are views of one buffer that overlap (slot ``r`` starts ``step`` items after slot
    ``r - 1``): MPI's path writes them in rank order, the later slot winning, the same on every rank. The
    staggered reads of shared memory left each rank a different mix."""
    g, members = sgroup
    n = len(members)
    buf = np.zeros(step * (n - 1) + M)
    outs = [buf[r * step : r * step + M] for r in range(n)]
    dist.all_gather(outs, values(me(), M, "float64", salt=1) + 100 * me(), group=g)
    want = np.zeros_like(buf)
    for r, q in enumerate(members):
        want[r * step : r * step + M] = values(q, M, "float64", salt=1) + 100 * q
    same_bytes_everywhere(g, buf)  # first: every rank fails alike
    assert np.array_equal(buf, want), (buf, want)


@pytest.mark.parametrize("shift", [1, 7, M - 1, -1, -7])
def test_all_gather_input_overlapping_the_outputs_is_read_before_they_are_written(sgroup, shift):
    """The input is ``shift`` items off this rank's slot of the outputs (one buffer): it must be gathered as it
    was before the call. Chunks of the segment's path read input that earlier chunks had written over."""
    g, members = sgroup
    n, gr = len(members), members.index(me())
    buf = np.zeros((n + 2) * M)
    outs = [buf[(r + 1) * M : (r + 2) * M] for r in range(n)]
    at = (gr + 1) * M + shift
    buf[at : at + M] = values(me(), M, "float64", salt=2)
    dist.all_gather(outs, buf[at : at + M], group=g)
    for r, q in enumerate(members):
        assert np.array_equal(outs[r], values(q, M, "float64", salt=2)), (r, outs[r])


@pytest.mark.parametrize("into", ["own", "next"])
@pytest.mark.parametrize("shift", [1, 3, M // 2, M - 1])
def test_reduce_scatter_output_overlapping_the_inputs_gets_the_sum_of_the_inputs(sgroup, into, shift):
    """The inputs are rows of one buffer and the output overlaps this rank's row (or the next rank's), ``shift``
    items off: the result is the sum of the inputs as they were before the call. The segment's path wrote
    result chunks over input it had still to read."""
    g, members = sgroup
    n, gr = len(members), members.index(me())
    buf = np.concatenate([values(me(), M, "int64", salt=r) for r in range(n)] + [np.zeros(M, np.int64)])
    ins = [buf[r * M : (r + 1) * M] for r in range(n)]
    row = gr if into == "own" else (gr + 1) % n
    out = buf[row * M + shift : row * M + shift + M]
    dist.reduce_scatter(out, ins, group=g)
    want = sum(values(q, M, "int64", salt=gr) for q in members)
    assert np.array_equal(out, want), (out, want)


def test_all_gather_one_array_in_every_slot_on_one_rank_only_takes_the_same_path():
    """Rank 0 lists one array in every slot, the others distinct arrays: a legal call whose path must not depend
    on it. Rank 0 took MPI's path and the others shared memory: each waited for the other until the timeout."""
    n = dist.get_world_size()
    if n < 2:
        pytest.skip("needs 2 or more ranks")
    with knobs_set({"HPCDIST_SHM": "1", "HPCDIST_SHM_SLOT": str(SLOT)}):
        g = dist.new_group(timeout=timedelta(seconds=20))
        assert isinstance(g.engine("cpu"), ShmEngine)
    try:
        x = values(me(), M, "float64") + 10 * me()
        if me() == 0:
            o = np.zeros(M)
            outs = [o] * n
        else:
            outs = [np.zeros(M) for _ in range(n)]
        dist.all_gather(outs, x, group=g)
        for r in range(n):
            want = values(n - 1 if me() == 0 else r, M, "float64") + 10 * (n - 1 if me() == 0 else r)
            assert np.array_equal(outs[r], want), (r, outs[r])
    finally:
        dist.destroy_process_group(g)


@pytest.mark.parametrize(
    ("args", "error", "words"),
    [
        (([3.0],), TypeError, "shapes[0] must be an int or a tuple of ints, got 3.0"),
        (([4, "ab"],), TypeError, "shapes[1] must be an int or a tuple of ints, got 'ab'"),
        (([(2, 1.5)],), TypeError, "shapes[0] must be an int or a tuple of ints, got (2, 1.5)"),
        ((None,), TypeError, "shapes must be a list of shapes (ints or tuples of ints), got None"),
        (([3], "torch.float32"), TypeError, "dtype must be a NumPy dtype"),
        (([(2, -1)],), ValueError, "shapes must have no negative dimension"),
    ],
)
def test_bucket_views_argument_errors_name_the_argument_and_the_value(args, error, words):
    """A shape that is no int or tuple of ints, or a dtype NumPy does not know: NumPy's own message named neither
    the argument nor the value ("'float' object is not iterable", "Cannot interpret ... as a data type")."""
    with pytest.raises(error) as info:
        bucket_views(*args)
    assert words in str(info.value)


def test_bucket_views_take_numpy_integers_as_lengths():
    """Sizes computed with NumPy (``np.int64``) are 1-D lengths as Python ints are (they raised TypeError)."""
    flat, views = bucket_views([np.int64(3), (np.int64(2), 2)], dtype=np.float64)
    assert flat.shape == (7,) and flat.dtype == np.float64
    assert [v.shape for v in views] == [(3,), (2, 2)]
    views[1][...] = 5.0
    assert np.array_equal(flat, [0, 0, 0, 5, 5, 5, 5])


_KIND_CASES = {  # what the last rank passes instead (as many bytes): the error names both
    "dtype": (lambda a: a.view(np.int64), {}, "all_reduce of 320 bytes (float64, SUM)", "(int64, SUM)"),
    "op": (lambda a: a, {"op": dist.ReduceOp.MAX}, "all_reduce of 320 bytes (float64, SUM)", "(float64, MAX)"),
}


@pytest.mark.parametrize("case", list(_KIND_CASES))
def test_as_many_bytes_of_another_dtype_or_op_raise_on_every_rank(case):
    """The segment's tag held the op and the size only: float64 on some ranks and int64 on another (or SUM and
    MAX) mixed into a wrong result with no error. Now every rank raises DistError naming both calls."""
    from hpcdist.debug import DebugLevel, get_debug_level, set_debug_level

    n = dist.get_world_size()
    if n < 2:
        pytest.skip("needs 2 or more ranks")
    with knobs_set({"HPCDIST_SHM": "1", "HPCDIST_SHM_SLOT": str(SLOT)}):
        g = dist.new_group()
        assert isinstance(g.engine("cpu"), ShmEngine)
    twist, kwargs, mine, theirs = _KIND_CASES[case]
    x = np.arange(M, dtype=np.float64) + me()
    before = get_debug_level()
    set_debug_level(DebugLevel.OFF)  # the segment's own check, not DETAIL's
    try:
        with pytest.raises(dist.DistError, match="called different collectives") as info:
            if me() == n - 1:
                dist.all_reduce(twist(x), group=g, **kwargs)
            else:
                dist.all_reduce(x, group=g)
    finally:
        set_debug_level(before)
        dist.destroy_process_group(g)
    text = str(info.value)
    assert mine in text and theirs in text, text
