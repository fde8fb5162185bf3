"""Unit tests of the core's MPI-free logic: ops, dtypes, adapters, Work/Future, backends, knobs."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import numpy as np
import pytest

import hpcdist as dist
from hpcdist import ReduceOp
from hpcdist.backends import Backend, parse_backend
from hpcdist.buffers import adapt
from hpcdist.buffers.reduction import bf16_bits_to_f32, f32_to_bf16_bits
from hpcdist.ops import resolve_op, supports_complex
from hpcdist.work import Future, completed_work

try:
    import torch
except ImportError:
    torch = None


# ------------------------------------------------------------------ import and init state


def test_import_does_no_mpi_work():
    code = "import sys, hpcdist; assert 'mpi4py.MPI' not in sys.modules, 'MPI imported at import time'; print('ok')"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.parametrize(
    "call",
    [
        lambda: dist.all_reduce(np.ones(2)),
        lambda: dist.get_rank(),
        lambda: dist.get_world_size(),
        lambda: dist.broadcast_object_list([1], src=0),
        lambda: dist.new_group([0]),
        lambda: dist.send(np.ones(1), dst=1),
    ],
)
def test_calls_before_init_raise(call):
    assert not dist.is_initialized()
    with pytest.raises(ValueError, match="init_process_group"):
        call()


def test_all_names_exported():
    for name in dist.__all__:
        assert hasattr(dist, name), name
    from pathlib import Path

    ref_file = Path(__file__).resolve().parents[3] / "shared" / "reference" / "torch_distributed_2.13_api.txt"
    ref = ref_file.read_text() if ref_file.exists() else ""
    needed = [
        "init_process_group",
        "all_reduce",
        "all_to_all_single",
        "batch_isend_irecv",
        "monitored_barrier",
        "new_subgroups_by_enumeration",
        "split_group",
        "reduce_scatter_tensor",
        "scatter_object_list",
    ]
    for name in needed:
        assert name in dist.__all__ and (not ref or name in ref)


# ------------------------------------------------------------------ ops


def test_reduce_op_names_and_premul():
    assert int(ReduceOp.SUM) == 0 and ReduceOp.MAX.name == "MAX"
    p = ReduceOp.PREMUL_SUM(0.5)
    assert p.factor == 0.5 and resolve_op(p, "float32").premul == 0.5
    assert dist._make_nccl_premul_sum(2).factor == 2
    assert dist.reduce_op.SUM is ReduceOp.SUM
    with pytest.raises(TypeError, match="PREMUL_SUM"):
        ReduceOp.SUM(2.0)
    with pytest.raises(TypeError, match="one-element"):
        ReduceOp.PREMUL_SUM("x")


@pytest.mark.parametrize(
    ("op", "dtype", "err"),
    [
        (ReduceOp.BAND, "float32", "bitwise"),
        (ReduceOp.BXOR, "bfloat16", "bitwise"),
        (ReduceOp.MIN, "complex64", "complex"),
        (ReduceOp.PRODUCT, "complex128", "complex"),
        (ReduceOp.AVG, "bool", "bool"),
    ],
)
def test_op_dtype_errors(op, dtype, err):
    with pytest.raises(ValueError, match=err):
        resolve_op(op, dtype)


def test_supports_complex_matches_torch():
    assert supports_complex(ReduceOp.SUM) and supports_complex(ReduceOp.AVG)
    assert not supports_complex(ReduceOp.MAX) and not supports_complex(ReduceOp.BAND)
    if torch is not None:
        import torch.distributed as tdist

        for op in ("SUM", "AVG", "PRODUCT", "MIN", "MAX", "BAND", "BOR", "BXOR"):
            assert supports_complex(getattr(ReduceOp, op)) == tdist.supports_complex(getattr(tdist.ReduceOp, op)), op


# ------------------------------------------------------------------ half precision


def test_bfloat16_rounding_matches_torch():
    if torch is None:
        pytest.skip("torch is not installed: it is the independent reference for bfloat16 rounding")
    rng = np.random.default_rng(0)
    x = np.concatenate(
        [
            rng.standard_normal(10000).astype(np.float32) * 1e3,
            np.array([0.0, -0.0, np.inf, -np.inf, 1.0 + 2**-8, 1.0 + 3 * 2**-8, 3.4e38, 1e-40], dtype=np.float32),
        ]
    )
    want = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    assert np.array_equal(f32_to_bf16_bits(x), want)
    assert np.array_equal(
        bf16_bits_to_f32(want), torch.from_numpy(want.view(np.int16)).view(torch.bfloat16).float().numpy()
    )
    # NaNs stay NaNs, those whose payload lies only in the 16 bits that rounding drops too (it made them infinities
    # unless quieted): signalling, negative, and the canonical quiet one
    bits = np.array([0x7FC00000, 0x7F800001, 0xFF800001, 0x7F80FFFF, 0x7FFFFFFF], dtype=np.uint32)
    nan = f32_to_bf16_bits(bits.view(np.float32))
    assert np.isnan(bf16_bits_to_f32(nan)).all(), [hex(b) for b in nan]
    assert torch.isnan(torch.from_numpy(bits.view(np.float32)).to(torch.bfloat16)).all()  # as torch's conversion
    wide = bf16_bits_to_f32(want[3:4].reshape(()))  # 0-d: an array to reduce into (it was a read-only scalar)
    assert isinstance(wide, np.ndarray) and wide.shape == () and wide.flags.writeable
    assert wide == torch.from_numpy(want[3:4].view(np.int16)).view(torch.bfloat16).float().numpy()[0]


# ------------------------------------------------------------------ adapters


def test_numpy_adapter_zero_copy_and_errors():
    a = np.arange(6.0)
    b = adapt(a, "tensor", True)
    assert b.arr is a and b.dtype == "float64" and b.device == "cpu" and b.writeback is None
    ro = np.ones(3)
    ro.flags.writeable = False
    assert adapt(ro, "tensor", False).arr is ro
    with pytest.raises(ValueError, match="tensor is read-only"):
        adapt(ro, "tensor", True)
    with pytest.raises(TypeError, match="output must be an array"):
        adapt({"a": 1}, "output", True)


def test_non_contiguous_output_is_written_back():
    base = np.zeros((4, 3))
    view = base[:, 1]
    b = adapt(view, "tensor", True)
    assert b.arr.flags.c_contiguous and b.writeback is not None
    b.arr[:] = 7
    b.writeback()
    assert base[:, 1].tolist() == [7.0] * 4 and base[:, 0].tolist() == [0.0] * 4


def test_torch_adapter_shares_memory_and_bf16_bits():
    if torch is None:
        pytest.skip("torch is not installed")
    t = torch.arange(4, dtype=torch.float32)
    b = adapt(t, "tensor", True)
    b.arr[0] = 42
    assert t[0].item() == 42  # zero-copy
    h = torch.tensor([1.5, -2.0], dtype=torch.bfloat16)
    hb = adapt(h, "tensor", True)
    assert hb.dtype == "bfloat16" and hb.arr.dtype == np.uint16
    assert np.array_equal(bf16_bits_to_f32(hb.arr), np.array([1.5, -2.0], dtype=np.float32))
    g = torch.ones(2, requires_grad=True)
    assert adapt(g, "tensor", False).arr.tolist() == [1.0, 1.0]


def test_generic_protocols():
    assert adapt(bytearray(b"ab"), "t", True).arr.tolist() == [97, 98]
    with pytest.raises(ValueError, match="read-only"):
        adapt(b"ab", "t", True)

    class OnlyDLPack:
        def __init__(self):
            self._a = np.arange(3, dtype=np.int32)

        def __dlpack__(self, **kw):
            return self._a.__dlpack__(**kw)

        def __dlpack_device__(self):
            return self._a.__dlpack_device__()

    d = OnlyDLPack()
    assert adapt(d, "t", False).arr.tolist() == [0, 1, 2]

    class Iface:
        def __init__(self):
            self._a = np.arange(3, dtype=np.int16)
            self.__array_interface__ = self._a.__array_interface__

    assert adapt(Iface(), "t", False).arr.tolist() == [0, 1, 2]


def test_cuda_tensor_without_gpu_support_is_a_clear_error():
    class FakeCuda:
        __cuda_array_interface__ = {"shape": (2,), "typestr": "<f4", "data": (0, False), "version": 3}

    with pytest.raises((TypeError, ValueError), match=r"(?i)cuda|cupy|gpu"):
        adapt(FakeCuda(), "tensor", True)


# ------------------------------------------------------------------ Work / Future


class _Req:
    """A request that completes after ``polls`` tests (MPI's Test as Work polls it)."""

    def __init__(self, polls=1):
        self.polls = polls

    def Test(self, status=None):
        self.polls -= 1
        return self.polls <= 0


def test_work_chain_runs_the_step_after_the_inner_finish_and_keeps_the_result():
    from hpcdist.work import Work

    seen = []
    inner = Work([_Req(3)], lambda: seen.append("inner"), None, 5.0, "recv", result=["out"])
    outer = inner.chain(lambda: seen.append("step"), name="wrapped")
    assert outer.wait() is True and seen == ["inner", "step"]
    assert outer.result() == ["out"] and outer.is_success()


def test_work_chain_step_result_replaces_the_inner_result_and_errors_propagate():
    from hpcdist.work import Work

    outer = Work([], None, None, 5.0, "x", result=1).chain(lambda: 2)
    assert outer.result() == [2]
    failing = Work([], lambda: 1 / 0, None, 5.0, "x").chain(lambda: pytest.fail("the step must not run"))
    with pytest.raises(ZeroDivisionError):
        failing.wait()
    assert failing.is_completed() and not failing.is_success()


def test_work_combine_finishes_every_part_in_order_and_lists_their_results():
    from hpcdist.work import Work

    seen = []
    parts = [Work([_Req(k + 1)], lambda k=k: seen.append(k), None, 5.0, "p", result=f"r{k}") for k in range(3)]
    both = Work.combine(parts, "all", 5.0)
    assert both.result() == ["r0", "r1", "r2"] and seen == [0, 1, 2]
    assert Work.combine([], "none", 5.0).result() == []


def test_future_then_and_errors():
    w = completed_work("noop", result=[1, 2])
    assert w.wait() and w.is_completed() and w.is_success() and w.result() == [1, 2]
    f = w.get_future()
    assert f.done() and f.value() == [1, 2]
    g = f.then(lambda fut: sum(fut.value()))
    assert g.wait() == 3
    boom = f.then(lambda fut: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        boom.wait()
    fresh = Future()
    seen = []
    fresh.add_done_callback(lambda fu: seen.append(fu.value()))
    fresh.set_result(5)
    assert seen == [5]
    with pytest.raises(dist.DistError):
        fresh.set_result(6)


# ------------------------------------------------------------------ backends and knobs


def test_backend_names_and_device_maps():
    assert Backend("MPI") == "mpi" and Backend("gloo") == "gloo"
    with pytest.raises(ValueError, match="unknown backend 'ucx'"):
        Backend("ucx")
    assert parse_backend("mpi") == {"cpu": "mpi", "cuda": "mpi"}
    assert parse_backend("nccl") == {"cuda": "nccl"}
    assert parse_backend("cpu:mpi,cuda:nccl") == {"cpu": "mpi", "cuda": "nccl"}
    assert parse_backend(None) == {"cpu": "mpi", "cuda": "mpi"}
    with pytest.raises(ValueError, match="device:backend"):
        parse_backend("cpu=mpi,cuda:nccl")
    with pytest.raises(TypeError):
        parse_backend(3)
    assert dist.get_default_backend_for_device("cuda:0") == "mpi"


def test_register_backend():
    def factory(pg, device_type):
        return object()

    Backend.register_backend("mybk", factory, devices=["cpu"])
    assert Backend("mybk") == "mybk" and dist.is_backend_available("mybk")
    assert parse_backend("mybk") == {"cpu": "mybk"}
    with pytest.raises(ValueError, match="already registered"):
        Backend.register_backend("mybk", factory)
    with pytest.raises(ValueError, match="already registered"):
        Backend.register_backend("mpi", factory)
    with pytest.raises(TypeError, match="callable"):
        Backend.register_backend("other", 3)


@pytest.mark.parametrize(
    ("name", "value", "fn"),
    [
        ("HPCDIST_TIMEOUT", "soon", "default_timeout"),
        ("HPCDIST_TIMEOUT", "-1", "default_timeout"),
        ("HPCDIST_ABORT_ON_EXCEPTION", "maybe", "abort_on_exception"),
        ("HPCDIST_WAIT", "spin", "wait_mode"),
        ("HPCDIST_OBJECT_UNPICKLER", "some", "object_unpickler"),
        ("HPCDIST_NCCL_WATCHDOG", "sometimes", "nccl_watchdog_enabled"),
        ("HPCDIST_HIER", "yes please", "hierarchical_min_bytes"),
        ("HPCDIST_HIER_ALGO", "ring", "hierarchical_algorithm"),
        ("HPCDIST_HIER_ASYNC", "later", "hierarchical_async"),
        ("HPCDIST_SHM", "sometimes", "shm_mode"),
        ("HPCDIST_DEBUG", "Verbose", "debug_level"),
    ],
)
def test_bad_knobs_name_themselves(monkeypatch, name, value, fn):
    """The message names the variable and quotes the value as given (not lower-cased), and ``hpcdist info``'s
    settings check reports the same message before any program runs."""
    from hpcdist import config
    from hpcdist.info import collect

    monkeypatch.setenv(name, value)
    with pytest.raises(ValueError, match=name) as info:
        getattr(config, fn)()
    assert repr(value) in str(info.value)
    assert str(info.value) in collect()["settings"]["errors"].values()


@pytest.mark.parametrize(
    ("name", "fn", "default"),
    [
        ("HPCDIST_WAIT", "wait_mode", "block"),
        ("HPCDIST_OBJECT_UNPICKLER", "object_unpickler", "full"),
        ("HPCDIST_HIER", "hierarchical_min_bytes", 512 * 1024),
        ("HPCDIST_HIER_ALGO", "hierarchical_algorithm", "auto"),
        ("HPCDIST_HIER_ASYNC", "hierarchical_async", True),
        ("HPCDIST_SHM", "shm_mode", "auto"),
        ("HPCDIST_DEBUG", "debug_level", "OFF"),
        ("HPCDIST_TIMEOUT", "default_timeout", timedelta(minutes=30)),
    ],
)
def test_empty_knobs_are_unset(monkeypatch, name, fn, default):
    """``NAME=`` (as a job script's ``export NAME=$UNSET_THING`` leaves it) means unset for every knob."""
    from hpcdist import config

    for var in ("HPCDIST_HIER_MIN_BYTES", "TORCH_DISTRIBUTED_DEBUG"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv(name, "  ")
    assert getattr(config, fn)() == default


@pytest.mark.parametrize(("value", "want"), [("true", 0), ("ON", 0), ("no", None), ("Auto", 512 * 1024)])
def test_hier_knob_takes_the_boolean_words_shm_takes(monkeypatch, value, want):
    from hpcdist import config

    monkeypatch.delenv("HPCDIST_HIER_MIN_BYTES", raising=False)
    monkeypatch.setenv("HPCDIST_HIER", value)
    assert config.hierarchical_min_bytes() == want


def test_info_reports_every_refused_knob_and_survives_a_bad_mpi_tune(monkeypatch):
    """A bad HPCDIST_MPI_TUNE made ``hpcdist info`` crash where no launcher was detected; now it, and every
    other refused value, is listed under ``settings`` with the message the runtime would raise."""
    from hpcdist import config
    from hpcdist.info import collect

    for var in list(os.environ):
        if var.startswith(("HPCDIST_", "PMI_", "OMPI_", "SLURM_", "PMIX_", "MPI_LOCALNRANKS")):
            monkeypatch.delenv(var)
    assert collect()["settings"]["errors"].startswith("none")
    bad = {"HPCDIST_MPI_TUNE": "maybe", "HPCDIST_WAIT": "spin", "HPCDIST_FLIGHT_RECORDER": "-3"}
    for name, value in bad.items():
        monkeypatch.setenv(name, value)
    report = collect()
    assert set(report["settings"]["errors"]) == set(bad)
    assert report["launcher"]["launcher_free_mpi"].startswith("error: environment variable HPCDIST_MPI_TUNE")
    assert report["settings"]["errors"]["HPCDIST_WAIT"] == "environment variable HPCDIST_WAIT must be one of " \
        "'block', 'poll', got 'spin'"  # fmt: skip
    assert config.problems() == report["settings"]["errors"]


def test_hierarchical_algorithm_knob(monkeypatch):
    from hpcdist import config

    monkeypatch.delenv("HPCDIST_HIER_ALGO", raising=False)
    assert config.hierarchical_algorithm() == "auto"
    for value, want in ((" Leaders ", "leaders"), ("rails", "rails"), ("", "auto")):
        monkeypatch.setenv("HPCDIST_HIER_ALGO", value)
        assert config.hierarchical_algorithm() == want
    monkeypatch.setenv("HPCDIST_HIER_ALGO", "ring")
    with pytest.raises(ValueError, match="'auto', 'rails', 'leaders', got 'ring'"):
        config.hierarchical_algorithm()


@pytest.mark.parametrize(
    ("name", "fn", "good", "want", "bad", "message"),
    [
        ("HPCDIST_TIMEOUT", "default_timeout", "2.5", timedelta(seconds=2.5), "0", "a number of seconds > 0, got '0'"),
        (
            "HPCDIST_TIMEOUT",
            "default_timeout",
            "1e3",
            timedelta(seconds=1000),
            "nan",
            "a number of seconds > 0, got 'nan'",
        ),
        (
            "HPCDIST_TIMEOUT",
            "default_timeout",
            "60",
            timedelta(seconds=60),
            "inf",
            "a number of seconds > 0, got 'inf'",
        ),
        (
            "HPCDIST_TIMEOUT",
            "default_timeout",
            "8.6e13",
            timedelta(seconds=8.6e13),
            "1e15",  # beyond datetime.timedelta.max: it raised a bare OverflowError
            "a number of seconds > 0 and <= 8.64e+13, got '1e15'",
        ),
        (
            "HPCDIST_FLIGHT_RECORDER",
            "flight_recorder_size",
            " 16 ",
            16,
            "-1",
            "a number of entries (0: off) >= 0, got '-1'",
        ),
        ("HPCDIST_HIER_MIN_BYTES", "hierarchical_min_bytes", "0", 0, "1k", "a number of bytes >= 0, got '1k'"),
        ("HPCDIST_SHM_SLOT", "shm_slot_bytes", "128", 128, "32", "a number of bytes >= 64, got '32'"),
        ("HPCDIST_KEEPALIVE", "keepalive_seconds", "0", 0, "-5", "a number of seconds >= 0, got '-5'"),
    ],
)
def test_numeric_knobs_share_one_parser(monkeypatch, name, fn, good, want, bad, message):
    """Every numeric knob: its value when good; else ValueError naming the variable, the bound and the value."""
    from hpcdist import config

    monkeypatch.delenv("HPCDIST_HIER", raising=False)
    monkeypatch.setenv(name, good)
    assert getattr(config, fn)() == want
    monkeypatch.setenv(name, bad)
    with pytest.raises(ValueError) as info:
        getattr(config, fn)()
    assert str(info.value) == f"environment variable {name}: expected {message}"


@pytest.mark.parametrize(
    ("value", "seconds", "error", "message"),
    [
        (30, False, TypeError, "t must be a datetime.timedelta, got int (30)"),
        ("30", True, TypeError, "t must be a datetime.timedelta or a number of seconds, got str ('30')"),
        (True, True, TypeError, "t must be a datetime.timedelta or a number of seconds, got bool (True)"),
        (timedelta(0), False, ValueError, "t must be a positive timedelta, got datetime.timedelta(0)"),
        (-1.0, True, ValueError, "t must be a positive number of seconds (at most 8.64e+13) or timedelta, got -1.0"),
        (
            float("nan"),
            True,
            ValueError,
            "t must be a positive number of seconds (at most 8.64e+13) or timedelta, got nan",
        ),
        (
            1e15,
            True,
            ValueError,
            "t must be a positive number of seconds (at most 8.64e+13) or timedelta, got 1000000000000000.0",
        ),
        (
            timedelta(seconds=-1),
            True,
            ValueError,
            "t must be a positive timedelta, got datetime.timedelta(days=-1, seconds=86399)",
        ),
    ],
)
def test_check_timeout_names_argument_expectation_and_value(value, seconds, error, message):
    from hpcdist.config import check_timeout

    with pytest.raises(error) as info:
        check_timeout(value, "t", seconds=seconds)
    assert str(info.value) == message


def test_check_timeout_accepts_timedelta_and_seconds():
    from hpcdist.config import check_timeout

    assert check_timeout(timedelta(seconds=3)) == timedelta(seconds=3)
    assert check_timeout(1.5, seconds=True) == timedelta(seconds=1.5)


def test_object_roundtrip_and_restricted_unpickler(monkeypatch):
    from hpcdist.objects import dumps, loads

    obj = {"a": np.arange(5.0), "b": [1, "x", (2, 3)], "c": None}
    back = loads(dumps(obj))
    assert np.array_equal(back["a"], obj["a"]) and back["b"] == obj["b"]
    monkeypatch.setenv("HPCDIST_OBJECT_UNPICKLER", "restricted")
    assert loads(dumps([1, 2.0, "s", {"k": (1,)}])) == [1, 2.0, "s", {"k": (1,)}]
    assert np.array_equal(loads(dumps(np.arange(3))), np.arange(3))

    class Evil:
        def __reduce__(self):
            return (print, ("pwned",))

    import pickle

    with pytest.raises(pickle.UnpicklingError, match="restricted"):
        loads(dumps(Evil()))


def test_group_module_is_torchs_group_namespace():
    """``hpcdist.group`` is one object: the module of the group functions, with torch's ``group.WORLD``."""
    import importlib

    import hpcdist.group as imported

    assert imported is importlib.import_module("hpcdist.group") is dist.group
    assert dist.group.new_group is dist.new_group and dist.group.ProcessGroup is dist.ProcessGroup
    assert dist.group.WORLD is None and dist.GroupMember.WORLD is None  # before init_process_group
    with pytest.raises(AttributeError, match=r"'hpcdist\.group' has no attribute 'WROLD'"):
        dist.group.WROLD  # noqa: B018


def test_timeout_message_is_one_sentence_for_every_report():
    """The host Work, the watchdogs and the NCCL Work describe a timeout with the same words."""
    from hpcdist.errors import TIMEOUT_FIX, describe_op, timeout_message

    assert describe_op("store wait") == "store wait" and describe_op(("recv", "<pg>")) == "recv on '<pg>'"
    host = timeout_message(("all_reduce", "<pg>"), 2.5, then="; " + TIMEOUT_FIX)
    assert host == (
        "all_reduce on '<pg>' did not complete within 2.5s: a peer may have died, be stuck, or have called a "
        "different operation; raise the timeout with init_process_group(timeout=...) or HPCDIST_TIMEOUT if it is "
        "just slow"
    )
    gpu = timeout_message("broadcast", 5, where=" (NCCL)", on=" on the GPU", then=".")
    assert gpu == (
        "broadcast (NCCL) did not complete on the GPU within 5s: a peer may have died, be stuck, or have called a "
        "different operation."
    )


@pytest.mark.parametrize("raw", ["one", "-1", "1.5"])
def test_node_local_rank_rejects_a_garbled_local_rank(monkeypatch, raw):
    monkeypatch.setenv("LOCAL_RANK", raw)
    with pytest.raises(ValueError) as info:
        dist.get_node_local_rank()
    assert str(info.value) == f"environment variable LOCAL_RANK: expected a rank >= 0, got {raw!r}"


def test_node_local_rank_reads_local_rank(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", " 3 ")
    assert dist.get_node_local_rank() == 3


def test_a_registered_engine_factory_must_build_an_engine():
    """docs/architecture.md, "Write an engine": select_engine builds it and refuses anything else."""
    from hpcdist.backends import Engine
    from hpcdist.backends.selection import select_engine

    class Partial(Engine):  # an engine lacking operations cannot be made (the ABC says which)
        def barrier(self, sync=False):
            return None

    with pytest.raises(TypeError, match="abstract"):
        Partial()
    Backend.register_backend("notanengine", lambda pg, device_type: object(), devices="cpu")
    with pytest.raises(TypeError, match=r"returned object, not an engine; subclass hpcdist.backends.Engine"):
        select_engine(None, "notanengine", "cpu")
    assert Backend.backend_capability["notanengine"] == ["cpu"] and parse_backend("notanengine") == {
        "cpu": "notanengine"
    }


def test_every_engine_names_its_path():
    """``Engine.kind``/``Engine.path`` (what ``hpcdist bench`` prints): one distinct name per engine class."""
    from hpcdist.backends import Engine
    from hpcdist.backends.cuda_aware.engine import CudaAwareEngine
    from hpcdist.backends.hierarchical import HierarchicalEngine
    from hpcdist.backends.mpi.engine import MPIEngine
    from hpcdist.backends.nccl.engine import NCCLEngine
    from hpcdist.backends.staged.engine import StagedEngine

    classes = [MPIEngine, CudaAwareEngine, StagedEngine, NCCLEngine, HierarchicalEngine]
    kinds = [c.kind for c in classes]
    assert kinds == ["mpi", "cuda-aware", "staged", "nccl", "hierarchical"]
    assert all(issubclass(c, Engine) for c in classes) and Engine.kind not in kinds
    # the default path() is the kind, for any op and size (an instance is not needed to read it)
    assert MPIEngine.path(object.__new__(MPIEngine), "all_reduce", 1 << 20) == "mpi"


def test_free_port_is_below_the_ephemeral_range_and_free(tmp_path):
    """MPI starts open ephemeral ports by the dozen: a MASTER_PORT from that range could be taken before the store binds."""
    import socket

    from hpcdist import _launchenv

    low, _ = _launchenv._ephemeral_range()
    for _ in range(20):
        port = _launchenv.free_port("127.0.0.1")
        assert _launchenv._LOWEST_PORT <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free
    fake = tmp_path / "range"
    fake.write_text("40000\t50000\n")
    assert _launchenv._ephemeral_range(str(fake)) == (40000, 50000)
    assert _launchenv._ephemeral_range(str(tmp_path / "missing")) == (32768, 60999)


def test_every_knob_is_in_the_readme_table():
    """README's "Environment knobs" table promises every variable config.py reads: each KNOBS entry has a row."""
    from pathlib import Path

    from hpcdist.config import KNOBS

    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text()
    table = readme.split("## Environment knobs", 1)[1].split("\n## ", 1)[0]
    assert [k for k in KNOBS if f"| `{k}` |" not in table] == []


def test_info_names_the_knob_whose_value_is_refused(monkeypatch):
    """A bad HPCDIST_HIER_MIN_BYTES is listed under its own name (HPCDIST_HIER shared its reader and took it)."""
    from hpcdist import config

    monkeypatch.delenv("HPCDIST_HIER", raising=False)
    monkeypatch.setenv("HPCDIST_HIER_MIN_BYTES", "x")
    assert list(config.problems()) == ["HPCDIST_HIER_MIN_BYTES"]
