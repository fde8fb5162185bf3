"""torch tensors and unusual NumPy arrays at hpcdist's own API (found in the adversarial tensor round).

* ``ReduceOp.PREMUL_SUM(torch.tensor([3.0]))`` (and ``_make_nccl_premul_sum``
  of a tensor, as torch's NCCL path takes) raised "must be a number or a
  one-element array": a tensor's ``size`` is a method, never 1.
* A PREMUL_SUM factor the array cannot take went through NumPy: a complex
  factor on a real array lost its imaginary part (a warning only), a
  fraction on an integer array truncated each product, a negative factor on
  an unsigned array raised OverflowError from inside the engine. Now a
  ValueError from the op check, before any message moves.
* np.matrix (and other ndarray subclasses) reached the engines as they are:
  ``reshape(-1)`` stays 2-D, so coalesced/bucketed calls raised mid-call and
  the shared-memory float16 reduction gave wrong sums. Now a plain view.
* A strided output tensor was written back with torch's ``copy_`` after the
  data moved: an inference tensor (made under ``torch.inference_mode()``)
  raised RuntimeError on every rank after the collective completed. Now the
  copy-back goes through NumPy, as for contiguous tensors.
* An output whose elements share memory (``expand``, ``broadcast_to`` made
  writable, an overlapping ``as_strided`` or ``unfold`` view) raised torch's
  RuntimeError after the data moved (tensors) or was written over silently
  (NumPy: a broadcast into an overlapping view held values no rank sent).
  Now a ValueError naming the argument, before any message moves.
* A NumPy scalar as an output (``all_reduce(np.float64(1))``) "succeeded"
  and the result was lost (``np.asarray`` copies it); a NumPy masked array
  was reduced with its masked values and its mask ignored. Both raise now.
* Nested tensors and tensor subclasses whose memory torch hides (DTensor)
  raised torch's internal RuntimeError naming no argument; a meta tensor was
  told to install CuPy; quantized tensors and byte-swapped NumPy dtypes were
  refused without saying what is accepted or how to convert. (complex32 and
  float8 tensors, refused here before, are moved as bits now: test_bits_dtypes.)

Every case runs on every rank alike (no rank is left waiting); after a
refusal an all_reduce proves that no message moved and the group is usable.
"""

from __future__ import annotations

import numpy as np
import pytest
from checks import raises_naming

import hpcdist as dist
from hpcdist import ReduceOp

torch = pytest.importorskip("torch")


def me() -> int:
    return dist.get_rank()


def n() -> int:
    return dist.get_world_size()


def usable() -> None:
    x = np.full(3, float(me()))
    dist.all_reduce(x)
    assert x.tolist() == [float(sum(range(n())))] * 3


def values(r: int, size: int) -> np.ndarray:
    return np.arange(size, dtype=np.float64) * (r + 1) + 10 * r


# ------------------------------------------------------------------ PREMUL_SUM with a tensor factor


@pytest.mark.parametrize(
    "make_op",
    [
        lambda: ReduceOp.PREMUL_SUM(torch.tensor([3.0])),
        lambda: ReduceOp.PREMUL_SUM(torch.tensor(3.0)),
        lambda: dist._make_nccl_premul_sum(torch.tensor([3.0])),
        lambda: ReduceOp.PREMUL_SUM(np.array([3.0])),
    ],
    ids=["tensor1", "tensor0d", "make_nccl", "ndarray1"],
)
def test_premul_sum_takes_a_one_element_tensor_factor(make_op):
    x = torch.from_numpy(values(me(), 5))
    dist.all_reduce(x, op=make_op())
    want = 3.0 * sum(values(r, 5) for r in range(n()))
    np.testing.assert_allclose(x.numpy(), want)


@pytest.mark.parametrize(
    "factor", [torch.ones(2), torch.tensor([True]), "x", [2.0]], ids=["two", "bool", "str", "list"]
)
def test_premul_sum_refuses_other_factors(factor):
    with pytest.raises(TypeError, match="PREMUL_SUM factor must be a number or a one-element array"):
        ReduceOp.PREMUL_SUM(factor)


PREMUL_REFUSED = [
    ("complex factor, real array", np.float64, 2 + 1j, "imaginary part"),
    ("complex factor, half array", np.float16, 1j, "imaginary part"),
    ("fraction, integer array", np.int64, 2.5, "whole factor"),
    ("nan, integer array", np.int32, float("nan"), "whole factor"),
    ("negative, unsigned array", np.uint8, -1, "between 0 and 255"),
    ("too large, integer array", np.int32, 1e30, "whole factor"),
]


@pytest.mark.parametrize(("name", "dtype", "factor", "words"), PREMUL_REFUSED, ids=[c[0] for c in PREMUL_REFUSED])
def test_premul_sum_factor_the_array_cannot_take_is_refused_before_any_message(name, dtype, factor, words):
    """NumPy dropped the imaginary part (a warning only), truncated each product, or raised OverflowError from
    inside the engine; torch's NCCL path refuses integer PREMUL_SUM and gloo every PREMUL_SUM."""
    x = np.ones(3, dtype=dtype)
    with pytest.raises(ValueError, match=words) as info:
        dist.all_reduce(x, op=ReduceOp.PREMUL_SUM(factor))
    assert "op=ReduceOp.PREMUL_SUM" in str(info.value) and np.dtype(dtype).name in str(info.value)
    assert x.tolist() == [1, 1, 1]
    usable()


@pytest.mark.parametrize(
    ("dtype", "factor"), [(np.int64, 3.0), (np.uint8, np.uint8(3)), (np.float32, 2 + 0j), (np.complex128, 1j)]
)
def test_premul_sum_factors_the_array_takes(dtype, factor):
    x = (np.arange(3) + me()).astype(dtype)
    dist.all_reduce(x, op=ReduceOp.PREMUL_SUM(factor))
    real = factor.real if isinstance(factor, complex) and x.dtype.kind != "c" else factor
    want = sum((np.arange(3) + r).astype(dtype) * real for r in range(n()))
    np.testing.assert_array_equal(x, np.asarray(want).astype(dtype))


# ------------------------------------------------------------------ strided outputs written back through NumPy


def test_strided_inference_tensor_outputs_hold_the_result():
    """Inference tensors cannot be written by torch ops outside inference mode; gloo fills them, so must we."""
    with torch.inference_mode():
        x = torch.from_numpy(values(me(), 6).reshape(2, 3)).t()  # a transposed (strided) view
        outs = [torch.zeros(6, dtype=torch.float64)[::2] for _ in range(n())]
        big = torch.zeros(3, n(), dtype=torch.float64).t()
    assert x.is_inference() and not x.is_contiguous()
    dist.all_reduce(x)
    want = sum(values(r, 6) for r in range(n())).reshape(2, 3).T
    np.testing.assert_array_equal(x.numpy(), want)
    dist.all_gather(outs, torch.from_numpy(values(me(), 3)))
    for r in range(n()):
        np.testing.assert_array_equal(outs[r].numpy(), values(r, 3))
    dist.all_gather_into_tensor(big, torch.from_numpy(values(me(), 3)))
    np.testing.assert_array_equal(big.reshape(-1).numpy(), np.concatenate([values(r, 3) for r in range(n())]))


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32", "int64", "complex64"])
@pytest.mark.parametrize("async_op", [False, True])
def test_strided_outputs_of_every_kind_hold_the_result(dtype, async_op):
    """Step-sliced outputs (leaf requiring grad, a Parameter's view), reduced and gathered, against NumPy."""
    tdt = getattr(torch, dtype)
    want = sum(values(r, 4) for r in range(n()))
    x = torch.zeros(8, dtype=tdt)[::2]
    x.copy_(torch.from_numpy(values(me(), 4)))
    if x.is_floating_point() or x.is_complex():
        x = torch.nn.Parameter(torch.zeros(8, dtype=tdt))
        with torch.no_grad():
            x[::2] = torch.from_numpy(values(me(), 4)).to(tdt)
        x = x[::2]
    w = dist.all_reduce(x, async_op=async_op)
    if w is not None:
        w.wait()
    assert torch.equal(x.detach(), torch.from_numpy(want).to(tdt))
    out = torch.zeros(4 * n() * 2, dtype=tdt)[::2]
    w = dist.all_gather_into_tensor(out, torch.from_numpy(values(me(), 4)).to(tdt), async_op=async_op)
    if w is not None:
        w.wait()
    want_all = torch.from_numpy(np.concatenate([values(r, 4) for r in range(n())])).to(tdt)
    assert torch.equal(out, want_all)


# ------------------------------------------------------------------ outputs whose elements share memory


def _np_overlapping() -> np.ndarray:
    base = np.zeros(n() + 3)
    return np.lib.stride_tricks.as_strided(base, shape=(n() + 2, 2), strides=(8, 8), writeable=True)


OVERLAPPING = [
    ("expand", lambda: torch.full((1,), float(me())).expand(4), lambda x: dist.all_reduce(x)),
    ("expand2d", lambda: torch.zeros(3, 1).expand(3, 4), lambda x: dist.all_reduce(x, op=ReduceOp.MAX)),
    ("unfold", lambda: torch.arange(10.0).unfold(0, 4, 2), lambda x: dist.all_reduce(x)),
    ("np stride 0", lambda: np.lib.stride_tricks.as_strided(np.ones(1), (4,), (0,), writeable=True), dist.all_reduce),
    ("np as_strided", _np_overlapping, lambda x: dist.all_reduce(x)),
    (
        "all_gather output",
        lambda: [torch.zeros(1).expand(3) for _ in range(n())],
        lambda outs: dist.all_gather(outs, torch.ones(3)),
    ),
    (
        "all_gather_into_tensor",
        lambda: torch.zeros(1).expand(2 * n()),
        lambda out: dist.all_gather_into_tensor(out, torch.ones(2)),
    ),
]


@pytest.mark.parametrize(("name", "make", "call"), OVERLAPPING, ids=[c[0] for c in OVERLAPPING])
def test_an_output_whose_elements_share_memory_is_refused_before_any_message(name, make, call):
    """gloo writes some of the results over others (or torch's copy_ raises after the data moved); hpcdist refuses
    such an output on the rank that passes it, before any message moves."""
    arg = make()
    first = arg[0] if isinstance(arg, list) else arg
    first = first.numpy() if isinstance(first, torch.Tensor) else first
    before = first.copy()
    with pytest.raises(ValueError, match=r"share memory.*writes its result into it") as info:
        call(arg)
    assert "tensor" in str(info.value) or "output" in str(info.value)
    np.testing.assert_array_equal(first, before)  # nothing written
    usable()


def test_an_overlapping_view_may_still_be_sent():
    """Reading a view whose elements share memory is well defined: it is an input everywhere here."""
    x = torch.full((1,), float(me() + 1)).expand(4)
    out = torch.zeros(4 * n())
    dist.all_gather_into_tensor(out, x)
    np.testing.assert_array_equal(out.numpy(), np.repeat(np.arange(1, n() + 1, dtype=np.float32), 4))


def test_exotic_but_disjoint_strides_are_written():
    """The exact test behind the quick one: strides (8, 12) of float32 are disjoint though not nested."""
    base = np.zeros(8, dtype=np.float32)
    x = np.lib.stride_tricks.as_strided(base, shape=(2, 2), strides=(8, 12), writeable=True)
    x[...] = np.arange(4, dtype=np.float32).reshape(2, 2) + me()
    dist.all_reduce(x)
    want = sum(np.arange(4, dtype=np.float32).reshape(2, 2) + r for r in range(n()))
    np.testing.assert_array_equal(x, want)


# ------------------------------------------------------------------ NumPy subclasses


@pytest.mark.filterwarnings("ignore:the matrix subclass:PendingDeprecationWarning")
@pytest.mark.parametrize("dtype", [np.float16, np.float64])
def test_numpy_matrix_arrays_give_the_ndarray_results(dtype, tmp_path):
    """np.matrix stays two-dimensional under reshape(-1): packing raised mid-call (coalesced, bucketed) and the
    shared-memory path reduced float16 matrices wrong; memmaps are subclasses too."""
    want = sum(np.array([[1.0, 2.0]], dtype=dtype) + r for r in range(n()))
    x = np.matrix([[1.0, 2.0]], dtype=dtype) + me()
    dist.all_reduce(x)
    np.testing.assert_array_equal(np.asarray(x), want)
    xs = [np.matrix([[1.0, 2.0]], dtype=dtype) + me(), np.matrix([[1.0], [2.0], [3.0]], dtype=dtype) + me()]
    dist.all_reduce_coalesced(xs)
    np.testing.assert_array_equal(np.asarray(xs[0]), want)
    np.testing.assert_array_equal(
        np.asarray(xs[1]).ravel(), sum(np.arange(1.0, 4.0, dtype=dtype) + r for r in range(n()))
    )
    w = dist.all_reduce_coalesced([x, np.matrix([[0.0]], dtype=dtype)], async_op=True)
    w.wait()
    np.testing.assert_array_equal(np.asarray(x), want * n())
    out = np.matrix(np.zeros((n(), 2), dtype=dtype))
    dist.all_to_all_single(out, np.matrix(np.arange(2.0 * n(), dtype=dtype).reshape(n(), 2)) + 10 * me())
    np.testing.assert_array_equal(np.asarray(out), [[2 * me() + 10 * r, 2 * me() + 1 + 10 * r] for r in range(n())])
    mm = np.memmap(tmp_path / f"mm{me()}.dat", dtype=dtype, mode="w+", shape=(2,))
    mm[:] = [1.0 + me(), 2.0 + me()]
    dist.all_reduce(mm, op=ReduceOp.AVG)
    np.testing.assert_array_equal(np.asarray(mm), (want / n()).astype(dtype).ravel())


# ------------------------------------------------------------------ arrays whose writes would be lost or wrong


def _quantized():
    """A quantized tensor (torch deprecates making them, with a warning): a dtype hpcdist does not move."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return torch.quantize_per_tensor(torch.zeros(2), 0.1, 0, torch.qint8)


REFUSED = [
    (
        "numpy scalar output",
        lambda: dist.all_reduce(np.float64(1.0)),
        TypeError,
        ["tensor", "NumPy scalar", "np.array"],
    ),
    (
        "masked array",
        lambda: dist.all_reduce(np.ma.masked_array([1.0, 2.0], mask=[0, 1])),
        TypeError,
        ["tensor", "masked array", "filled"],
    ),
    (
        "nested tensor",
        lambda: dist.all_reduce(torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])),
        TypeError,
        ["tensor", "nested tensor", "unbind"],
    ),
    (
        "meta tensor",
        lambda: dist.all_reduce(torch.ones(2, device="meta")),
        TypeError,
        ["tensor", "meta device"],
    ),
    (
        "quantized",
        lambda: dist.broadcast(_quantized(), src=0),
        TypeError,
        ["tensor", "qint8", "expected", "float8"],
    ),
    (
        "big-endian output",
        lambda: dist.all_gather_into_tensor(np.zeros(2 * n(), dtype=">f8"), np.zeros(2)),
        TypeError,
        ["output_tensor", ">f8", "newbyteorder"],
    ),
]


@pytest.mark.filterwarnings("ignore:.*(nested tensors|ComplexHalf)")
@pytest.mark.parametrize(("name", "call", "exc", "words"), REFUSED, ids=[c[0] for c in REFUSED])
def test_unusable_arrays_are_refused_clearly(name, call, exc, words):
    raises_naming(name, call, exc, words)
    usable()


def test_a_numpy_scalar_may_be_sent():
    """Reading a NumPy scalar is fine (its value is what travels)."""
    out = np.zeros(n())
    dist.all_gather_into_tensor(out, np.float64(me() + 0.5))
    np.testing.assert_array_equal(out, np.arange(n()) + 0.5)
