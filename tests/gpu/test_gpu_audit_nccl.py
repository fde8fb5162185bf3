"""Audit of the NCCL path: CudaEventWork, streams, the watchdog, torch CUDA tensors through hpcdist's API.

Each test's docstring starts with ``SUSPECT:`` (written to show a defect found by reading, with the
reason and where it was; each failed on the H100 on 2026-11-27 and passes since its fix, except the two
marked xfail: known, documented in docs/gpu.md) or ``GUARD:`` (a risky edge that worked). They run on the ``nccl`` pass of
conftest.py only (``backend="cpu:mpi,cuda:nccl"``) and are written for one rank (one GPU), where a
one-rank NCCL communicator still runs every collective, copy, cast, scaling step, event and stream
operation; most also hold at more ranks. Expected results come from NumPy on host copies and from
torch's semantics (ProcessGroupNCCL): ``Work.wait()`` orders the current stream, ``synchronize()``
blocks the host, an operation is ordered after the work already queued on the current stream of the
library owning the arrays, and a Work keeps its buffers alive until the GPU is done with them.

Run: ``mpiexec -n 1 python tests/mpi_pytest.py tests/gpu/test_gpu_audit_nccl.py``.
"""

from __future__ import annotations

import os
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from gpu_arrays import _load, gpu_missing, me, n, spin, torch, torch_cuda

import hpcdist as dist
from hpcdist._launchenv import TORCHRUN_VARS

pytestmark = pytest.mark.timeout(60)

cp = pytest.importorskip("cupy", reason="the GPU tests need CuPy (pip install 'hpcdist[gpu]')")
_why = gpu_missing()
if _why is not None:
    pytest.skip(_why, allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
MPIRUN = _load("hpcdist_test_mpirun_audit", ROOT / "tests" / "integration" / "mpirun.py")
PREMUL = dist.ReduceOp.PREMUL_SUM


@pytest.fixture
def nccl(request, gpu_path):
    """Only on conftest's ``nccl`` pass (backend ``cpu:mpi,cuda:nccl``)."""
    if request.node.callspec.params.get("gpu_path") != "nccl" or dist.get_backend() != "cpu:mpi,cuda:nccl":
        pytest.skip("NCCL path only (gpu_path == 'nccl')")
    return gpu_path


def _need_torch() -> None:
    if not torch_cuda():
        pytest.skip("torch has no CUDA here")


def _np(x) -> np.ndarray:
    if isinstance(x, cp.ndarray):
        return cp.asnumpy(x)
    t = x.detach()
    if t.dtype == torch.bfloat16:
        t = t.float()
    return t.cpu().numpy()


def _stream_idle() -> bool:
    """Whether CuPy's current stream (here the legacy default stream, which torch's default stream is too) is idle."""
    return bool(cp.cuda.get_current_stream().done)


# ====================================================================== SUSPECT: Work semantics


def test_bucketed_work_over_host_and_device_arrays_synchronizes_with_the_gpu(nccl):
    """SUSPECT: all_reduce_bucketed documents arrays of mixed devices; with a NumPy and a CuPy array the
    buckets' Works (an MPI Work and a CudaEventWork) are combined by Work._merged (bucketing.py:206-209,
    collectives.py combine, backends/nccl/work.py:55-56), whose wait/synchronize only waits for the MPI
    request and then calls the CUDA part's non-blocking wait(): synchronize() returns while the GPU part is
    still queued. torch: Work.synchronize() blocks the host until the device work completed."""
    h = np.ones(1000, dtype=np.float32)
    d = cp.ones(1000, dtype=cp.float32)
    dist.all_reduce(cp.zeros(1, dtype=cp.float32))  # the communicator exists: its setup would wait for the spin
    cp.cuda.Device().synchronize()
    spin(0.5)
    w = dist.all_reduce_bucketed([h, d], async_op=True)
    early = w.is_completed()
    w.synchronize()
    idle = _stream_idle()
    cp.cuda.Device().synchronize()
    assert idle, "synchronize() returned while the device bucket was still queued behind a 0.5 s kernel"
    assert not early, "is_completed() was True while the device bucket was still queued"
    assert h.tolist() == [float(n())] * 1000 and _np(d).tolist() == [float(n())] * 1000


def test_future_of_an_nccl_work_is_completed_at_enqueue_as_torch(nccl):
    """SUSPECT (torch parity, lower severity): torch's ProcessGroupNCCL marks a collective's future completed
    right after enqueueing it (a CUDA future: value() is the outputs, ordered by events), so
    ``work.get_future().done()`` is True and ``.value()`` returns ``[tensor]`` at once. Here the Future is
    completed only by wait()/is_completed() (backends/nccl/work.py:79-84, work.py:511-517): behind queued GPU
    work done() is False and value() raises DistError."""
    x = cp.full(16, 1.0, dtype=cp.float32)
    cp.cuda.Device().synchronize()
    spin(0.3)
    w = dist.all_reduce(x, async_op=True)
    fut = w.get_future()
    done_at_once = fut.done()
    try:
        value = fut.value()
    except Exception as exc:  # the defect: DistError
        value = exc
    cp.cuda.Device().synchronize()
    assert done_at_once, "the future of an enqueued NCCL collective is not done (torch: done at enqueue)"
    assert isinstance(value, list) and value[0] is x, f"future.value() gave {value!r}"


# ====================================================================== SUSPECT: argument errors after buckets moved


def test_bucketed_refuses_a_dtype_nccl_lacks_before_any_bucket_moves(nccl):
    """SUSPECT: all_reduce_bucketed's docstring: errors for 'a dtype it holds, op for one of those dtypes'
    are raised 'before any bucket moves'. It checks only resolve_op (MPI's view: int16 reduces fine), then runs
    the buckets one by one (bucketing.py:199-206); NCCL's refusal of int16 comes from NCCLEngine._plan
    (engine.py:268-275 via types.py:201-203) inside the second bucket, after the float32 bucket was already
    premultiplied and reduced. The caller gets TypeError with its float32 array modified."""
    x = cp.full(4, 1.0, dtype=cp.float32)
    bad = cp.ones(4, dtype=cp.int16)
    with pytest.raises(TypeError, match="int16"):
        dist.all_reduce_bucketed([x, bad], op=PREMUL(2.0))
    cp.cuda.Device().synchronize()
    assert _np(x).tolist() == [1.0] * 4, f"the float32 bucket moved before the int16 one was refused: {_np(x)}"


def test_bucketed_with_a_host_array_on_an_nccl_only_group_refuses_before_any_bucket_moves(nccl):
    """SUSPECT: same promise, another refusal: on a group with backend 'nccl' a NumPy array cannot move
    (ProcessGroup.engine raises ValueError, group.py:155-163), but the CUDA bucket that comes first in the
    list is reduced before the host bucket's engine lookup raises (bucketing.py:205-206, collectives.py
    reduce_list -> _engine). The caller gets ValueError with its CuPy array premultiplied."""
    g = dist.new_group(backend="nccl")
    try:
        x = cp.full(4, 1.0, dtype=cp.float32)
        h = np.ones(4, dtype=np.float32)
        with pytest.raises(ValueError, match="cpu"):
            dist.all_reduce_bucketed([x, h], op=PREMUL(2.0), group=g)
        cp.cuda.Device().synchronize()
        assert _np(x).tolist() == [1.0] * 4, f"the CUDA bucket moved before the host one was refused: {_np(x)}"
    finally:
        dist.destroy_process_group(g)


# ====================================================================== SUSPECT: p2p, lifetimes, streams


def test_batch_isend_irecv_with_this_rank_as_peer(nccl):
    """SUSPECT (torch parity): torch's own suite has test_batch_isend_irecv_self_nccl: rank 0 batches an irecv
    from 0 and an isend to 0, which NCCL runs in one group call (a ring exchange at world size 1 does the same).
    hpcdist's batch_isend_irecv calls _peer(..., allow_any=False), which refuses this rank as peer with
    'would deadlock' (p2p.py:65-76, 247), although NCCLEngine.batch_p2p posts the whole batch between
    groupStart/groupEnd (engine.py:518-531), where a send to self matches the receive."""
    if torch_cuda():
        a = torch.arange(6, dtype=torch.float32, device="cuda") + 1
        b = torch.full((6,), -1.0, device="cuda")
    else:
        a = cp.arange(6, dtype=cp.float32) + 1
        b = cp.full(6, -1.0, dtype=cp.float32)
    works = dist.batch_isend_irecv([dist.P2POp(dist.irecv, b, me()), dist.P2POp(dist.isend, a, me())])
    for w in works:
        w.wait()
    cp.cuda.Device().synchronize()
    assert _np(b).tolist() == _np(a).tolist()


def test_dropped_async_work_keeps_the_arrays_alive_until_the_gpu_is_done(nccl):
    """FIXED (failed on the H100 before): DESIGN: a Work 'keeps buffers alive until it completes'; torch's
    ProcessGroupNCCL keeps a dropped Work's tensors (recordStream / stashed tensors held by its watchdog) until
    the GPU finished. A CudaEventWork holds its arrays only in _keep/_result (backends/nccl/work.py:41,
    engine.py:264-266) and nothing else does (the watchdog keeps just an event): dropping the Work of an
    operation queued on a side stream frees the array at once. CuPy's pool returns the block to the arena of
    the stream it was allocated on (the default stream here), hands it to the next allocation there, and the
    queued PREMUL_SUM scaling then writes into that new array. Now a dropped Work hands its arrays to
    backends/nccl/work.py's _DROPPED until its event completed."""
    side = cp.cuda.Stream(non_blocking=True)
    count = 3_000_011  # an odd size: the freed block is the only one of its bin in the pool
    x = cp.ones(count, dtype=cp.float32)  # allocated on the default stream
    ptr = x.data.ptr
    cp.cuda.Device().synchronize()
    with side:
        spin(0.5)
        dist.all_reduce(x, op=PREMUL(3.0), async_op=True)  # the Work is dropped at once
    del x
    y = cp.full(count, 5.0, dtype=cp.float32)  # the default stream: runs at once, beside the side stream
    reused = y.data.ptr == ptr
    side.synchronize()
    cp.cuda.Device().synchronize()
    lo, hi = float(y.min()), float(y.max())
    assert lo == hi == 5.0, (
        f"a new array was overwritten by a dropped operation (its memory was reused: {reused}); min {lo} max {hi}"
    )


def test_a_work_dropped_in_a_reference_cycle_hands_over_a_live_event(nccl):
    """FIXED (crashed the process on the H100): a Work whose future was asked for and its Future reference
    each other; dropped, they die in the cycle collector, which also ran the finalizer of the Work's CuPy Event
    (CuPy's Event.__del__ destroys the CUDA event). The Work's __del__ handed _DROPPED that destroyed event,
    CUDA gave its handle to the next event created, and a later release_dropped() query segfaulted (the whole
    tests/gpu run died so at 1 rank). The handed-over event must be live: pending while the GPU is busy."""
    import gc

    from hpcdist.backends.nccl import work as nccl_work

    x = cp.ones(1 << 16, dtype=cp.float32)
    dist.all_reduce(x)  # the communicator exists: its setup would wait for the spin
    cp.cuda.Device().synchronize()
    gc.collect()  # earlier tests' garbage is handed over now, not below
    x.fill(1.0)
    spin(0.3)
    w = dist.all_reduce(x, async_op=True)
    w.get_future()  # the Work and its Future now reference each other
    before = len(nccl_work._DROPPED)
    del w
    gc.collect()
    assert len(nccl_work._DROPPED) == before + 1
    ev = nccl_work._DROPPED[-1][0]
    assert ev.done is False  # queued behind the spin: a live event (a destroyed one raises or reads another's)
    cp.cuda.Device().synchronize()
    assert ev.done is True
    nccl_work.release_dropped()
    assert cp.asnumpy(x).tolist() == [float(n())] * (1 << 16)


def test_blocking_call_on_a_side_stream_keeps_the_arrays_alive_until_the_gpu_is_done(nccl):
    """The blocking form of the test above: async_op=False returns once the operation is enqueued on the side
    stream, the caller frees the array (allocated on the default stream) and a new array there must not get its
    memory while the queued operation still writes it (torch's ProcessGroupNCCL records the stream / stashes
    the tensors for blocking calls too)."""
    side = cp.cuda.Stream(non_blocking=True)
    count = 3_000_017
    x = cp.ones(count, dtype=cp.float32)
    cp.cuda.Device().synchronize()
    with side:
        spin(0.5)
        dist.all_reduce(x, op=PREMUL(3.0))
    del x
    y = cp.full(count, 5.0, dtype=cp.float32)
    side.synchronize()
    cp.cuda.Device().synchronize()
    lo, hi = float(y.min()), float(y.max())
    assert lo == hi == 5.0, f"a new array was overwritten by a blocking operation on a side stream; min {lo} max {hi}"


def _capture_while_another_thread_queries_an_event(local: bool) -> str | None:
    """Capture a graph in global mode on this thread while another thread (in thread-local capture mode when
    ``local``) queries an event recorded before the capture; None if the capture held and replays correctly,
    else the capture's error."""
    from hpcdist.gpu.streams import thread_local_capture_mode

    s = cp.cuda.Stream(non_blocking=True)
    x = cp.zeros(16, dtype=cp.float32)
    with s:
        x += 1.0  # the kernel is compiled and loaded before the capture
    ev = s.record()
    s.synchronize()
    go, asked = threading.Event(), threading.Event()
    seen: list[object] = []

    def other() -> None:
        if local:
            seen.append(thread_local_capture_mode())
        go.wait(30)
        try:
            seen.append(ev.done)
        except Exception as exc:
            seen.append(exc)
        asked.set()

    t = threading.Thread(target=other)
    t.start()
    s.begin_capture(mode=getattr(cp.cuda.runtime, "streamCaptureModeGlobal", 0))
    with s:
        x += 1.0
    go.set()
    asked.wait(30)
    try:
        graph = s.end_capture()
    except Exception as exc:
        t.join(30)
        return f"{type(exc).__name__}: {exc} (the other thread saw {seen!r})"
    t.join(30)
    if local:
        assert seen[0] is True, "cuThreadExchangeStreamCaptureMode failed on this machine"
    assert seen[-1] is True, seen  # the query itself answered: the event completed before the capture
    graph.launch(s)
    s.synchronize()
    assert float(x[0]) == 2.0  # once before the capture, once by the replay (the capture itself runs nothing)
    return None


def test_an_event_query_in_thread_local_mode_leaves_another_threads_global_capture_intact(nccl):
    """The mechanism of the watchdog's fix: a thread in thread-local capture mode (what the watchdog's thread
    asks for when it starts) may query events while another thread captures in global mode (torch.cuda.graph's
    default); the same query from a thread in the default global mode invalidates the capture (the control,
    which shows this test can tell)."""
    control = _capture_while_another_thread_queries_an_event(local=False)
    assert control is not None, "the control's capture held: a global-mode query no longer invalidates captures"
    assert _capture_while_another_thread_queries_an_event(local=True) is None
    x = cp.ones(8, dtype=cp.float32)
    dist.all_reduce(x)  # starts the watchdog's thread if no earlier test did
    wd = dist.group.WORLD.engine("cuda")._watch
    if wd is not None:
        assert wd._thread is not None and wd._thread.is_alive() and wd.stopped is None


def test_arrays_of_two_libraries_are_ordered_after_each_librarys_current_stream(nccl):
    """SUSPECT (lower severity, mixed libraries): streams.py's rule: 'an operation on a device array is
    ordered on the current stream of the library that owns the array'. The engine takes the stream of the
    first array only (engine.py:233-236, stream_for(bufs[0])): all_gather_into_tensor(torch output, CuPy
    input) runs on torch's current stream, not after the CuPy stream that is still producing the input, so it
    reads the input before it was written."""
    _need_torch()
    side = cp.cuda.Stream(non_blocking=True)
    out = torch.zeros(4096 * n(), device="cuda")
    torch.cuda.synchronize()
    with side:  # CuPy's current stream: the input is produced here
        inp = cp.zeros(4096, dtype=cp.float32)
        spin(0.5)
        inp += 7.0  # behind the spin
        dist.all_gather_into_tensor(out, inp)
    side.synchronize()
    torch.cuda.synchronize()
    got = _np(out)
    assert np.all(got == 7.0), f"the gather read the CuPy input before its stream wrote it: {got[:4]}"


# ====================================================================== SUSPECT: CUDA graph capture and the watchdog

CAPTURE = textwrap.dedent(
    """
    import time
    from datetime import timedelta
    import torch
    import hpcdist as dist

    dist.init_process_group("nccl", timeout=timedelta(seconds=3))
    inp = torch.arange(4096, dtype=torch.float32, device="cuda")
    out = torch.zeros(4096, device="cuda")
    dist.all_gather_into_tensor(out, inp)  # the communicator exists before the capture
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        dist.all_gather_into_tensor(out, inp)
        time.sleep(0.5)  # the capture spans several polls of the watchdog (every 0.1 s)
    print("captured", flush=True)
    inp.add_(1.0)
    out.zero_()
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, inp), (out[:4], inp[:4])
    print("replayed", flush=True)
    time.sleep(6.0)  # past the group's 3 s timeout and the guard's 2 s grace: nothing may end this process
    wd = dist.group.WORLD.engine("cuda")._watch
    assert wd is None or wd._thread.is_alive(), "the NCCL watchdog thread died"
    print("ok", flush=True)
    dist.destroy_process_group()
    """
)


def _run_child(tmp_path, source: str, limit: float = 90.0, **env_extra: str) -> tuple[int, str]:
    """Run ``source`` as a one-rank job of its own (as test_gpu_nccl_jobs.py does); (exit code, output)."""
    script = tmp_path / "child.py"
    script.write_text(source)
    launcher = ("PMI_", "PMIX_", "OMPI_", "SLURM_", "HYDRA_", "MPI_LOCAL", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(launcher) and k not in TORCHRUN_VARS}
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests" / "gpu")]),
        PYTHONUNBUFFERED="1",
        HPCDIST_FLIGHT_DIR=str(tmp_path / "flight"),
        **env_extra,
    )
    res = MPIRUN.run_limited([sys.executable, str(script)], env, limit)
    if res.timed_out:
        pytest.fail(f"the one-rank NCCL job did not end within {limit:g} s; its output: {res.output[-3000:]!r}")
    return res.returncode, res.output


def test_cuda_graph_capture_of_an_nccl_collective_with_the_watchdog_on(nccl, tmp_path):
    """FIXED (failed on the H100 before; the watchdog's thread now runs in thread-local capture mode and stops
    with a warning, its guard disarmed, should a look fail): torch supports capturing NCCL collectives in a CUDA
    graph (its watchdog
    coordinates its event queries with capture: CUDAGraph::inc_pending_event_queries). Here the collective's
    watchdog note records an event on the capturing stream (watchdog.py:146-161), and the watchdog thread
    queries events every 0.1 s (watchdog.py:187, ``ev.done`` = cudaEventQuery) with no regard to capture:
    querying a captured event is illegal (and invalidates a global-mode capture), an exception kills the
    thread silently (watchdog.py:212-222 catches nothing) and leaves the guard armed, and an event recorded only
    in a capture may never read as done (a false timeout that ends the job). Runs in a child process; on failure
    the same script runs once more with HPCDIST_NCCL_WATCHDOG=0 to tell whether the watchdog is the cause."""
    if not torch_cuda():
        pytest.skip("torch has no CUDA here")
    code, out = _run_child(tmp_path, CAPTURE)
    if code == 0 and "ok" in out.split() and "Exception in thread" not in out:
        return
    code_off, out_off = _run_child(tmp_path, CAPTURE, HPCDIST_NCCL_WATCHDOG="0")
    verdict = "passes" if code_off == 0 and "ok" in out_off.split() else "fails too"
    pytest.fail(
        f"graph capture with the watchdog on: exit {code}, output tail {out[-2500:]!r}; "
        f"with HPCDIST_NCCL_WATCHDOG=0 it {verdict} (exit {code_off}, tail {out_off[-800:]!r})"
    )


# ====================================================================== GUARD: streams and Work


def test_torch_side_stream_orders_after_queued_work_and_wait_orders_the_consumer(nccl):
    """GUARD: torch tensors use torch's current stream (streams.py:255-258): inside torch.cuda.stream(side)
    the reduction is queued behind the producer on side; Work.wait() outside makes torch's default stream wait
    on the event (backends/nccl/work.py:60-66, 79), so a consumer there sees the result."""
    _need_torch()
    side = torch.cuda.Stream()
    t = torch.zeros(1 << 16, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        with cp.cuda.ExternalStream(side.cuda_stream):
            spin(0.3)
        t.fill_(3.0)  # behind the spin on side
        w = dist.all_reduce(t, op=PREMUL(2.0), async_op=True)
        early = w.is_completed()
    assert w.wait() is True
    y = t * 1.0  # on the default stream, after the wait
    torch.cuda.synchronize()
    assert not early
    assert np.all(_np(y) == 6.0 * n())
    assert w.is_completed() and w.is_success() and w.exception() is None


def test_strided_torch_output_of_an_async_reduction_on_a_side_stream(nccl):
    """GUARD: a non-contiguous torch output goes through a contiguous copy whose write-back (copy_) is queued on
    the same torch stream before the Work's event (engine.py:307-314, gpu/adapters.py:191-196): after wait(),
    a read on the default stream sees the result in the view and the other column untouched."""
    _need_torch()
    side = torch.cuda.Stream()
    base = torch.zeros(64, 2, device="cuda")
    torch.cuda.synchronize()
    with torch.cuda.stream(side):
        with cp.cuda.ExternalStream(side.cuda_stream):
            spin(0.3)
        base[:, 1].fill_(2.0)
        w = dist.all_reduce(base[:, 1], op=PREMUL(3.0), async_op=True)
    w.wait()
    got = _np(base)  # .cpu() on the default stream, which now waits for the event
    assert got[:, 1].tolist() == [6.0 * n()] * 64 and got[:, 0].tolist() == [0.0] * 64


def test_future_then_chain_and_results_of_nccl_works(nccl):
    """GUARD: the host test of futures is skipped on NCCL (conftest): then() callbacks run when wait()
    completes the future, and the value read in the callback (CuPy's get on the current stream, which waited on
    the event) holds the result; result() and future.wait() give the user's arrays."""
    xs = [cp.full(10, float(me() + i), dtype=cp.float64) for i in range(3)]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    fut = works[0].get_future()
    chained = fut.then(lambda f: float(cp.asnumpy(f.value()[0]).sum()))
    for w in works:
        assert w.wait() is True
    for w in works:
        w.synchronize()
        assert w.is_completed() and w.is_success() and w.exception() is None
    assert fut.done()
    assert chained.wait() == pytest.approx(10.0 * sum(range(n())))
    assert works[1].result()[0] is xs[1] and fut.wait()[0] is xs[0]
    for i, x in enumerate(xs):
        assert cp.asnumpy(x).tolist() == [float(sum(r + i for r in range(n())))] * 10


def test_many_outstanding_works_and_the_watchdog_queue(nccl):
    """GUARD: 300 async reductions queued behind a kernel: the watchdog shares events within its 1 ms buckets
    (watchdog.py:146-163), nothing completes early, the last Work's synchronize covers all, and the watchdog
    thread empties its queue, recycles at most 64 events, and stays alive."""
    wd = dist.group.WORLD.engine("cuda")._watch
    if wd is None:
        pytest.skip("HPCDIST_NCCL_WATCHDOG=0")
    x = cp.ones(256, dtype=cp.float32)
    cp.cuda.Device().synchronize()
    spin(0.3)
    works = [dist.all_reduce(x, op=dist.ReduceOp.AVG, async_op=True) for _ in range(300)]
    assert wd.pending() >= 1
    assert not works[0].is_completed()
    works[-1].synchronize()
    assert all(w.is_completed() for w in works)
    deadline = time.monotonic() + 3.0
    while wd.pending() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert wd.pending() == 0
    assert wd._thread is not None and wd._thread.is_alive()
    assert len(wd._free) <= 64
    assert cp.asnumpy(x).tolist() == [1.0] * 256


# ====================================================================== GUARD: data, dtypes, shapes

_TABLE = [
    "int8",
    "uint8",
    "int32",
    "uint32",
    "int64",
    "uint64",
    "float16",
    "float32",
    "float64",
    "complex64",
    "complex128",
    "bool",
]


def _ops_for(dtype: str) -> list[str]:
    if dtype.startswith("complex"):
        return ["SUM", "AVG"]
    if dtype == "bool":
        return ["SUM", "MIN", "MAX", "PRODUCT"]
    return ["SUM", "MIN", "MAX", "PRODUCT", "AVG"]


def _same_input_reference(base: np.ndarray, opname: str, ranks: int) -> np.ndarray:
    """Every rank reduces the same ``base``: the result of ``opname`` over ``ranks`` ranks."""
    if base.dtype == np.bool_ or opname in ("MIN", "MAX", "AVG"):
        return base
    wide = base.astype(np.complex128 if base.dtype.kind == "c" else np.float64)
    return (wide * ranks if opname == "SUM" else wide**ranks).astype(base.dtype)


def test_nccl_type_table_moves_every_element_of_every_dtype(nccl):
    """GUARD: out-of-place reduce_scatter_tensor makes NCCL copy count x sizeof(datatype) bytes even at one
    rank, so a wrong entry of NCCL_DTYPES or of complex's per_element (types.py:147-163, 214) shows as a
    partly filled output; every dtype NCCL reduces, with every op it takes (bool as MIN/MAX, complex as pairs)."""
    k = 7
    for dtype in _TABLE:
        ramp = np.arange(n() * k)
        base = (ramp % 2).astype(bool) if dtype == "bool" else (ramp % 3 + 1).astype(dtype)
        for opname in _ops_for(dtype):
            out = cp.zeros(k, dtype=dtype)
            dist.reduce_scatter_tensor(out, cp.asarray(base), op=getattr(dist.ReduceOp, opname))
            want = _same_input_reference(base, opname, n())[me() * k : (me() + 1) * k]
            got = cp.asnumpy(out)
            assert np.array_equal(got, want), (dtype, opname, got, want)
    if torch_cuda():
        base = (np.arange(n() * k) % 3 + 1).astype(np.float32)
        for opname in _ops_for("float32"):
            out_t = torch.zeros(k, dtype=torch.bfloat16, device="cuda")
            inp_t = torch.tensor(base, device="cuda").to(torch.bfloat16)
            dist.reduce_scatter_tensor(out_t, inp_t, op=getattr(dist.ReduceOp, opname))
            want = _same_input_reference(base, opname, n())[me() * k : (me() + 1) * k]
            assert np.array_equal(_np(out_t), want), ("bfloat16", opname, _np(out_t), want)


@pytest.mark.parametrize(
    ("dtype", "factor"),
    [
        ("int8", 3),
        ("uint32", 5),
        ("uint64", 7),
        ("int64", -2),
        ("float16", 0.5),
        ("complex64", 1 + 2j),
        ("complex128", 2j),
    ],
)
def test_premul_sum_on_dtypes_the_shared_matrix_leaves_out(nccl, dtype, factor):
    """GUARD: PREMUL_SUM scales with CuPy before NCCL sums (engine.py:115-124): in place (all_reduce), on a copy
    (reduce, reduce_scatter_tensor: the input stays as it was); int8/uint32/uint64/complex64 are not in the
    shared dtype matrix of tests/mpi."""
    k = 6
    base = (np.arange(n() * k) % 3 + 1).astype(dtype)
    kind = np.complex128 if base.dtype.kind == "c" else (np.float64 if base.dtype.kind == "f" else np.int64)
    want = (base.astype(kind) * factor * n()).astype(dtype)
    x = cp.asarray(base)
    dist.all_reduce(x, op=PREMUL(factor))
    assert np.array_equal(cp.asnumpy(x), want), (cp.asnumpy(x), want)
    inp = cp.asarray(base)
    out = cp.zeros(k, dtype=dtype)
    dist.reduce_scatter_tensor(out, inp, op=PREMUL(factor))
    assert np.array_equal(cp.asnumpy(out), want[me() * k : (me() + 1) * k])
    assert np.array_equal(cp.asnumpy(inp), base)
    y = cp.asarray(base)
    dist.reduce(y, dst=0, op=PREMUL(factor))
    assert np.array_equal(cp.asnumpy(y), want if me() == 0 else base)


@pytest.mark.parametrize("kind", ["cupy", "torch"])
def test_zero_size_and_0d_device_arrays(nccl, kind):
    """GUARD: tests/gpu runs no zero-size or 0-d device array (test_zero_size_and_scalar is host-only): a
    zero-size CuPy array has data.ptr 0 and NCCL gets count 0 (collectives) or nothing (the engine's own
    copies skip 0 bytes); a 0-d array is one element, a 0-d bfloat16 tensor goes through widen/narrow."""
    if kind == "torch":
        _need_torch()

    def arr(data, dtype="float32"):
        host = np.asarray(data, dtype=dtype)
        return cp.asarray(host) if kind == "cupy" else torch.tensor(host, device="cuda")

    z = arr(np.zeros(0))
    dist.all_reduce(z)
    dist.all_reduce(z, op=PREMUL(2.0))
    dist.all_reduce(z, op=dist.ReduceOp.AVG)
    dist.broadcast(z, src=0)
    dist.reduce(z, dst=0)
    out0 = arr(np.zeros(0))
    dist.all_gather_into_tensor(out0, z)
    dist.reduce_scatter_tensor(out0, arr(np.zeros(0)))
    dist.all_gather([arr(np.zeros(0)) for _ in range(n())], z)
    dist.all_to_all_single(out0, arr(np.zeros(0)))
    w = dist.all_reduce(z, async_op=True)
    w.synchronize()
    assert w.is_completed() and w.result()[0] is z
    s = arr(np.array(3.0))  # 0-d
    dist.all_reduce(s, op=PREMUL(2.0))
    assert float(_np(s)) == 6.0 * n()
    dist.broadcast(s, src=0)
    gathered = arr(np.zeros(n()))
    dist.all_gather_into_tensor(gathered, s)
    assert _np(gathered).tolist() == [6.0 * n()] * n()
    if kind == "torch":
        b = torch.tensor(3.0, dtype=torch.bfloat16, device="cuda")
        dist.all_reduce(b, op=PREMUL(2.0))
        assert float(b.float().item()) == 6.0 * n()


def test_strided_outputs_and_inputs_of_gathers_scatters_and_reduce_scatter(nccl):
    """GUARD: the device twin of the host-only test_non_contiguous_in_and_out, for every collective that
    writes a list or a slot: strided CuPy outputs go through a contiguous copy and a write-back
    (gpu/adapters.py:87-102), per output after the all_gather unpack (buffers/packing.py:37-43); torch outputs
    (a transposed 2-D output too) through copy_. Results in logical (row-major) order, as NumPy's."""
    k, r0 = 5, me()
    inp_host = np.arange(2 * k, dtype=np.float32).reshape(k, 2) + 10 * r0
    inp = cp.asarray(inp_host)[:, 0]
    big = cp.zeros((n() * k, 2), dtype=cp.float32)
    dist.all_gather_into_tensor(big[:, 1], inp)
    want = np.concatenate([(np.arange(2 * k, dtype=np.float32).reshape(k, 2) + 10 * r)[:, 0] for r in range(n())])
    assert np.array_equal(cp.asnumpy(big[:, 1]), want) and not cp.asnumpy(big[:, 0]).any()
    outs = [cp.zeros((k, 3), dtype=cp.float32)[:, 2] for _ in range(n())]
    dist.all_gather(outs, inp)
    for r, o in enumerate(outs):
        assert np.array_equal(cp.asnumpy(o), want[r * k : (r + 1) * k])
    rs_src = np.arange(n() * k * 2, dtype=np.float32).reshape(n() * k, 2)
    rs_big = cp.zeros((k, 2), dtype=cp.float32)
    dist.reduce_scatter_tensor(rs_big[:, 0], cp.asarray(rs_src)[:, 1], op=PREMUL(2.0))
    assert np.array_equal(cp.asnumpy(rs_big[:, 0]), 2 * n() * rs_src[r0 * k : (r0 + 1) * k, 1])
    assert not cp.asnumpy(rs_big[:, 1]).any()
    sc_big = cp.zeros((k, 2), dtype=cp.float32)
    sc_list = [cp.asarray(rs_src)[r * k : (r + 1) * k, 1] for r in range(n())] if r0 == 0 else None
    dist.scatter(sc_big[:, 0], sc_list, src=0)
    assert np.array_equal(cp.asnumpy(sc_big[:, 0]), rs_src[r0 * k : (r0 + 1) * k, 1])
    g_bigs = [cp.zeros((k, 2), dtype=cp.float32) for _ in range(n())]
    dist.gather(inp, [b[:, 1] for b in g_bigs] if r0 == 0 else None, dst=0)
    if r0 == 0:
        for r, b in enumerate(g_bigs):
            assert np.array_equal(cp.asnumpy(b[:, 1]), want[r * k : (r + 1) * k]) and not cp.asnumpy(b[:, 0]).any()
    a_big = cp.zeros((n() * k, 2), dtype=cp.float32)
    dist.all_to_all_single(a_big[:, 1], cp.arange(n() * k, dtype=cp.float32) + 1000 * r0)
    a_want = np.concatenate([np.arange(r0 * k, (r0 + 1) * k, dtype=np.float32) + 1000 * r for r in range(n())])
    assert np.array_equal(cp.asnumpy(a_big[:, 1]), a_want)
    if torch_cuda():
        t_out = torch.zeros(k, n(), device="cuda").t()  # (n, k), not contiguous
        dist.all_gather_into_tensor(t_out, torch.arange(k, dtype=torch.float32, device="cuda") + 10 * r0)
        assert np.array_equal(_np(t_out), np.stack([np.arange(k, dtype=np.float32) + 10 * r for r in range(n())]))
        t_rs = torch.zeros(k, 3, device="cuda")
        dist.reduce_scatter_tensor(t_rs[:, 2], torch.arange(n() * k, dtype=torch.float32, device="cuda"))
        assert np.array_equal(_np(t_rs[:, 2]), n() * np.arange(r0 * k, (r0 + 1) * k, dtype=np.float32))
        assert not _np(t_rs[:, :2]).any()


def test_bad_arguments_are_refused_before_anything_is_enqueued(nccl):
    """GUARD: roots out of range, dtype and size mismatches, an int16 reduction, complex MAX and a send to this
    rank raise (ValueError/TypeError, as torch raises for them) before anything reaches the stream: the arrays
    stay as they were and the group still works."""
    x = cp.arange(4, dtype=cp.float32) + 1
    with pytest.raises(ValueError):
        dist.broadcast(x, src=n())
    with pytest.raises(ValueError):
        dist.reduce(x, dst=n() + 3)
    with pytest.raises(TypeError):
        dist.all_gather_into_tensor(cp.zeros(4 * n(), dtype=cp.float64), x)
    with pytest.raises(ValueError):
        dist.reduce_scatter_tensor(cp.zeros(3, dtype=cp.float32), cp.zeros(4 * n(), dtype=cp.float32))
    with pytest.raises(TypeError, match="int16"):
        dist.reduce_scatter_tensor(cp.zeros(2, dtype=cp.int16), cp.ones(2 * n(), dtype=cp.int16))
    with pytest.raises(ValueError):
        dist.all_reduce(cp.ones(4, dtype=cp.complex64), op=dist.ReduceOp.MAX)
    with pytest.raises(ValueError, match="own rank"):
        dist.send(x, dst=me())
    with pytest.raises(ValueError):
        dist.all_reduce(cp.ones(4, dtype=cp.float32), op=PREMUL(2.5j))
    cp.cuda.Device().synchronize()
    assert cp.asnumpy(x).tolist() == [1.0, 2.0, 3.0, 4.0]
    dist.all_reduce(x)
    assert cp.asnumpy(x).tolist() == [float(v * n()) for v in (1, 2, 3, 4)]


def test_nccl_only_group_barrier_host_arrays_and_destroy_with_work_outstanding(nccl):
    """GUARD: a group with backend 'nccl': its barrier waits for the GPU first (engine.py:284-291; torch's NCCL
    barrier blocks the host too), a NumPy array is refused with ValueError, and destroy_process_group(group)
    with a reduction still queued leaves that Work able to synchronize, with the right result."""
    g = dist.new_group(backend="nccl")
    try:
        x = cp.full(1 << 16, 1.0, dtype=cp.float32)
        cp.cuda.Device().synchronize()
        spin(0.3)
        w = dist.all_reduce(x, op=PREMUL(2.0), group=g, async_op=True)
        dist.barrier(group=g)
        assert _stream_idle(), "barrier on an NCCL-only group returned while its reduction was queued"
        assert w.is_completed() and float(x[0]) == 2.0 * n()
        with pytest.raises(ValueError, match="cpu"):
            dist.all_reduce(np.ones(2), group=g)
        y = cp.full(8, 1.0, dtype=cp.float32)
        spin(0.3)
        w2 = dist.all_reduce(y, op=PREMUL(3.0), group=g, async_op=True)
    finally:
        dist.destroy_process_group(g)
    w2.synchronize()
    assert w2.is_completed() and cp.asnumpy(y).tolist() == [3.0 * n()] * 8


def test_object_collectives_carry_cuda_tensors_and_cupy_arrays(nccl):
    """GUARD: object collectives run over MPI (host memory) on an NCCL group; torch CUDA tensors and CuPy arrays
    inside objects come back as device arrays with their values (torch's all_gather_object semantics)."""
    from hpcdist import config

    _need_torch()
    if config.object_unpickler() != "full":
        pytest.skip("HPCDIST_OBJECT_UNPICKLER=restricted refuses torch and CuPy classes by design")
    obj = {"t": torch.arange(3, dtype=torch.float32, device="cuda") + me(), "c": cp.arange(3) + me(), "r": me()}
    got = [None] * n()
    dist.all_gather_object(got, obj)
    for r, o in enumerate(got):
        assert o["r"] == r and o["t"].is_cuda and _np(o["t"]).tolist() == [float(r + i) for i in range(3)]
        assert isinstance(o["c"], cp.ndarray) and cp.asnumpy(o["c"]).tolist() == [r + i for i in range(3)]
    lst = [obj if me() == 0 else None]
    dist.broadcast_object_list(lst, src=0)
    assert lst[0]["r"] == 0 and lst[0]["t"].is_cuda and _np(lst[0]["t"]).tolist() == [0.0, 1.0, 2.0]
