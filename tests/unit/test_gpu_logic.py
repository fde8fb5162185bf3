"""GPU support logic that needs no GPU: detection order, device maps and selection,
staging pool, NCCL type plans, adapter dispatch and errors.

Array-protocol objects here are plain Python objects exposing
``__cuda_array_interface__`` / DLPack; MPI is the real one (a singleton).
"""

from __future__ import annotations

import importlib.util
import os
import warnings

import numpy as np
import pytest

import hpcdist
from hpcdist.backends import parse_backend
from hpcdist.backends.nccl.types import AVG_VERSION, NCCL_DTYPES, NCCL_OPS, nccl_reduction
from hpcdist.backends.staged.pinned import PinnedPool, host_view, size_class
from hpcdist.buffers.adapters import TORCH_DEVICE_ADAPTERS, adapt
from hpcdist.gpu import cuda_aware as ca
from hpcdist.gpu.device import (
    bound_device_index,
    ordinal_for_local_rank,
    physical_device,
    visible_devices,
)
from hpcdist.ops import ReduceOp, resolve_op

pytestmark = pytest.mark.timeout(60)

HAVE_CUPY = importlib.util.find_spec("cupy") is not None
NEW = AVG_VERSION + 1000  # an NCCL with ncclAvg and bfloat16
OLD = 2800


# ------------------------------------------------------------------ CUDA-aware detection order


def test_override_beats_mpi_answer_and_vendor_settings():
    env = {"HPCDIST_CUDA_AWARE": "0", "MV2_USE_CUDA": "1"}
    got = ca.detect(env, (True, "MPIX_Query_cuda_support() returned 1"))
    assert (got.enabled, got.source) == (False, "override")
    assert "HPCDIST_CUDA_AWARE=0" in got.reason
    got = ca.detect({"HPCDIST_CUDA_AWARE": "yes"}, (False, "x"))
    assert got.enabled and bool(got) and got.source == "override"


def test_mpi_answer_beats_vendor_settings():
    got = ca.detect({"MPICH_GPU_SUPPORT_ENABLED": "1"}, (False, "MPIX_Query_cuda_support() returned 0"))
    assert (got.enabled, got.source) == (False, "mpi")
    assert "MPIX_Query_cuda_support" in got.reason


@pytest.mark.parametrize(
    ("var", "value", "expected", "vendor"),
    [
        ("MPICH_GPU_SUPPORT_ENABLED", "1", True, "Cray MPICH"),
        ("MV2_USE_CUDA", "0", False, "MVAPICH2"),
        ("OMPI_MCA_opal_cuda_support", "true", True, "Open MPI"),
        ("MPIR_CVAR_ENABLE_GPU", "1", True, "MPICH"),
    ],
)
def test_vendor_settings_when_mpi_has_no_answer(var, value, expected, vendor):
    got = ca.detect({var: value}, None)
    assert (got.enabled, got.source) == (expected, "vendor")
    assert var in got.reason and vendor in got.reason


def test_vendor_settings_in_registry_order_and_garbage_ignored():
    env = {"MV2_USE_CUDA": "maybe", "OMPI_MCA_opal_cuda_support": "1", "MPIR_CVAR_ENABLE_GPU": "0"}
    got = ca.detect(env, None)
    assert got.enabled and "OMPI_MCA_opal_cuda_support" in got.reason


def test_default_is_not_cuda_aware_with_reason():
    got = ca.detect({}, None)
    assert (got.enabled, got.source) == (False, "default")
    assert "MPIX_Query_cuda_support" in got.reason


def test_garbled_override_names_the_variable():
    with pytest.raises(ValueError, match="HPCDIST_CUDA_AWARE"):
        ca.detect({"HPCDIST_CUDA_AWARE": "perhaps"}, None)


@pytest.mark.parametrize("word", ["1", "off", "Yes", " true ", "", "enable", "disabled", "2"])
def test_override_parses_a_mapping_as_the_environment(word, monkeypatch):
    """HPCDIST_CUDA_AWARE took "enable"/"disabled" from a mapping (hpcdist info of another environment) but refused
    them from os.environ; both read it as every boolean knob now."""

    def outcome(env):
        try:
            got = ca._override(env)
            return None if got is None else got.enabled
        except ValueError as exc:
            return str(exc)

    monkeypatch.setenv("HPCDIST_CUDA_AWARE", word)
    assert outcome({"HPCDIST_CUDA_AWARE": word}) == outcome(os.environ)


def test_register_vendor_setting_rejects_duplicates():
    with pytest.raises(ValueError, match="already registered"):
        ca.register_vendor_setting("MV2_USE_CUDA", "MVAPICH2")
    with pytest.raises(ValueError):
        ca.register_vendor_setting("", "x")


def test_real_mpi_answers_or_says_why():
    from mpi4py import MPI

    answer = ca.query_mpi()
    if MPI.get_vendor()[0] == "MPICH" and MPI.get_vendor()[1] >= (4, 0, 0):
        assert answer is not None and "MPICH" in answer[1]  # MPICH >= 4 exports MPIX_Query_cuda_support
    got = hpcdist.gpu.cuda_aware_mpi(refresh=True)
    assert got.source in ("mpi", "vendor", "default", "override") and got.reason


def test_env_override_is_read_on_every_call(monkeypatch):
    monkeypatch.setenv("HPCDIST_CUDA_AWARE", "1")
    assert hpcdist.gpu.cuda_aware_mpi().source == "override"
    assert hpcdist.gpu.cuda_aware_mpi().enabled
    monkeypatch.setenv("HPCDIST_CUDA_AWARE", "0")
    assert not hpcdist.gpu.cuda_aware_mpi().enabled


# ------------------------------------------------------------------ device maps and selection


def test_device_maps():
    assert parse_backend("cpu:mpi,cuda:nccl") == {"cpu": "mpi", "cuda": "nccl"}
    assert parse_backend("nccl") == {"cuda": "nccl"}
    assert parse_backend("mpi") == {"cpu": "mpi", "cuda": "mpi"}
    with pytest.raises(ValueError, match="device must be 'cpu' or 'cuda'"):
        parse_backend("tpu:nccl")


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        ("", []),
        ("-1", []),
        ("2,3", ["2", "3"]),
        ("0,-1,2", ["0"]),
        (" 1 , 0 ", ["1", "0"]),
        ("GPU-8f6c,MIG-1a2b", ["GPU-8f6c", "MIG-1a2b"]),
        ("1,bogus,2", ["1"]),
    ],
)
def test_visible_devices_follows_cuda_rules(raw, expected):
    env = {} if raw is None else {"CUDA_VISIBLE_DEVICES": raw}
    assert visible_devices(env) == expected


def test_local_rank_maps_onto_visible_devices():
    # every rank sees the node's 4 GPUs
    assert [ordinal_for_local_rank(r, None, ["0", "1", "2", "3"]) for r in range(4)] == [0, 1, 2, 3]
    # the launcher gave each rank its own GPU: ordinal 0 everywhere
    assert [ordinal_for_local_rank(r, None, ["5"]) for r in range(3)] == [0, 0, 0]
    # the runtime count wins over the variable; more ranks than GPUs wrap around
    assert ordinal_for_local_rank(5, 2, ["0", "1", "2"]) == 1
    assert physical_device(1, {"CUDA_VISIBLE_DEVICES": "2,3"}) == "3"
    assert physical_device(1, {}) == "1"
    with pytest.raises(ValueError, match="not visible"):
        physical_device(2, {"CUDA_VISIBLE_DEVICES": "2,3"})


def test_no_visible_device_is_a_clear_error():
    with pytest.raises(RuntimeError, match=r"no CUDA device is visible.*CUDA_VISIBLE_DEVICES ''"):
        ordinal_for_local_rank(0, None, [])
    with pytest.raises(RuntimeError, match="unset"):
        ordinal_for_local_rank(0, None, None)
    with pytest.raises(ValueError, match="local_rank"):
        ordinal_for_local_rank(-1, 2, None)


class _TorchLikeDevice:
    def __init__(self, type_, index):
        self.type, self.index = type_, index


def test_bound_device_index_accepts_torch_forms():
    assert bound_device_index(None) is None
    assert bound_device_index(3) == 3
    assert bound_device_index("cuda:1") == 1
    assert bound_device_index(_TorchLikeDevice("cuda", 2)) == 2
    with pytest.raises(ValueError, match="CUDA device"):
        bound_device_index("cpu")
    with pytest.raises(ValueError, match="CUDA device"):
        bound_device_index(_TorchLikeDevice("cpu", None))
    with pytest.raises(ValueError, match="cuda:N"):
        bound_device_index("cuda:x")
    with pytest.raises(TypeError):
        bound_device_index(True)


# ------------------------------------------------------------------ staging pool


def test_size_classes():
    assert size_class(0) == 0
    assert size_class(1) == 4096
    assert size_class(4096) == 4096
    assert size_class(4097) == 8192
    assert size_class(3 << 20) == 4 << 20
    with pytest.raises(ValueError):
        size_class(-1)


def test_pool_reuses_blocks_across_calls():
    pool = PinnedPool(alloc=lambda n: np.empty(n, np.uint8))
    a = pool.acquire(1000)
    pool.release(a)
    b = pool.acquire(4000)  # same class: the same block back, nothing allocated
    assert b is a and pool.allocations == 1
    c = pool.acquire(4000)  # a's twin still out: a second block
    assert c is not b and pool.allocations == 2
    pool.release(b)
    pool.release(c)
    assert pool.cached_bytes == 8192
    for _ in range(10):
        blk = pool.acquire(3000)
        pool.release(blk)
    assert pool.allocations == 2


def test_pool_caps_what_it_keeps():
    pool = PinnedPool(alloc=lambda n: np.empty(n, np.uint8), max_free_per_class=1, max_cached_bytes=8192)
    x, y = pool.acquire(10), pool.acquire(10)
    pool.release(x)
    pool.release(y)  # over the per-class cap: dropped
    assert pool.cached_bytes == 4096
    big = pool.acquire(5000)  # 8 KiB class
    pool.release(big)  # would exceed 8 KiB in all: dropped
    assert pool.cached_bytes == 4096
    assert pool.acquire(0).nbytes == 0


def test_host_view_shapes_a_block():
    block = np.zeros(4096, np.uint8)
    v = host_view(block, np.dtype(np.float32), (2, 3))
    assert v.shape == (2, 3) and v.dtype == np.float32 and v.flags.c_contiguous
    v[...] = 1.5
    assert block[:24].view(np.float32).tolist() == [1.5] * 6
    assert host_view(block, np.dtype(np.int64), (0, 4)).shape == (0, 4)


# ------------------------------------------------------------------ NCCL plans


def _plan(dtype, op, version=NEW):
    return nccl_reduction(dtype, resolve_op(op, dtype), version)


def test_nccl_plans_native_ops():
    p = _plan("float32", ReduceOp.SUM)
    assert (p.datatype, p.op, p.per_element, p.premul, p.divide_after) == (NCCL_DTYPES["float32"], 0, 1, None, False)
    assert _plan("bfloat16", ReduceOp.MAX).datatype == 9
    assert _plan("int64", ReduceOp.AVG).op == NCCL_OPS["avg"]
    p = _plan("float16", ReduceOp.PREMUL_SUM(0.5))
    assert p.op == NCCL_OPS["sum"] and p.premul == 0.5


def test_nccl_plans_complex_as_float_pairs():
    p = _plan("complex64", ReduceOp.AVG)
    assert (p.datatype, p.op, p.per_element) == (NCCL_DTYPES["float32"], NCCL_OPS["avg"], 2)
    assert _plan("complex128", ReduceOp.SUM).datatype == NCCL_DTYPES["float64"]
    with pytest.raises(ValueError, match="complex"):
        _plan("complex64", ReduceOp.MIN)


def test_nccl_plans_bool_as_logical():
    assert _plan("bool", ReduceOp.SUM).op == NCCL_OPS["max"]
    assert _plan("bool", ReduceOp.BAND).op == NCCL_OPS["min"]
    with pytest.raises(ValueError, match=r"BXOR.*NCCL"):
        _plan("bool", ReduceOp.BXOR)


def test_nccl_refuses_what_it_lacks_with_the_fix():
    with pytest.raises(ValueError, match=r"bitwise.*cpu:mpi,cuda:mpi"):
        _plan("int32", ReduceOp.BOR)
    with pytest.raises(TypeError, match="int16"):
        _plan("int16", ReduceOp.SUM)
    with pytest.raises(TypeError, match=r"bfloat16.*2.10"):
        _plan("bfloat16", ReduceOp.SUM, OLD)


def test_nccl_avg_before_2_10_is_sum_then_divide():
    p = _plan("float32", ReduceOp.AVG, OLD)
    assert p.op == NCCL_OPS["sum"] and p.divide_after


def test_nccl_unique_id_travels_as_bytes_and_fits_every_cupy_form():
    from hpcdist.backends.nccl import make_communicator, unique_id_bytes
    from hpcdist.errors import DistBackendError

    signed_uid = tuple((i * 37) % 256 - 128 for i in range(128))  # get_unique_id() where char is signed (x86-64)
    unsigned_uid = tuple(x & 0xFF for x in signed_uid)  # where char is unsigned (aarch64, ppc64le)
    raw = unique_id_bytes(signed_uid)
    assert raw.dtype == np.uint8 and raw.tolist() == unique_id_bytes(unsigned_uid).tolist() == list(unsigned_uid)

    def char_ctor(lo, hi):  # what CuPy < 14's NcclCommunicator does with the tuple before calling NCCL
        def ctor(n, uid, rank):
            if not isinstance(uid, tuple):
                raise TypeError(f"Argument 'commId' has incorrect type (expected tuple, got {type(uid).__name__})")
            if any(not lo <= x <= hi for x in uid):
                raise OverflowError("value too large to convert to char")
            return n, uid, rank

        return ctor

    assert make_communicator(char_ctor(-128, 127), 3, raw, 2) == (3, signed_uid, 2)
    assert make_communicator(char_ctor(0, 255), 3, raw, 2) == (3, unsigned_uid, 2)

    def bytes_ctor(n, uid, rank):  # CuPy >= 14: get_unique_id() returns bytes and the constructor takes them
        if not isinstance(uid, bytes):
            raise TypeError(f"Argument 'commId' has incorrect type (expected bytes, got {type(uid).__name__})")
        return n, uid, rank

    as_bytes = bytes(unsigned_uid)
    assert unique_id_bytes(as_bytes).tolist() == list(unsigned_uid)
    assert make_communicator(bytes_ctor, 3, raw, 2) == (3, as_bytes, 2)
    with pytest.raises(DistBackendError, match="no form of the unique id"):
        make_communicator(char_ctor(1000, 1001), 3, raw, 2)
    with pytest.raises(DistBackendError, match="128 bytes"):
        unique_id_bytes((1, 2, 3))


# ------------------------------------------------------------------ adapters: dispatch and errors


class _CAI:
    """A plain object that says its memory is on the GPU."""

    def __init__(self, typestr="<f4", readonly=False):
        self.__cuda_array_interface__ = {
            "shape": (4,),
            "typestr": typestr,
            "data": (0x7F0000000000, readonly),
            "version": 3,
            "strides": None,
        }


class _DLPackOn:
    def __init__(self, arr, device):
        self.arr, self.device = arr, device

    def __dlpack__(self, **kwargs):
        return self.arr.__dlpack__(**kwargs)

    def __dlpack_device__(self):
        return self.device


class _DLPackCuda(_DLPackOn):
    pass


@pytest.mark.skipif(HAVE_CUPY, reason="checks the message shown when CuPy is missing")
def test_cuda_array_without_cupy_says_how_to_install_it():
    with pytest.raises(TypeError, match=r"need CuPy.*pip install 'hpcdist\[gpu\]'"):
        adapt(_CAI(), "tensor", False)
    with pytest.raises(TypeError, match=r"DLPack arrays on CUDA.*need CuPy"):
        adapt(_DLPackCuda(np.zeros(3), (2, 0)), "tensor", False)


def test_cuda_array_errors_that_need_no_cupy():
    with pytest.raises(ValueError, match="read-only"):
        adapt(_CAI(readonly=True), "output", True)
    with pytest.raises(TypeError, match="dtype"):
        adapt(_CAI(typestr="|V8"), "tensor", False)


def test_host_dlpack_objects_still_go_to_the_host_path():
    buf = adapt(_DLPackOn(np.arange(3.0), (1, 0)), "tensor", False)
    assert buf.device == "cpu" and buf.arr.tolist() == [0.0, 1.0, 2.0]


def test_host_arrays_are_untouched_by_the_gpu_adapters():
    assert adapt(np.arange(4), "t", True).device == "cpu"
    torch = pytest.importorskip("torch")
    assert adapt(torch.arange(3, dtype=torch.float32, requires_grad=True), "t", False).device == "cpu"
    assert "cuda" in TORCH_DEVICE_ADAPTERS


def test_importing_hpcdist_imports_no_gpu_library():
    import subprocess
    import sys

    code = "import sys, hpcdist, hpcdist.gpu; print('cupy' in sys.modules, 'torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.split() == ["False", "False"], out.stderr


# ------------------------------------------------------------------ groups: engine choice and host arrays under NCCL


@pytest.fixture
def world(request):
    backend = getattr(request, "param", "mpi")
    hpcdist.init_process_group(backend)
    try:
        yield hpcdist.group.WORLD
    finally:
        hpcdist.destroy_process_group()


@pytest.mark.parametrize("world", ["nccl"], indirect=True)
def test_host_array_on_an_nccl_only_group_names_the_device_map(world):
    with pytest.raises(ValueError, match=r"cannot move cpu arrays.*cpu:mpi,cuda:nccl"):
        hpcdist.all_reduce(np.ones(2))


@pytest.mark.skipif(HAVE_CUPY, reason="checks the message shown when CuPy is missing")
def test_cuda_array_on_a_group_without_cupy_fails_before_moving(world):
    with pytest.raises(TypeError, match="need CuPy"):
        hpcdist.all_reduce(_CAI())


def test_staging_decision_follows_the_override(world, monkeypatch):
    from hpcdist.backends.cuda_aware import CudaAwareEngine
    from hpcdist.backends.selection import select_engine
    from hpcdist.backends.staged import StagedEngine

    pg = hpcdist.group.WORLD
    monkeypatch.setenv("HPCDIST_CUDA_AWARE", "0")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an explicit choice of staging does not warn
        assert isinstance(select_engine(pg, "mpi", "cuda"), StagedEngine)
    monkeypatch.setenv("HPCDIST_CUDA_AWARE", "1")
    assert isinstance(select_engine(pg, "mpi", "cuda"), CudaAwareEngine)


def test_staging_without_override_warns_once_with_the_fix(world, monkeypatch):
    from hpcdist.backends import selection
    from hpcdist.backends.staged import StagedEngine

    monkeypatch.delenv("HPCDIST_CUDA_AWARE", raising=False)
    if hpcdist.gpu.cuda_aware_mpi().enabled:
        pytest.skip("this MPI is CUDA-aware: nothing is staged")
    monkeypatch.setattr(selection, "_WARNED", [])
    pg = hpcdist.group.WORLD
    with pytest.warns(RuntimeWarning, match=r"not CUDA-aware.*HPCDIST_CUDA_AWARE"):
        eng = selection.select_engine(pg, "mpi", "cuda")
    assert isinstance(eng, StagedEngine)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        selection.select_engine(pg, "mpi", "cuda")  # once per process


# ------------------------------------------------------------------ NCCL Work: event semantics with plain objects


class _Event:
    def __init__(self, done=False):
        self.done = done


class _Stream:
    def __init__(self):
        self.waited = []

    def wait_event(self, event):
        self.waited.append(event)


def _event_work(event, result):
    from hpcdist.backends.nccl.work import CudaEventWork

    stream = _Stream()

    class Work(CudaEventWork):
        __slots__ = ()

        def _current_stream(self):
            return stream

    return Work(event, ("kept",), 5.0, "all_reduce", result, 0, False), stream


def test_dropped_event_work_keeps_its_arrays_until_its_event_completed():
    """A dropped NCCL Work hands its arrays over until the GPU is done with them (torch stashes them likewise);
    release_dropped() lets go of them oldest first, and nothing is kept for a captured operation."""
    import gc
    import weakref

    from hpcdist.backends.nccl import work as nccl_work
    from hpcdist.backends.nccl.work import CudaEventWork, release_dropped

    class Arr:
        pass

    nccl_work._DROPPED.clear()
    ev1, ev2, ev3 = _Event(), _Event(), _Event()
    a1, a2, a3 = Arr(), Arr(), Arr()
    refs = [weakref.ref(a) for a in (a1, a2, a3)]
    CudaEventWork(ev1, (a1,), 5.0, "all_reduce", a1, 0, False)  # dropped at once
    CudaEventWork(ev2, (a2,), 5.0, "broadcast", a2, 0, False)
    CudaEventWork(ev3, (a3,), 5.0, "all_reduce", a3, 0, False, captured=True)  # runs at each replay: not kept
    del a1, a2, a3
    gc.collect()
    assert [r() is not None for r in refs] == [True, True, False]
    ev2.done = True
    release_dropped()  # the oldest (ev1) is still running: nothing is let go, in order
    gc.collect()
    assert [r() is not None for r in refs] == [True, True, False]
    ev1.done = True
    release_dropped()
    gc.collect()
    assert [r() is not None for r in refs] == [False, False, False] and not nccl_work._DROPPED


class _DestroyedEvent(_Event):
    """As CuPy's Event and Stream: a Python class whose __del__ destroys the CUDA handle."""

    destroyed: list[int] = []
    used_after: list[int] = []

    def __del__(self):
        self.destroyed.append(id(self))

    def synchronize(self):  # as a stream
        if id(self) in self.destroyed:
            self.used_after.append(id(self))

    def __enter__(self):
        self.synchronize()
        return self

    def __exit__(self, *exc):
        return False


@pytest.mark.parametrize("combined", [False, True], ids=["single", "combined"])
def test_a_work_dropped_in_a_reference_cycle_hands_over_a_live_event(combined):
    """A Work and its Future reference each other once get_future() was called: dropped, they die together in
    the cycle collector, which calls the finalizer of everything only they reach. The event went with them: the
    Work's __del__ handed _DROPPED an event already destroyed, whose CUDA handle the next event got (on the H100
    the next release_dropped() crashed the process). The event must outlive its Work untouched."""
    import gc

    from hpcdist.backends.nccl import work as nccl_work
    from hpcdist.backends.nccl.work import CudaEventWork

    nccl_work._DROPPED.clear()
    _DestroyedEvent.destroyed.clear()
    ev = _DestroyedEvent(done=False)
    ev_id = id(ev)
    work = CudaEventWork(ev, ("kept",), 5.0, "all_reduce", None, 0, False)
    if combined:
        work = CudaEventWork.combine([work], "all_reduce_coalesced", 5.0)
    fut = work.get_future()
    assert fut._work is work and work._future is fut  # the cycle
    del ev, work, fut
    gc.collect()
    assert nccl_work._DROPPED, "the dropped Work handed nothing over"
    assert [id(entry[0]) for entry in nccl_work._DROPPED] == [ev_id] * len(nccl_work._DROPPED)
    assert _DestroyedEvent.destroyed == [], "the event of a dropped Work was destroyed while its operation may run"
    nccl_work._DROPPED.clear()
    gc.collect()
    assert _DestroyedEvent.destroyed == [ev_id]  # let go of, it is destroyed as usual


def _work_finishing_on(job, streams, ran):
    """A host Work whose finishing step synchronizes ``streams``, held as an engine holds them."""
    from hpcdist.work import Work, hold

    def finish():
        for s in streams:
            s.synchronize()
        ran.append("finish")

    work = Work([job], finish, None, 10.0, "all_reduce")
    hold(work, streams)
    return work


@pytest.mark.parametrize("engine_step", [False, True], ids=["work", "cuda-aware-wrap"])
def test_a_host_work_dropped_in_a_reference_cycle_finishes_on_a_live_stream(engine_step):
    """The same for a host Work whose finishing step uses a CUDA stream (the CUDA-aware engine synchronizes the
    array's stream after MPI): dropped with its Future, a user's CuPy stream that only the Work still reached was
    destroyed by the cycle collector before the orphaned step ran on it. The engine holds its streams
    (hpcdist.work.hold) until the Work is handed to the orphans."""
    import gc
    import types

    from hpcdist.backends.cuda_aware.engine import CudaAwareEngine
    from hpcdist.backends.hierarchical import StepJob
    from hpcdist.work import Work, reap_orphans

    _DestroyedEvent.destroyed.clear()
    _DestroyedEvent.used_after.clear()
    stream = _DestroyedEvent()
    sid = id(stream)
    ran: list[str] = []
    job = StepJob(lambda: None)  # a request that completes once run
    if engine_step:  # the engine's own wrapping of a host Work
        fake = types.SimpleNamespace(pg=None)
        inner = Work([job], None, None, 10.0, "all_reduce")
        work = CudaAwareEngine._wrap(fake, inner, [stream], "all_reduce")  # type: ignore[arg-type]
        del inner
    else:
        work = _work_finishing_on(job, [stream], ran)
    work.get_future()  # the Work and its Future now reference each other
    del stream, work
    gc.collect()
    assert _DestroyedEvent.destroyed == [], "the stream of a dropped Work was destroyed before its step ran"
    job.run()
    reap_orphans()
    assert _DestroyedEvent.used_after == []
    assert ran == ([] if engine_step else ["finish"])
    gc.collect()
    assert _DestroyedEvent.destroyed == [sid]  # once the step ran, it goes as usual


def test_event_work_seen_complete_keeps_nothing_once_dropped():
    from hpcdist.backends.nccl import work as nccl_work

    nccl_work._DROPPED.clear()
    work, _ = _event_work(_Event(done=True), np.zeros(2))
    assert work.is_completed()
    del work
    assert not nccl_work._DROPPED
    waited, _ = _event_work(_Event(done=False), np.zeros(2))
    waited.wait()  # ordered the current stream; the GPU may still run it
    del waited
    assert len(nccl_work._DROPPED) == 1
    nccl_work._DROPPED.clear()


def test_event_work_future_holds_the_list_of_outputs():
    out = np.zeros(3)
    work, stream = _event_work(_Event(), out)
    fut = work.get_future()
    assert work.wait() is True and stream.waited == [work._event]  # ordered the stream, did not block
    assert fut.done() and isinstance(fut.value(), list) and fut.value()[0] is out
    assert work.result()[0] is out


def test_event_work_completes_with_its_event_and_drops_buffers():
    ev = _Event()
    work, _ = _event_work(ev, None)
    assert not work.is_completed() and work._keep == ("kept",)
    ev.done = True
    assert work.is_completed() and work._keep is None and work.is_success()
    assert work.get_future().value() == []


@pytest.mark.parametrize(
    ("timeout", "error"),
    [(-1.0, ValueError), (float("nan"), ValueError), ("5", TypeError), (True, TypeError), ([], TypeError)],
    ids=["negative", "nan", "str", "bool", "list"],
)
def test_event_work_checks_its_timeout_as_work_wait_does(timeout, error):
    """It passed float(timeout) unchecked ('5' waited 5 s, -1 timed out at once) and wait() ignored it."""
    from hpcdist.work import Work

    reference = Work((), None, None, 5.0, "all_reduce")  # the host Work's wait: the independent reference
    with pytest.raises(error, match=r"Work\.wait: timeout must be"):
        reference.wait(timeout)
    ev = _Event()
    work, stream = _event_work(ev, None)
    with pytest.raises(error, match=r"Work\.wait: timeout must be"):
        work.wait(timeout)
    assert stream.waited == []  # refused before the stream was ordered to wait
    with pytest.raises(error, match=r"Work\.wait: timeout must be"):
        work.synchronize(timeout)
    assert work._exc is None and not work.is_completed()  # no timeout recorded: the operation is still pending


def test_event_work_synchronize_waits_its_timeout_then_raises():
    import time
    from datetime import timedelta

    from hpcdist.errors import DistTimeoutError

    work, _ = _event_work(_Event(), None)
    t0 = time.monotonic()
    with pytest.raises(DistTimeoutError, match=r"all_reduce \(NCCL\) did not complete on the GPU within 0.2s"):
        work.synchronize(timedelta(seconds=0.2))
    assert time.monotonic() - t0 >= 0.2  # it waited (a zero-second limit would be the group's 5 s)
    done, _ = _event_work(_Event(done=True), None)
    done.synchronize(0)  # zero: the group's timeout, and the event is done
    assert done.is_completed()


def test_event_works_on_one_stream_combine_into_the_last_event():
    from hpcdist.work import Work

    first, last = _Event(), _Event()
    (a, _), (b, _) = _event_work(first, "a"), _event_work(last, "b")
    both = Work.combine([a, b], "all_gather_coalesced", 5.0)
    assert both._event is last and both.result() == ["a", "b"]
    assert not both.is_completed()
    last.done = True
    assert both.is_completed()


def test_event_work_future_is_complete_at_enqueue_and_orders_the_stream_on_wait():
    """As torch's NCCL futures: done() and value() at once (the outputs), while the GPU may still run; wait() and
    then() order the current stream after the operation (it completed only through wait() before)."""
    out = np.zeros(3)
    ev = _Event()
    work, stream = _event_work(ev, out)
    fut = work.get_future()
    assert fut.done() and fut.value()[0] is out and stream.waited == []  # value() orders nothing
    seen = []
    child = fut.then(lambda f: seen.append(f.value()[0]) or "next")
    assert stream.waited == [ev] and seen == [out] and child.wait() == "next"
    assert fut.wait()[0] is out and stream.waited[-1] is ev
    assert not ev.done and not work.is_completed()  # the GPU's side is the event's, untouched by the future


def test_event_work_with_host_parts_combines_into_one_complete_only_with_its_events():
    """A host part beside an NCCL part (all_reduce_bucketed over NumPy and CuPy arrays), or NCCL parts of both
    libraries' streams: the combined Work was a plain Work, complete at once (its CUDA parts have no requests)
    and synchronize() did not block; now it is complete when the events are, and synchronize() waits for them."""
    import threading

    from hpcdist.work import Work

    host = Work((), None, "kept", 5.0, "all_reduce_bucketed", "h")
    ev = _Event()
    dev, stream = _event_work(ev, "d")
    both = Work.combine([host, dev], "all_reduce_bucketed", 5.0)  # the host part first: dispatch by any part
    assert not both.is_completed()
    threading.Timer(0.2, lambda: setattr(ev, "done", True)).start()
    both.synchronize()
    assert ev.done and both.is_completed() and both.result() == ["h", "d"]
    assert stream.waited and all(e is ev for e in stream.waited)  # the current stream ordered after the part
    other, _ = _event_work(_Event(done=True), "o")
    other._torch = True  # another library's stream: no common event either
    mixed = Work.combine([dev, other], "all_reduce_coalesced", 5.0)
    assert mixed.is_completed() and mixed.result() == ["d", "o"]


def test_combined_work_takes_the_result_its_caller_gives_on_every_kind_of_combination():
    """all_reduce_bucketed's Work is the arrays in the caller's order (its buckets group them by kind): the
    result given to Work.combine holds on the plain, NCCL-event and mixed combinations alike."""
    from hpcdist.work import Work

    (a, _), (b, _) = _event_work(_Event(done=True), "a"), _event_work(_Event(done=True), "b")
    assert Work.combine([a, b], "all_reduce_bucketed", 5.0, ["x", "y", "z"]).result() == ["x", "y", "z"]
    host = Work((), None, "kept", 5.0, "all_reduce_bucketed", "h")
    dev, _ = _event_work(_Event(done=True), "d")
    mixed = Work.combine([host, dev], "all_reduce_bucketed", 5.0, ["d", "h"])
    assert mixed.wait() and mixed.result() == ["d", "h"] and mixed.get_future().wait() == ["d", "h"]
    plain = Work.combine([Work((), None, None, 5.0, "op", "p")], "op", 5.0, ["q"])
    assert plain.wait() and plain.result() == ["q"]


# ---------------------------------------------------------------- the NCCL watchdog's bookkeeping


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


class _WEvent:
    """A CUDA event as the watchdog sees it: recorded on a stream, done once the stream got there."""

    made = 0

    def __init__(self) -> None:
        _WEvent.made += 1
        self.stream = None
        self.mark = -1

    def record(self, stream) -> None:
        self.stream, self.mark = stream, stream.enqueued

    @property
    def done(self) -> bool:
        return self.stream.finished >= self.mark


class _WStream:
    """A stream whose work the test finishes by hand: ``finished`` counts completed operations."""

    def __init__(self, ptr: int) -> None:
        self.ptr, self.enqueued, self.finished = ptr, 0, 0

    def enqueue(self) -> None:
        self.enqueued += 1


class _Group:
    def __init__(self, name: str) -> None:
        self.name = name

    def __repr__(self) -> str:
        return f"<group {self.name!r}>"


class _Engine:
    def __init__(self, error: str | None = None) -> None:
        self.error = error

    def async_error(self):
        return self.error


def _watchdog(clock):
    from hpcdist.backends.nccl.watchdog import NcclWatchdog

    wd = NcclWatchdog(_WEvent, clock=clock, bucket_s=0.001)
    wd._start = lambda: None  # the thread is not under test: check() is called by hand
    return wd


def test_nccl_watchdog_reports_the_oldest_stuck_operation_with_its_group():
    clock, s, eng, g1 = _Clock(), _WStream(7), _Engine(), _Group("g1")
    wd = _watchdog(clock)
    s.enqueue()
    wd.note(s, ("all_reduce", g1), 5.0, eng)
    clock.t += 0.5
    s.enqueue()
    wd.note(s, ("broadcast", g1), 5.0, eng)
    assert wd.pending() == 2 and wd.check() is None
    clock.t += 4.7  # the all_reduce is 5.2 s old, the broadcast 4.7 s
    report = wd.check()
    assert report is not None and "all_reduce on <group 'g1'> (NCCL) did not complete on the GPU within 5s" in report
    s.finished = 1  # the all_reduce completed; the broadcast is not yet 5 s old
    assert wd.check() is None and wd.pending() == 1
    clock.t += 0.4
    assert "broadcast on <group 'g1'>" in wd.check()


def test_nccl_watchdog_shares_one_event_within_a_bucket_and_recycles_completed_ones():
    clock, s, eng = _Clock(), _WStream(1), _Engine()
    wd = _watchdog(clock)
    _WEvent.made = 0
    for _ in range(50):  # 50 operations in 50 us: one event, re-recorded behind the newest
        s.enqueue()
        wd.note(s, "op", 60.0, eng)
        clock.t += 1e-6
    assert (_WEvent.made, wd.pending()) == (1, 1)
    s.finished = 49
    assert wd.check() is None and wd.pending() == 1  # the event covers the 50th operation too
    s.finished = 50
    assert wd.check() is None and wd.pending() == 0
    clock.t += 1.0
    s.enqueue()
    wd.note(s, "op", 60.0, eng)
    assert _WEvent.made == 1  # the completed event was reused
    other = _WStream(2)  # another stream gets its own queue
    other.enqueue()
    wd.note(other, "op2", 60.0, eng)
    assert wd.pending() == 2 and _WEvent.made == 2


def test_nccl_watchdog_reports_async_errors_until_the_engine_closes():
    clock, s = _Clock(), _WStream(3)
    bad = _Engine("NCCL communicator of group 'g2' failed asynchronously: remote process exited")
    wd = _watchdog(clock)
    s.enqueue()
    wd.note(s, "op", 60.0, bad)
    assert "DistBackendError: NCCL communicator of group 'g2' failed asynchronously" in wd.check()
    wd.forget(bad)
    assert wd.check() is None


def test_nccl_watchdog_tracks_the_oldest_pending_deadline_for_its_guard():
    clock, a, b, eng = _Clock(), _WStream(1), _WStream(2), _Engine()
    wd = _watchdog(clock)
    a.enqueue()
    wd.note(a, "first", 10.0, eng)
    clock.t += 1.0
    b.enqueue()
    wd.note(b, "second", 5.0, eng)  # enqueued later but due earlier: 106 < 110
    assert wd.check() is None and wd.oldest == (106.0, "second", 5.0)
    b.finished = 1
    assert wd.check() is None and wd.oldest == (110.0, "first", 10.0)
    a.finished = 1
    assert wd.check() is None and wd.oldest is None


def test_nccl_watchdog_thread_stops_with_a_warning_and_disarms_its_guard_when_a_look_fails(capsys):
    """An event that cannot be asked (a CUDA error) stops the thread with one line on stderr; its guard is
    disarmed and closed, so no stale deadline ends the process later; on_start runs on the thread first."""
    import threading

    from hpcdist.backends.nccl.watchdog import NcclWatchdog

    class Broken:
        def record(self, stream):
            pass

        @property
        def done(self):
            raise RuntimeError("cudaErrorStreamCaptureImplicit")

    class FakeGuard:
        def __init__(self):
            self.armed, self.closed = ["start"], False

        def arm(self, deadline, report=""):
            self.armed.append(deadline)

        def close(self):
            self.closed = True

    started = []
    guard = FakeGuard()
    wd = NcclWatchdog(Broken, poll_s=0.01, on_start=lambda: started.append(threading.current_thread().name))
    wd._new_guard = lambda: guard
    wd.note(_WStream(5), "all_reduce", 60.0, _Engine())
    wd._thread.join(timeout=30)
    assert not wd._thread.is_alive()
    assert started == ["hpcdist-nccl-watchdog"]
    assert isinstance(wd.stopped, RuntimeError) and guard.armed[-1] is None and guard.closed
    err = capsys.readouterr().err
    assert "the NCCL watchdog stopped" in err and "cudaErrorStreamCaptureImplicit" in err


def test_guard_process_ends_its_target_with_the_report_once_the_deadline_passes(tmp_path):
    import subprocess
    import sys
    import time

    from hpcdist.backends.nccl.watchdog import Guard

    target = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])
    log = open(tmp_path / "guard.err", "w")  # noqa: SIM115
    try:
        guard = Guard(pid=target.pid, stderr=log)
        guard.arm(time.monotonic() + 3600, "not this one\n")
        guard.arm(None)  # disarmed: nothing happens at the old deadline
        guard.arm(time.monotonic() + 0.5, "hpcdist.DistTimeoutError: all_reduce on <g> (NCCL) stuck\n")
        assert target.wait(timeout=60) == -15  # SIGTERM
        guard.close()
    finally:
        if target.poll() is None:
            target.kill()
        log.close()
    text = (tmp_path / "guard.err").read_text()
    assert text == "hpcdist.DistTimeoutError: all_reduce on <g> (NCCL) stuck\n"


def test_guard_process_exits_when_its_watcher_closes_the_pipe():
    from hpcdist.backends.nccl.watchdog import Guard

    guard = Guard(pid=2**22 + 12345)  # no such process: the guard must not need one until it fires
    guard.arm(None)
    guard.close()  # EOF: the guard exits, close() returns
    assert guard._proc.returncode == 0
