"""Audit of the device paths that go through MPI: the staged engine (pinned host staging), the CUDA-aware
engine, the device array adapters, and how collectives.py / p2p.py route device arrays to them.

Each test's docstring starts with SUSPECT (written to show a defect found by reading; each failed on the H100
on 2026-11-27 before its fix, and passes since) or GUARD (a risky edge that worked). Only the staged and CUDA-aware paths of conftest.py run here (NCCL skips).
Every test works at 1 and 2 ranks (point-to-point ones skip at 1) and is SPMD-safe: every rank makes the same
collective calls in the same order; checks that could fail on one rank only run after the last message.
References: NumPy on host copies, or hpcdist's host path on the same data.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
from gpu_arrays import gpu_missing, me, n, spin, torch, torch_cuda

import hpcdist as dist

pytestmark = pytest.mark.timeout(60)

cp = pytest.importorskip("cupy", reason="the GPU tests need CuPy (pip install 'hpcdist[gpu]')")
_why = gpu_missing()
if _why is not None:
    pytest.skip(_why, allow_module_level=True)


def mpi_paths_only(gpu_path) -> None:
    """Skip on conftest's NCCL pass (``gpu_path`` is the pass's groups; the default group's backend names it)."""
    if "nccl" in dist.get_backend():
        pytest.skip("this audit covers the MPI device paths (staged, CUDA-aware)")


def two_ranks(gpu_path: str) -> None:
    mpi_paths_only(gpu_path)
    if n() < 2:
        pytest.skip("needs two ranks")


def pipelined_items(itemsize: int) -> int:
    """Items of an array the staged engine pipelines (two PIPELINE_CHUNKs and more), with a ragged end."""
    from hpcdist.backends.staged.engine import PIPELINE_CHUNK

    return (2 * PIPELINE_CHUNK + PIPELINE_CHUNK // 2) // itemsize + 3


def outcome(call) -> str | None:
    """None when ``call()`` returned, else 'ExceptionType: message' (so that every rank goes on in step)."""
    try:
        call()
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"
    return None


# ---------------------------------------------------------------- SUSPECT: receives shorter than the array


def test_recv_of_a_shorter_message_leaves_the_rest_of_the_device_array_as_it_was(gpu_path):
    """SUSPECT (staged path): docs/sharp-bits.md:408 says a receive may be larger than the message and "the rest of
    the array is left as it was" (the host path does so: MPI writes only the message). The staged engine's recv
    (hpcdist/backends/staged/engine.py:341) stages the whole receive array through a pinned block that is never
    filled from the device (reads=[]; _Staging.host, engine.py:44-56, takes a reused block from the pool,
    pinned.py:66), MPI writes only the message's bytes into it, and the completion step (back, engine.py:142-147)
    copies the whole block back: the tail of the user's array gets whatever an earlier call left in that block
    (here 7 x n from the all_reduce just before, which frees its block to the pool). On the CUDA-aware path MPI
    writes the device memory itself, which this test guards."""
    two_ranks(gpu_path)
    want = np.full(16, -1.0)
    want[:4] = [1.0, 2.0, 3.0, 4.0]
    host = np.full(16, -1.0)  # the host path, the reference
    if me() == 0:
        dist.send(np.arange(1.0, 5.0), dst=1)
    elif me() == 1:
        dist.recv(host, src=0)
    dirty = cp.full(16, 7.0, dtype=cp.float64)  # 128 bytes: the same 4 KiB pinned class as the receive below
    dist.all_reduce(dirty)
    got = None
    if me() == 0:
        dist.send(cp.arange(1.0, 5.0, dtype=cp.float64), dst=1)
    elif me() == 1:
        buf = cp.full(16, -1.0, dtype=cp.float64)
        assert dist.recv(buf, src=0) == 0
        got = cp.asnumpy(buf)
    if me() == 1:
        assert np.array_equal(host, want), host
        assert np.array_equal(got, want), f"device receive wrote past the message: {got}"


def test_batched_irecv_after_a_large_pipelined_call_shows_none_of_its_data(gpu_path):
    """SUSPECT (staged path): the same defect through batch_isend_irecv/irecv (engine.py:341, back at 142-147),
    after a large then small sequence: the pipelined all_reduce (engine.py:190-242) returns its 16 MiB-class pinned
    block to the pool (engine.py:239) holding its result (3 x n); a receive of 1000 items into an array of that
    size class gets that block (pinned.py:66) and the copy-back writes its stale tail over the user's array, which
    must stay -1 (docs/sharp-bits.md:408; the CUDA-aware path leaves it, as the host path does)."""
    two_ranks(gpu_path)
    count = pipelined_items(4)
    big = cp.full(count, 3.0, dtype=cp.float32)
    dist.all_reduce(big)
    small = 1000
    buf = None
    works = []
    if me() == 0:
        works = dist.batch_isend_irecv([dist.P2POp(dist.isend, cp.arange(small, dtype=cp.float32), 1)])
    elif me() == 1:
        buf = cp.full(count, -1.0, dtype=cp.float32)
        works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, buf, 0)])
    for w in works:
        w.wait()
    if me() == 1:
        got = cp.asnumpy(buf)
        assert np.array_equal(got[:small], np.arange(small, dtype=np.float32))
        tail = got[small:]
        assert (tail == -1.0).all(), f"stale data from an earlier call in the receive array: {np.unique(tail)[:5]}"
        assert float(big[0]) == 3.0 * n()


def test_recv_of_a_shorter_message_into_a_strided_cuda_tensor(gpu_path):
    """SUSPECT (staged path; torch CUDA tensors run there only): a strided torch view is received through a
    contiguous copy (adapters.py:260-277) that holds the view's values, but the staged engine copies its pinned
    twin over that copy in full (engine.py:142-147, twin never filled: reads=[] at engine.py:342), so the view's
    elements past the message get the block's stale bytes instead of staying -1 (docs/sharp-bits.md:408). The
    other column of the base tensor must stay untouched too."""
    two_ranks(gpu_path)
    if not torch_cuda():
        pytest.skip("torch has no CUDA here (or the CUDA-aware path runs on managed memory)")
    dirty = torch.full((16,), 5.0, dtype=torch.float64, device="cuda")  # 128 bytes: the receive's pinned class
    dist.all_reduce(dirty)
    base = None
    if me() == 0:
        dist.send(torch.arange(1.0, 5.0, dtype=torch.float64, device="cuda"), dst=1)
    elif me() == 1:
        base = torch.full((16, 2), -1.0, dtype=torch.float64, device="cuda")
        dist.recv(base[:, 0], src=0)
    if me() == 1:
        got = base.cpu().numpy()
        want = np.full((16, 2), -1.0)
        want[:4, 0] = [1.0, 2.0, 3.0, 4.0]
        assert np.array_equal(got, want), f"strided receive wrote past the message: {got[:, 0]}"


# ---------------------------------------------------------------- GUARD: point to point


def test_recv_of_a_longer_message_fails_cleanly_on_device(gpu_path, request):
    """GUARD: a message larger than the device receive array raises DistBackendError (MPI_ERR_TRUNCATE, through
    Work._fail, work.py) from recv and from an irecv's wait(); the irecv's Work stays failed; on the staged path
    the failed Work's copy-back never runs (work.py _fail clears _post), so the device array is untouched."""
    two_ranks(gpu_path)
    said = waited = None
    success = None
    blocking = later = None
    if me() == 0:
        dist.send(cp.arange(8, dtype=cp.float64), dst=1)
        dist.send(cp.arange(8, dtype=cp.float64), dst=1, tag=1)
    elif me() == 1:
        blocking = cp.full(4, -1.0, dtype=cp.float64)
        said = outcome(lambda: dist.recv(blocking, src=0))
        later = cp.full(4, -1.0, dtype=cp.float64)
        w = dist.irecv(later, src=0, tag=1)
        waited = outcome(w.wait)
        success = w.is_completed() and not w.is_success()
    x = cp.ones(3)
    dist.all_reduce(x)  # the group is still usable
    assert cp.asnumpy(x).tolist() == [float(n())] * 3
    if me() == 1:
        assert said is not None and said.startswith("DistBackendError") and "larger than the receive" in said, said
        assert waited is not None and waited.startswith("DistBackendError"), waited
        assert success
        if request.node.callspec.params.get("gpu_path") == "staged":
            assert cp.asnumpy(blocking).tolist() == [-1.0] * 4
            assert cp.asnumpy(later).tolist() == [-1.0] * 4


def test_point_to_point_between_host_and_device_arrays_with_tags_and_any_source(gpu_path):
    """GUARD: the host engine and the device engine post on the same communicator (StagedEngine.host and
    CudaAwareEngine.host are MPIEngines on pg._comm, as the host ShmEngine), so a NumPy send matches a CuPy receive
    and back; tags select messages whatever the posting order; an irecv from any source names its sender."""
    two_ranks(gpu_path)
    got = {}
    if me() == 0:
        dist.send(np.arange(1.0, 5.0), dst=1, tag=3)
        ws = [dist.isend(cp.full(3, 7.0), dst=1, tag=7), dist.isend(cp.full(3, 8.0), dst=1, tag=8)]
        for w in ws:
            w.wait()
        back = np.zeros(2)
        dist.recv(back, src=1, tag=5)
        got["back"] = back.tolist()
        dist.send(cp.arange(3, dtype=cp.int64) + 40, dst=1, tag=9)
    elif me() == 1:
        first = cp.zeros(4)
        dist.recv(first, src=0, tag=3)
        eight, seven = cp.zeros(3), cp.zeros(3)
        w8 = dist.irecv(eight, src=0, tag=8)
        w7 = dist.irecv(seven, src=0, tag=7)
        w8.wait()
        w7.wait()
        dist.send(cp.arange(2.0) + 50, dst=0, tag=5)
        anyone = cp.zeros(3, dtype=cp.int64)
        wa = dist.irecv(anyone, tag=9)
        wa.wait()
        got.update(
            first=cp.asnumpy(first).tolist(),
            eight=cp.asnumpy(eight).tolist(),
            seven=cp.asnumpy(seven).tolist(),
            anyone=cp.asnumpy(anyone).tolist(),
            source=wa.source_rank(),
        )
    if me() == 0:
        assert got["back"] == [50.0, 51.0]
    elif me() == 1:
        assert got["first"] == [1.0, 2.0, 3.0, 4.0]
        assert got["eight"] == [8.0] * 3 and got["seven"] == [7.0] * 3
        assert got["anyone"] == [40, 41, 42] and got["source"] == 0


# ---------------------------------------------------------------- GUARD: argument checks before any message


def test_host_and_device_arrays_mixed_in_one_call_are_refused_on_every_rank(gpu_path):
    """GUARD: torch refuses a call mixing CPU and CUDA tensors; hpcdist's checks (collectives.py _same, _same_kind,
    _per_rank) raise ValueError on every rank before anything moves (the host lanes do not take a device array),
    and the group stays in step."""
    mpi_paths_only(gpu_path)
    k, N = 3, n()
    calls = {
        "all_gather_into_tensor(cupy out, numpy in)": lambda: dist.all_gather_into_tensor(cp.zeros(N * k), np.zeros(k)),
        "all_gather_into_tensor(numpy out, cupy in)": lambda: dist.all_gather_into_tensor(np.zeros(N * k), cp.zeros(k)),
        "reduce_scatter_tensor(cupy out, numpy in)": lambda: dist.reduce_scatter_tensor(cp.zeros(k), np.zeros(N * k)),
        "reduce_scatter_tensor(numpy out, cupy in)": lambda: dist.reduce_scatter_tensor(np.zeros(k), cp.zeros(N * k)),
        "all_to_all_single(cupy out, numpy in)": lambda: dist.all_to_all_single(cp.zeros(N * k), np.zeros(N * k)),
        "all_gather(cupy list, numpy in)": lambda: dist.all_gather([cp.zeros(k) for _ in range(N)], np.zeros(k)),
        "all_gather(numpy list, cupy in)": lambda: dist.all_gather([np.zeros(k) for _ in range(N)], cp.zeros(k)),
        "all_to_all(numpy outs, cupy ins)": lambda: dist.all_to_all(
            [np.zeros(k) for _ in range(N)], [cp.zeros(k) for _ in range(N)]
        ),
        "reduce_scatter(cupy out, numpy list)": lambda: dist.reduce_scatter(
            cp.zeros(k), [np.zeros(k) for _ in range(N)]
        ),
        "all_reduce_coalesced([cupy, numpy])": lambda: dist.all_reduce_coalesced([cp.zeros(k), np.zeros(k)]),
    }
    got = {name: outcome(call) for name, call in calls.items()}
    x = cp.ones(2)
    dist.all_reduce(x)
    assert cp.asnumpy(x).tolist() == [float(N)] * 2
    for name, said in got.items():
        assert said is not None and said.startswith("ValueError") and "device" in said, (name, said)


def test_output_and_input_dtypes_that_differ_are_refused_on_every_rank(gpu_path):
    """GUARD: torch requires one dtype for input and output; all_gather_into_tensor, reduce_scatter_tensor,
    all_to_all_single, all_gather and all_to_all on device arrays raise TypeError on every rank before anything
    moves (collectives.py _same/_same_kind); the output is left untouched."""
    mpi_paths_only(gpu_path)
    k, N = 3, n()
    out64 = cp.full(N * k, -1.0, dtype=cp.float64)
    calls = {
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(out64, cp.zeros(k, dtype=cp.float32)),
        "reduce_scatter_tensor": lambda: dist.reduce_scatter_tensor(
            cp.zeros(k, dtype=cp.float32), cp.zeros(N * k, dtype=cp.float64)
        ),
        "all_to_all_single": lambda: dist.all_to_all_single(
            cp.zeros(N * k, dtype=cp.int32), cp.zeros(N * k, dtype=cp.int64)
        ),
        "all_gather": lambda: dist.all_gather(
            [cp.zeros(k, dtype=cp.float32) for _ in range(N)], cp.zeros(k, dtype=cp.float64)
        ),
        "all_to_all": lambda: dist.all_to_all(
            [cp.zeros(k, dtype=cp.float16) for _ in range(N)], [cp.zeros(k, dtype=cp.float32) for _ in range(N)]
        ),
    }
    if torch_cuda():
        calls["all_gather_into_tensor(torch bfloat16 out, float16 in)"] = lambda: dist.all_gather_into_tensor(
            torch.zeros(N * k, dtype=torch.bfloat16, device="cuda"), torch.zeros(k, dtype=torch.float16, device="cuda")
        )
    got = {name: outcome(call) for name, call in calls.items()}
    x = cp.ones(2)
    dist.all_reduce(x)
    assert cp.asnumpy(x).tolist() == [float(N)] * 2
    for name, said in got.items():
        assert said is not None and said.startswith(("TypeError", "DtypeMismatchError")), (name, said)  # a TypeError
        assert "dtype" in said, (name, said)
    assert (cp.asnumpy(out64) == -1.0).all()


def test_device_checks_refuse_another_device_a_host_array_and_a_bound_device(gpu_path):
    """GUARD: one GPU here, so the wrong-device errors of check_devices (gpu/streams.py:57-81), which both MPI
    device engines call first, are driven with Bufs that claim another ordinal: an array on another device than
    the current one, a host array mixed in, a group bound (device_id=) to another device all raise ValueError."""
    mpi_paths_only(gpu_path)
    from hpcdist.buffers.adapters import Buf
    from hpcdist.gpu.streams import check_devices

    cur = int(cp.cuda.runtime.getDevice())
    x = cp.zeros(2)
    good = Buf(x, x, "float64", "cuda", None, cur)
    other = Buf(x, x, "float64", "cuda", None, cur + 1)
    host = Buf(np.zeros(2), None, "float64")
    pg = SimpleNamespace(bound_device_id=None, group_name="g")
    assert check_devices([good], pg, "op") == cur
    with pytest.raises(ValueError, match="current CUDA device"):
        check_devices([good, other], pg, "op")
    with pytest.raises(ValueError, match="mixed with CUDA arrays"):
        check_devices([good, host], pg, "op")
    with pytest.raises(ValueError, match="is bound to"):
        check_devices([good], SimpleNamespace(bound_device_id=cur + 1, group_name="g"), "op")


# ---------------------------------------------------------------- GUARD: shapes and layouts


def test_zero_size_and_zero_dimensional_device_arrays(gpu_path):
    """GUARD: tests/mpi's test_zero_size_and_scalar is host-only (test_gpu_collectives.py leaves it out): 0-d and
    empty CuPy arrays (and torch CUDA tensors on the staged path) through all_reduce, broadcast,
    all_gather_into_tensor and reduce_scatter_tensor (a 0-d twin in host_view, pinned.py; a 0-d CuPy array handed
    to MPI by its __cuda_array_interface__ on the CUDA-aware path; an empty torch tensor's null data pointer in
    UnownedMemory, adapters.py:267)."""
    mpi_paths_only(gpu_path)
    N = n()
    s = cp.array(float(me() + 1))
    dist.all_reduce(s)
    b = cp.array(float(3 * me() + 5))
    dist.broadcast(b, src=0)
    e = cp.zeros(0)
    dist.all_reduce(e)
    dist.broadcast(e, src=0)
    g = cp.full(N, -1.0)
    dist.all_gather_into_tensor(g, cp.array(float(me())))
    dist.all_gather_into_tensor(cp.zeros(0), cp.zeros(0))
    r0 = cp.array(-1.0)
    dist.reduce_scatter_tensor(r0, cp.arange(N, dtype=cp.float64) + me())
    t0 = tz = None
    if torch_cuda():
        t0 = torch.tensor(float(me() + 1), device="cuda")
        dist.all_reduce(t0)
        tz = torch.zeros(0, device="cuda")
        dist.all_reduce(tz)
    assert s.shape == () and float(s) == N * (N + 1) / 2
    assert float(b) == 5.0
    assert e.shape == (0,)
    assert cp.asnumpy(g).tolist() == [float(r) for r in range(N)]
    assert float(r0) == N * me() + sum(range(N))
    if t0 is not None:
        assert t0.shape == () and float(t0) == N * (N + 1) / 2 and tz.numel() == 0


def test_strided_transposed_and_reversed_device_outputs(gpu_path):
    """GUARD: outputs that are not C-contiguous go through a contiguous copy and a write-back (adapters.py:168-183,
    260-277) on both engines (staged: _writeback after the copy up, engine.py:86-90; CUDA-aware: the host engine's
    post or finish_reduce/unpack): a reversed CuPy view as broadcast output, a transposed all_gather_into_tensor
    output (rank r's input in row r), every other element as reduce_scatter_tensor and scatter output, strided
    gather outputs, a transposed all_to_all_single output; the memory around each view stays as it was."""
    mpi_paths_only(gpu_path)
    N, k = n(), 3
    base = cp.arange(8.0) + 10 * me()
    dist.broadcast(base[::-1], src=0)
    out_t = cp.zeros((k, N)).T
    dist.all_gather_into_tensor(out_t, cp.arange(k, dtype=cp.float64) + 10 * me())
    holder = cp.full(2 * k, -5.0)
    dist.reduce_scatter_tensor(holder[::2], cp.arange(N * k, dtype=cp.float64) + me())
    holder2 = cp.full(2 * k, -5.0)
    scatter_list = [cp.arange(k, dtype=cp.float64) + 100 * r for r in range(N)] if me() == 0 else None
    dist.scatter(holder2[1::2], scatter_list, src=0)
    gather_bases = [cp.full((k, 2), -5.0) for _ in range(N)] if me() == 0 else None
    gather_list = [gb[:, 1] for gb in gather_bases] if gather_bases is not None else None
    dist.gather(cp.arange(k, dtype=cp.float64) + 7 * me(), gather_list, dst=0)
    a2a_out = cp.zeros((2, N)).T  # N rows of 2: row j from rank j
    dist.all_to_all_single(a2a_out, cp.arange(2 * N, dtype=cp.float64).reshape(N, 2) + 100 * me())
    t_out = None
    if torch_cuda():
        t_out = torch.zeros(k, N, device="cuda").t()
        dist.all_gather_into_tensor(t_out, torch.arange(k, dtype=torch.float32, device="cuda") + 10 * me())
    ar = np.arange(k, dtype=np.float64)
    assert cp.asnumpy(base).tolist() == np.arange(8.0).tolist()
    assert np.array_equal(cp.asnumpy(out_t), np.stack([ar + 10 * r for r in range(N)]))
    full = np.arange(N * k, dtype=np.float64) * N + sum(range(N))
    assert np.array_equal(cp.asnumpy(holder[::2]), full[me() * k : (me() + 1) * k])
    assert (cp.asnumpy(holder[1::2]) == -5.0).all()
    assert np.array_equal(cp.asnumpy(holder2[1::2]), ar + 100 * me())
    assert (cp.asnumpy(holder2[::2]) == -5.0).all()
    if gather_bases is not None:
        for r, gb in enumerate(gather_bases):
            assert np.array_equal(cp.asnumpy(gb[:, 1]), ar + 7 * r)
            assert (cp.asnumpy(gb[:, 0]) == -5.0).all()
    want_a2a = np.stack([np.array([2 * me(), 2 * me() + 1], dtype=np.float64) + 100 * j for j in range(N)])
    assert np.array_equal(cp.asnumpy(a2a_out), want_a2a)
    if t_out is not None:
        assert np.array_equal(t_out.cpu().numpy(), np.stack([ar + 10 * r for r in range(N)]).astype(np.float32))


def _a2a_blocks(i: int, N: int) -> list[np.ndarray]:
    """Rank i's rows for rank j: i + j + 1 rows of 2 (symmetric, so each rank sends as many rows as it receives)."""
    return [1000 * i + 100 * j + np.arange(2 * (i + j + 1), dtype=np.float64).reshape(i + j + 1, 2) for j in range(N)]


def test_all_to_all_single_with_uneven_splits_in_place_and_into_a_transposed_output(gpu_path):
    """GUARD: uneven splits (rows per rank, each array's own rows) on device, with the output the input itself
    (MPI forbids aliased buffers: the CUDA-aware engine sends a copy, _apart at cuda_aware/engine.py:81-87; the
    staged engine's twins are separate blocks) and into a transposed output (a write-back)."""
    mpi_paths_only(gpu_path)
    N = n()
    splits = [me() + j + 1 for j in range(N)]
    mine = np.concatenate(_a2a_blocks(me(), N))
    x = cp.asarray(mine)
    dist.all_to_all_single(x, x, output_split_sizes=splits, input_split_sizes=splits)
    out_t = cp.zeros((2, mine.shape[0])).T
    dist.all_to_all_single(out_t, cp.asarray(mine), output_split_sizes=splits, input_split_sizes=splits)
    want = np.concatenate([_a2a_blocks(j, N)[me()] for j in range(N)])
    assert np.array_equal(cp.asnumpy(x), want)
    assert np.array_equal(cp.asnumpy(out_t), want)


def test_gather_and_scatter_of_uneven_sizes_on_device_for_every_root(gpu_path):
    """GUARD: gather/scatter entries may differ in size by rank (rank r's entry of rank r's size): Gatherv and
    Scatterv with per-rank counts on both engines (cuda_aware/engine.py:201-228), every root."""
    mpi_paths_only(gpu_path)
    N = n()
    got = []
    for root in range(N):
        inp = cp.arange(me() + 1, dtype=cp.float64) + 10 * me() + root
        gl = [cp.full(r + 1, -1.0) for r in range(N)] if me() == root else None
        dist.gather(inp, gl, dst=root)
        out = cp.full(me() + 1, -1.0)
        sl = [cp.arange(r + 1, dtype=cp.float64) + 100 * r + root for r in range(N)] if me() == root else None
        dist.scatter(out, sl, src=root)
        got.append((root, None if gl is None else [cp.asnumpy(g).tolist() for g in gl], cp.asnumpy(out).tolist()))
    for root, gathered, scattered in got:
        if gathered is not None:
            assert gathered == [(np.arange(r + 1) + 10 * r + root).astype(float).tolist() for r in range(N)]
        assert scattered == (np.arange(me() + 1) + 100 * me() + root).astype(float).tolist()


# ---------------------------------------------------------------- GUARD: reductions and dtypes


@pytest.mark.parametrize("dtype", ["float32", "float16"])
def test_reduce_leaves_non_root_arrays_untouched_for_every_op(gpu_path, dtype):
    """GUARD: reduce writes the root's array only. The CUDA-aware engine reduces from prepare(copy=False)
    (cuda_aware/engine.py:126-140): AVG reduces buf.arr itself and must not scale it on a non-root; PREMUL_SUM and
    half floats reduce a copy; MIN/MAX keys are a new array. The staged engine copies nothing back on a non-root
    (writes=[], engine.py:267). The root's output is a strided view here (a write-back, around it untouched)."""
    mpi_paths_only(gpu_path)
    N, root = n(), n() - 1
    ops = {
        "SUM": dist.ReduceOp.SUM,
        "AVG": dist.ReduceOp.AVG,
        "PREMUL_SUM": dist.ReduceOp.PREMUL_SUM(2.0),
        "MIN": dist.ReduceOp.MIN,
        "MAX": dist.ReduceOp.MAX,
    }

    def data(r: int) -> np.ndarray:
        return ((np.arange(8) * 3 + r * 5) % 7 + 1).astype(dtype)

    got = {}
    for name, op in ops.items():
        holder = cp.full(16, -3.0, dtype=dtype)
        holder[::2] = cp.asarray(data(me()))
        dist.reduce(holder[::2], dst=root, op=op)
        got[name] = cp.asnumpy(holder)
    wide = np.stack([data(r).astype(np.float64) for r in range(N)])
    refs = {
        "SUM": wide.sum(0),
        "AVG": wide.sum(0) / N,
        "PREMUL_SUM": 2 * wide.sum(0),
        "MIN": wide.min(0),
        "MAX": wide.max(0),
    }
    for name, arr in got.items():
        assert (arr[1::2] == -3.0).all(), (name, arr)
        if me() == root:
            assert np.allclose(arr[::2].astype(np.float64), refs[name], rtol=1e-3), (name, arr[::2], refs[name])
        else:
            assert np.array_equal(arr[::2], data(me())), (name, "non-root array changed", arr[::2])


def test_float16_avg_and_premul_sum_with_a_device_factor_round_once(gpu_path):
    """GUARD: half floats are widened to float32, summed, scaled and rounded once (reduction.py prepare and
    finish_reduce; on the CUDA-aware path in CuPy). AVG matches NumPy's float32 arithmetic exactly at 1 and 2
    ranks; PREMUL_SUM takes a one-element CuPy array as its factor (ops.py _PremulSum: .item()) and matches
    within one float16 rounding (CuPy's scalar promotion may multiply in another precision)."""
    mpi_paths_only(gpu_path)
    N = n()

    def data(r: int) -> np.ndarray:
        return ((np.arange(64) * 0.37 + r * 0.11) % 5).astype(np.float16)

    a = cp.asarray(data(me()))
    dist.all_reduce(a, op=dist.ReduceOp.AVG)
    p = cp.asarray(data(me()))
    dist.all_reduce(p, op=dist.ReduceOp.PREMUL_SUM(cp.array(0.1, dtype=cp.float32)))
    wide = np.stack([data(r).astype(np.float32) for r in range(N)])
    avg = (wide.sum(0, dtype=np.float32) / np.float32(N)).astype(np.float16)
    pre = (wide * np.float32(0.1)).sum(0, dtype=np.float32).astype(np.float16)
    got_a, got_p = cp.asnumpy(a), cp.asnumpy(p)
    assert got_a.dtype == np.float16 and got_p.dtype == np.float16
    if N <= 2:  # two float32 addends: one rounding, whatever the order
        assert np.array_equal(got_a, avg), (got_a[:8], avg[:8])
    else:
        assert np.allclose(got_a.astype(np.float32), avg.astype(np.float32), rtol=2e-3)
    assert np.allclose(got_p.astype(np.float32), pre.astype(np.float32), rtol=2e-3, atol=1e-3), (got_p[:8], pre[:8])


def test_int8_bool_and_complex64_reductions_match_the_host_path(gpu_path):
    """GUARD: dtypes the shared GPU bodies never reduce (their DTYPES: no int8, no complex64): int8 sums and
    products that wrap around, bitwise ops on negative int8, bool ops (logical, ops.py _BOOL_NAME), complex64
    SUM/AVG/PREMUL_SUM; each against hpcdist's host path on a NumPy copy of the same data."""
    mpi_paths_only(gpu_path)
    N = n()
    i = np.arange(12)
    R = dist.ReduceOp
    cases = [
        (
            "int8",
            ((i * 29 + 90 + 7 * me()) % 200 - 100).astype(np.int8),
            [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR],
        ),
        ("bool", (i + me()) % 3 == 0, [R.SUM, R.PRODUCT, R.MIN, R.MAX, R.BAND, R.BOR, R.BXOR]),
        ("complex64", (i + 1j * ((i + me()) % 4) + me()).astype(np.complex64), [R.SUM, R.AVG, R.PREMUL_SUM(2.0)]),
    ]
    got = []
    for dtype, data, ops in cases:
        for op in ops:
            dev = cp.asarray(data)
            host = data.copy()
            dist.all_reduce(dev, op=op)
            dist.all_reduce(host, op=op)
            got.append((dtype, repr(op), cp.asnumpy(dev), host))
    for dtype, op, dev, host in got:
        assert dev.dtype == host.dtype, (dtype, op)
        if dtype == "complex64" and N > 2:
            assert np.allclose(dev, host), (dtype, op, dev, host)
        else:
            assert np.array_equal(dev, host), (dtype, op, dev, host)


# ---------------------------------------------------------------- GUARD: async, streams, staging pool


def test_concurrent_async_ops_of_many_sizes_keep_their_staging_until_wait(gpu_path):
    """GUARD: several async all_reduces in flight at once (sizes in one pinned size class and in others, waited in
    reverse order) each own their blocks until their copy-back (engine.py:135-149); futures complete after it,
    with the user's array as value; an async all_gather_into_tensor whose input is a temporary dropped at once
    (the Work keeps it: staged copied it down already, CUDA-aware hands MPI the device memory) is not disturbed
    by new allocations before wait()."""
    mpi_paths_only(gpu_path)
    N = n()
    sizes = [1, 1000, 1024, 1500, 3, 70000, 1 << 16, 1025]
    xs = [cp.full(s, float(10 * me() + k + 1), dtype=cp.float32) for k, s in enumerate(sizes)]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    futs = [w.get_future() for w in works]
    out = cp.full(N * 5, -1.0)
    wg = dist.all_gather_into_tensor(out, cp.full(5, float(me() + 1)), async_op=True)
    junk = [cp.full(5, -7.0) for _ in range(16)]  # would take the dropped input's memory if it were freed
    for w in reversed(works):
        assert w.wait() is True
    wg.wait()
    del junk
    for k, (x, f) in enumerate(zip(xs, futs, strict=True)):
        want = 10 * sum(range(N)) + N * (k + 1)
        assert f.done() and f.value()[0] is x
        assert float(x[0]) == want and float(x[-1]) == want, (k, float(x[0]), want)
    assert cp.asnumpy(out).tolist() == np.repeat(np.arange(1.0, N + 1), 5).tolist()


def test_future_callbacks_see_strided_outputs_already_written_back(gpu_path):
    """GUARD: a Future's callbacks run after the Work's finishing step (work.py _finish): on the staged path that
    is the copy up and the write-back of strided outputs (engine.py:142-147), on the CUDA-aware path unpack's
    write-backs and the stream sync; a callback reading the device outputs sees the gathered values."""
    mpi_paths_only(gpu_path)
    N, k = n(), 4
    bases = [cp.full((k, 2), -1.0) for _ in range(N)]
    outs = [b[:, 1] for b in bases]
    w = dist.all_gather(outs, cp.arange(k, dtype=cp.float64) + 10 * me(), async_op=True)
    seen = w.get_future().then(lambda f: [cp.asnumpy(o).tolist() for o in f.value()])
    w.wait()
    got = seen.wait()
    assert got == [(np.arange(k) + 10.0 * r).tolist() for r in range(N)]
    assert all((cp.asnumpy(b[:, 0]) == -1.0).all() for b in bases)


def test_dropped_async_work_on_device_completes_at_the_next_barrier(gpu_path):
    """SUSPECT (staged path; the CUDA-aware one at 2 ranks for its chained Works): a Work dropped unwaited is
    adopted by Work.__del__ (work.py:254-257, _orphan) and barrier() finishes the group's dropped collectives
    (collectives.py barrier -> finish_orphans, work.py:594), as gloo's barrier waits for earlier work; the host
    path's twin is tests/mpi/test_work_defects.py:152. But the device engines return chained Works
    (staged/engine.py:149, cuda_aware/engine.py:67) and Work.chain's finishing step closes over the outer Work
    itself (work.py:374, ``outer._source = ...``): outer -> _post -> closure cell -> outer is a reference cycle,
    so dropping the Work does not call __del__; nothing is adopted until the cyclic collector happens to run, and
    after the barrier the staged copy-back (and the strided write-back) has not happened. The collector is paused
    for the few calls of the test so that the outcome does not depend on when it runs."""
    mpi_paths_only(gpu_path)
    import gc

    from hpcdist.work import pending_orphans

    N = n()
    x = cp.full(1000, float(me() + 1), dtype=cp.float32)
    y = cp.full((40, 2), float(me() + 1), dtype=cp.float32)
    was = gc.isenabled()
    gc.disable()
    try:
        dist.all_reduce(x, async_op=True)  # the Work is dropped at once
        dist.all_reduce(y[:, 0], async_op=True)  # a strided one: its write-back too
        adopted = pending_orphans()
        dist.barrier()
        got_x, got_y = cp.asnumpy(x), cp.asnumpy(y)
    finally:
        if was:
            gc.enable()
    gc.collect()  # whatever the cycle held is adopted now ...
    dist.barrier()  # ... and finished here, on every rank, so that later tests start clean
    want = N * (N + 1) / 2
    assert (got_x == want).all(), f"after barrier() x holds {np.unique(got_x)}, want {want} (adopted: {adopted})"
    assert (got_y[:, 0] == want).all() and (got_y[:, 1] == me() + 1).all(), (got_y[:3], adopted)


def test_work_queued_on_the_current_stream_before_the_call_is_ordered_before_it(gpu_path):
    """GUARD (torch's stream rule, gpu/streams.py:1-7): on a non-blocking side stream kept busy by a spinning
    kernel, a fill queued before all_reduce is seen by it, and a read of the broadcast array queued before the
    broadcast sees the old values (the staged copy down/up runs on the array's stream, engine.py:58-69; the
    pipelined path's streams wait for an event on it, engine.py:211-214; the CUDA-aware engine syncs it first,
    cuda_aware/engine.py:50-54). Small and pipelined sizes; a torch side stream on the staged path."""
    mpi_paths_only(gpu_path)
    N = n()
    side = cp.cuda.Stream(non_blocking=True)
    got = []
    for count in (1000, pipelined_items(4)):
        with side:
            x = cp.zeros(count, dtype=cp.float32)
            spin(0.1)
            x.fill(float(me() + 1))
            dist.all_reduce(x)
            b = cp.full(count, float(10 + me()), dtype=cp.float32)
            spin(0.1)
            seen = b * 1
            dist.broadcast(b, src=0)
        side.synchronize()
        got.append((count, float(x[0]), float(x[-1]), float(seen[0]), float(seen[-1]), float(b[0]), float(b[-1])))
    t_got = None
    if torch_cuda() and hasattr(torch.cuda, "_sleep"):
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            t = torch.zeros(1000, device="cuda")
            torch.cuda._sleep(100_000_000)
            t.fill_(float(me() + 1))
            dist.all_reduce(t)
            u = t * 1
        s.synchronize()
        t_got = (float(u[0]), float(u[-1]))
    total = N * (N + 1) / 2
    for count, x0, x1, s0, s1, b0, b1 in got:
        assert (x0, x1) == (total, total), (count, "all_reduce missed the fill queued before it", x0, x1)
        assert (s0, s1) == (10.0 + me(),) * 2, (count, "a read queued before the broadcast saw its result", s0, s1)
        assert (b0, b1) == (10.0, 10.0), (count, b0, b1)
    if t_got is not None:
        assert t_got == (total, total)


def test_staging_pool_reuse_across_large_and_small_sizes_gives_exact_results(gpu_path):
    """GUARD: a sequence of sizes that reuse pinned blocks of one class with fewer bytes, and of other classes (a
    pipelined 10 MiB, then 28 bytes, then a 3 MiB block, ...): each result against NumPy, all checked after the
    last call; outputs fully written by MPI (all_gather_into_tensor, reduce_scatter_tensor of a reused class)."""
    mpi_paths_only(gpu_path)
    N = n()
    sizes = [pipelined_items(4), 7, 1025, (3 << 20) // 4, 5, pipelined_items(4) - 14, 1, 1024]
    got = []
    for k, s in enumerate(sizes):
        pattern = (np.arange(s) % 13).astype(np.float32) + 100 * k
        x = cp.asarray(pattern + me())
        dist.all_reduce(x)
        ag = cp.full(N * s, -1.0, dtype=cp.float32)
        dist.all_gather_into_tensor(ag, cp.asarray(pattern + me()))
        rs = cp.full(s, -1.0, dtype=cp.float32)
        dist.reduce_scatter_tensor(rs, cp.asarray(np.tile(pattern, N) + me()))
        got.append((k, pattern, cp.asnumpy(x), cp.asnumpy(ag), cp.asnumpy(rs)))
    for k, pattern, x, ag, rs in got:
        assert np.array_equal(x, pattern * N + sum(range(N))), (k, x[:5])
        assert np.array_equal(ag, np.concatenate([pattern + r for r in range(N)])), (k, ag[:5])
        assert np.array_equal(rs, pattern * N + sum(range(N))), (k, rs[:5])


def test_async_coalesced_and_bucketed_device_reductions(gpu_path):
    """GUARD: all_reduce_coalesced on device arrays runs one collective per array (collectives.py reduce_list ->
    _parts) combined in one Work whose result() is the user's arrays; complex64 arrays join a float32 list as
    (real, imag) pairs (_complex_as_real) as on the host path; all_reduce_bucketed mixes host and device arrays
    (one bucket per kind) and completes them together."""
    mpi_paths_only(gpu_path)
    N = n()
    xs = [cp.full(5 + k, float(me() + k), dtype=cp.float32) for k in range(3)]
    w = dist.all_reduce_coalesced(xs, async_op=True)
    res = w.result()
    c = (np.arange(4) + 1j * (np.arange(4) + me())).astype(np.complex64)
    f = (np.arange(3) + me()).astype(np.float32)
    dev = [cp.asarray(c), cp.asarray(f)]
    host = [c.copy(), f.copy()]
    dist.all_reduce_coalesced(dev)
    dist.all_reduce_coalesced(host)
    tensors = [np.full(4, me() + 1.0), cp.full(6, me() + 1.0), cp.full(3, me() + 2, dtype=cp.int32)]
    if torch_cuda():
        tensors.append(torch.full((2,), float(me() + 3), device="cuda"))
    wb = dist.all_reduce_bucketed(tensors, async_op=True, bucket_cap_mb=1e-5)
    wb.wait()
    assert len(res) == 3 and all(r is x for r, x in zip(res, xs, strict=True))
    for k, x in enumerate(xs):
        assert (cp.asnumpy(x) == sum(r + k for r in range(N))).all()
    assert np.array_equal(cp.asnumpy(dev[0]), host[0]) and np.array_equal(cp.asnumpy(dev[1]), host[1])
    s = N * (N + 1) / 2
    assert (tensors[0] == s).all()
    assert (cp.asnumpy(tensors[1]) == s).all()
    assert (cp.asnumpy(tensors[2]) == s + N).all()
    if len(tensors) == 4:
        assert (tensors[3].cpu() == s + 2 * N).all()


# ---------------------------------------------------------------- GUARD: object collectives


def test_object_collectives_carry_device_arrays(gpu_path):
    """GUARD: objects travel pickled through host memory (objects.py dumps/loads, protocol 5): a CuPy array comes
    back as a CuPy array (its pickle holds a NumPy copy, an out-of-band buffer), a torch CUDA tensor as a CUDA
    tensor (torch pickles it with its device), with their values."""
    mpi_paths_only(gpu_path)
    N = n()
    obj = {"rank": me(), "c": cp.arange(3, dtype=cp.float32) + me()}
    if torch_cuda():
        obj["t"] = torch.arange(3, dtype=torch.float32, device="cuda") + me()
    gathered = [None] * N
    dist.all_gather_object(gathered, obj)
    lst = [obj if me() == 0 else None]
    dist.broadcast_object_list(lst, src=0)
    for src, o in [*enumerate(gathered), (0, lst[0])]:
        assert o["rank"] == src
        assert isinstance(o["c"], cp.ndarray) and cp.asnumpy(o["c"]).tolist() == [src, src + 1.0, src + 2.0]
        if "t" in obj:
            assert o["t"].is_cuda and o["t"].cpu().tolist() == [src, src + 1.0, src + 2.0]
