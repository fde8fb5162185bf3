"""GPU-only behaviour: adapters on device memory, streams and async Work, staging reuse,
NCCL's refusals, wrong-device errors, p2p on device arrays. Runs over every path of conftest.py.
"""

from __future__ import annotations

import numpy as np
import pytest
from gpu_arrays import gpu_missing, me, n, spin, torch, torch_cuda

import hpcdist as dist
from hpcdist.backends.staged import StagedEngine
from hpcdist.buffers.adapters import adapt

pytestmark = pytest.mark.timeout(120)

cp = pytest.importorskip("cupy", reason="the GPU tests need CuPy (pip install 'hpcdist[gpu]')")
_why = gpu_missing()
if _why is not None:
    pytest.skip(_why, allow_module_level=True)


def settle(work) -> None:
    """Wait so that the host may read the result (NCCL: wait() alone does not block the host)."""
    if hasattr(work, "_event"):
        work.synchronize()
    else:
        work.wait()


class CAIView:
    """A foreign device array: only ``__cuda_array_interface__``."""

    def __init__(self, arr):
        self.arr = arr
        self.__cuda_array_interface__ = arr.__cuda_array_interface__


def test_adapters_share_device_memory(gpu_path):
    x = cp.arange(6, dtype=cp.float32)
    b = adapt(x, "x", True)
    assert (b.device, b.index, b.dtype) == ("cuda", x.device.id, "float32") and b.arr.data.ptr == x.data.ptr
    c = adapt(CAIView(x), "x", True)
    assert c.device == "cuda" and c.arr.data.ptr == x.data.ptr
    if torch_cuda():
        t = torch.ones(4, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        tb = adapt(t, "t", False)
        assert (tb.device, tb.dtype, str(tb.arr.dtype)) == ("cuda", "bfloat16", "uint16")
        assert tb.arr.data.ptr == t.data_ptr()


def test_foreign_device_arrays_reduce_in_place(gpu_path):
    x = cp.full(5, float(me() + 1), dtype=cp.float64)
    dist.all_reduce(CAIView(x))
    assert cp.asnumpy(x).tolist() == [n() * (n() + 1) / 2] * 5
    y = cp.full(3, 1, dtype=cp.int32)
    holder = type(
        "DL", (), {"__dlpack__": lambda s, **k: y.__dlpack__(**k), "__dlpack_device__": lambda s: y.__dlpack_device__()}
    )()
    dist.all_reduce(holder)
    assert cp.asnumpy(y).tolist() == [n()] * 3


def test_non_contiguous_device_views(gpu_path):
    base = cp.arange(2 * 8, dtype=cp.float64).reshape(8, 2) + me()
    view = base[:, 1]
    dist.all_reduce(view)
    want = sum(np.arange(16.0).reshape(8, 2) + r for r in range(n()))
    assert np.array_equal(cp.asnumpy(base[:, 1]), want[:, 1])
    assert np.array_equal(cp.asnumpy(base[:, 0]), np.arange(16.0).reshape(8, 2)[:, 0] + me())
    if torch_cuda():
        t = torch.arange(16, dtype=torch.float32, device="cuda").reshape(8, 2) + me()
        tv = t[:, 0]
        dist.all_reduce(tv)
        assert torch.equal(t[:, 0].cpu(), torch.tensor(want[:, 0], dtype=torch.float32))


def test_device_outputs_whose_elements_share_memory_are_refused_before_any_message(gpu_path):
    """An expanded view cannot hold one result per element; the host adapters refuse it, the device ones too."""
    with pytest.raises(ValueError, match=r"tensor has elements that share memory"):
        dist.all_reduce(cp.broadcast_to(cp.zeros(1), (4,)))
    if torch_cuda():
        with pytest.raises(ValueError, match=r"tensor has elements that share memory"):
            dist.all_reduce(torch.zeros(1, device="cuda").expand(4))
    x = cp.full(4, 1.0)
    dist.all_reduce(x)  # every rank refused alike: the group is in step
    assert cp.asnumpy(x).tolist() == [float(n())] * 4


def test_strided_cuda_inference_tensor_output_holds_the_result(gpu_path):
    """torch's copy_ into an inference tensor outside inference mode raised after the data moved."""
    if not torch_cuda():
        pytest.skip("torch has no CUDA here")
    with torch.inference_mode():
        base = torch.full((4, 2), float(me() + 1), device="cuda")
    view = base.t()  # strided: goes through a contiguous copy and the copy-back
    dist.all_reduce(view)
    assert torch.equal(base.cpu(), torch.full((4, 2), n() * (n() + 1) / 2))


def test_requires_grad_cuda_tensor(gpu_path):
    if not torch_cuda():
        pytest.skip("torch has no CUDA here")
    t = torch.ones(3, device="cuda", requires_grad=True)
    with torch.no_grad():
        dist.all_reduce(t)
    assert torch.equal(t.detach().cpu(), torch.full((3,), float(n())))


def test_async_work_completes_with_data_in_place(gpu_path):
    xs = [cp.full(1 << 16, float(me() + k), dtype=cp.float32) for k in range(3)]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    for w in works:
        settle(w)
        assert w.is_completed() and w.is_success()
    for k, x in enumerate(xs):
        assert float(x[0]) == sum(r + k for r in range(n()))


def test_nccl_stream_semantics(gpu_path):
    if dist.get_backend() != "cpu:mpi,cuda:nccl":
        pytest.skip("NCCL path only")
    side = cp.cuda.Stream(non_blocking=True)
    with side:
        x = cp.full(1 << 20, float(me() + 1), dtype=cp.float32)
        w = dist.all_reduce(x, async_op=True)
        assert w.wait() is True  # returns at once: the stream is ordered after the operation
        y = x * 2  # enqueued behind the all-reduce on the same stream
    side.synchronize()
    assert float(y[0]) == 2 * n() * (n() + 1) / 2
    with side:  # a blocking call returns once enqueued on the current stream: later work there sees the result
        b = cp.full(1 << 20, float(me() + 1), dtype=cp.float32)
        assert dist.all_reduce(b) is None
        c = b + 1
    side.synchronize()
    assert float(c[-1]) == n() * (n() + 1) / 2 + 1
    w.synchronize()
    assert w.is_completed() and w.is_success()
    # another stream than the one the operation ran on: wait() makes it wait on the event
    with side:
        z = cp.full(8, 1.0, dtype=cp.float32)
        w2 = dist.all_reduce(z, async_op=True)
    other = cp.cuda.Stream(non_blocking=True)
    with other:
        w2.wait()
        total = float((z * 1).sum())
    assert total == 8.0 * n()


def test_nccl_coalesced_work_is_one_event_covering_every_part(gpu_path):
    if dist.get_backend() != "cpu:mpi,cuda:nccl":
        pytest.skip("NCCL path only")
    xs = [cp.full(1000 + k, float(me() + k), dtype=cp.float32) for k in range(3)]
    spin(2.0)  # the stream is busy: the parts are enqueued behind the spin
    w = dist.all_reduce_coalesced(xs, async_op=True)
    assert not w.is_completed()  # not complete before the last part ran on the GPU
    w.synchronize()
    assert w.is_completed() and w.is_success()
    assert all(r is x for r, x in zip(w.result(), xs))
    for k, x in enumerate(xs):
        assert float(x[0]) == float(x[-1]) == sum(r + k for r in range(n()))


def test_staging_reuses_pinned_blocks(gpu_path):
    if not isinstance(dist.group.WORLD.engine("cuda"), StagedEngine):
        pytest.skip("staged path only")
    from hpcdist.backends.staged import pinned_pool

    pool = pinned_pool()
    x = cp.ones(12345, dtype=cp.float32)
    dist.all_reduce(x)
    before = pool.allocations
    for _ in range(5):
        dist.all_reduce(x)
    assert pool.allocations == before


@pytest.mark.parametrize(
    ("dtype", "opname"),
    [("float32", "SUM"), ("float32", "AVG"), ("float32", "PREMUL_SUM"), ("float32", "MAX"), ("float16", "SUM")],
)
def test_staged_all_reduce_of_several_pieces_matches_numpy(gpu_path, dtype, opname):
    """Arrays of two pipeline pieces or more: copies down, MPI and copies up overlap piece by piece."""
    if not isinstance(dist.group.WORLD.engine("cuda"), StagedEngine):
        pytest.skip("staged path only")
    from hpcdist.backends.staged.engine import PIPELINE_CHUNK

    count = (2 * PIPELINE_CHUNK + PIPELINE_CHUNK // 2) // np.dtype(dtype).itemsize + 3  # 2.5 pieces and a ragged end
    base = np.arange(count) % 7
    per_rank = [(base + r).astype(dtype) for r in range(n())]
    op = dist._make_nccl_premul_sum(2.0) if opname == "PREMUL_SUM" else getattr(dist.ReduceOp, opname)
    wide = np.stack(per_rank).astype(np.float64)
    want = {"SUM": wide.sum(0), "AVG": wide.sum(0) / n(), "PREMUL_SUM": 2 * wide.sum(0), "MAX": wide.max(0)}[opname]
    side = cp.cuda.Stream(non_blocking=True)
    with side:  # produced on a side stream: the pipeline must wait for it
        x = cp.asarray(per_rank[me()]) * 1
        work = dist.all_reduce(x, op=op, async_op=True)
    assert work.is_completed() and work.result()[0] is x
    got = cp.asnumpy(x).astype(np.float64)
    assert np.allclose(got, want, rtol=1e-3 if dtype == "float16" else 1e-6), (got[:8], want[:8])
    if opname != "AVG":
        assert np.array_equal(got, want)
    if torch_cuda():  # a non-contiguous tensor: reduced through a contiguous copy and written back
        m = (torch.arange(2 * count, device="cuda") % 1000).to(torch.float32).reshape(count, 2) + me()
        t = m[:, 0]  # every other element: a strided view
        assert not t.is_contiguous()
        dist.all_reduce(t)
        expect = (np.arange(0, 2 * count, 2) % 1000).astype(np.float64) * n() + sum(range(n()))
        assert np.array_equal(t.cpu().numpy().astype(np.float64), expect)


def test_staged_broadcast_and_reduce_of_several_pieces_match_numpy(gpu_path):
    if not isinstance(dist.group.WORLD.engine("cuda"), StagedEngine):
        pytest.skip("staged path only")
    from hpcdist.backends.staged.engine import PIPELINE_CHUNK

    count = (2 * PIPELINE_CHUNK + PIPELINE_CHUNK // 2) // 8 + 5
    base = np.arange(count, dtype=np.float64) % 11
    for root in range(n()):
        x = cp.asarray(base + me())
        work = dist.broadcast(x, src=root, async_op=True)
        assert work.is_completed() and work.result()[0] is x
        assert np.array_equal(cp.asnumpy(x), base + root)
        y = cp.asarray(base * (me() + 1))
        dist.reduce(y, dst=root, op=dist.ReduceOp.SUM)
        if me() == root:
            assert np.array_equal(cp.asnumpy(y), base * sum(r + 1 for r in range(n())))
        else:  # a reduce leaves the other ranks' arrays alone
            assert np.array_equal(cp.asnumpy(y), base * (me() + 1))


def test_nccl_refuses_what_it_lacks_before_anything_moves(gpu_path):
    if dist.get_backend() != "cpu:mpi,cuda:nccl":
        pytest.skip("NCCL path only")
    x16 = cp.ones(4, dtype=cp.int16)
    with pytest.raises(TypeError, match="NCCL cannot reduce dtype int16"):
        dist.all_reduce(x16)
    with pytest.raises(ValueError, match="bitwise"):
        dist.all_reduce(cp.ones(4, dtype=cp.int32), op=dist.ReduceOp.BAND)
    with pytest.raises(ValueError, match="any source"):
        dist.irecv(cp.empty(4, dtype=cp.float32))
    dist.broadcast(x16, src=0)  # data movement takes every dtype
    assert cp.asnumpy(x16).tolist() == [1] * 4


def test_array_on_another_device_is_refused(gpu_path):
    count = cp.cuda.runtime.getDeviceCount()
    if count < 2:
        pytest.skip("needs two visible GPUs")
    other = (cp.cuda.runtime.getDevice() + 1) % count
    with cp.cuda.Device(other):
        x = cp.ones(4, dtype=cp.float32)
    with pytest.raises(ValueError, match=r"current CUDA device"):
        dist.all_reduce(x)


def test_send_recv_and_batch_on_device(gpu_path):
    if n() < 2:
        pytest.skip("needs two ranks")
    right, left = (me() + 1) % n(), (me() - 1) % n()
    out = cp.full(7, float(me()), dtype=cp.float64)
    inc = cp.zeros(7, dtype=cp.float64)
    ops = [dist.P2POp(dist.isend, out, right), dist.P2POp(dist.irecv, inc, left)]
    works = dist.batch_isend_irecv(ops)  # NCCL: handed to the engine whole, one grouped call (else a ring deadlocks)
    assert len(works) == 2
    for w in works:
        settle(w)
    assert cp.asnumpy(inc).tolist() == [float(left)] * 7
    if me() == 0:
        dist.send(cp.arange(5, dtype=cp.int64), dst=1)
    elif me() == 1:
        buf = cp.zeros(5, dtype=cp.int64)
        assert dist.recv(buf, src=0) == 0
        cp.cuda.get_current_stream().synchronize()
        assert cp.asnumpy(buf).tolist() == list(range(5))


def test_cuda_awareness_is_reported_with_its_reason(gpu_path):
    got = dist.gpu.cuda_aware_mpi()
    assert isinstance(got.enabled, bool) and got.reason and got.source in ("override", "mpi", "vendor", "default")


@pytest.mark.parametrize("opname", ["MIN", "MAX"])
@pytest.mark.parametrize("dtype", ["float32", "float64", "float16"])
def test_min_max_with_a_nan_on_any_rank_give_nan(gpu_path, dtype, opname):
    """A NaN on any rank wins MIN/MAX on the device paths too (keys on the device for CUDA-aware MPI, the host's
    checks and keys per staged piece); element i holds its NaN on rank i % (n + 1), none when that is n."""
    if gpu_path == "nccl":
        pytest.skip("NCCL's MIN/MAX follow NCCL's own rules (docs/sharp-bits.md)")
    from hpcdist.backends.staged.engine import PIPELINE_CHUNK

    op = getattr(dist.ReduceOp, opname)
    fold = np.minimum if opname == "MIN" else np.maximum
    for count in (12, (2 * PIPELINE_CHUNK + PIPELINE_CHUNK // 2) // np.dtype(dtype).itemsize + 3):
        i = np.arange(count)

        def contribution(r: int, i=i) -> np.ndarray:
            x = ((i * 5 + r * 3) % 7 - 3).astype(dtype)
            x[i % (n() + 1) == r] = np.nan
            return x

        want = fold.reduce(np.stack([contribution(r) for r in range(n())]), axis=0)
        x = cp.asarray(contribution(me()))
        dist.all_reduce(x, op=op)
        got = cp.asnumpy(x)
        assert np.array_equal(got, want, equal_nan=True), (count, got[:12], want[:12])
        out = cp.zeros(count // n() * n() // n(), dtype=dtype)
        m = out.size * n()
        dist.reduce_scatter_tensor(out, cp.asarray(contribution(me())[:m]), op=op)
        assert np.array_equal(cp.asnumpy(out), want[:m].reshape(n(), -1)[me()], equal_nan=True)
