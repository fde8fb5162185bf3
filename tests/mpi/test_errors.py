"""Bad input: a clear error on the calling rank before any message moves; the group stays usable.

Each case runs on every rank (so no rank is left waiting); after each, an
all_reduce proves the group still works and no stray message is pending.
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest
from checks import raises_naming

import hpcdist as dist
from hpcdist import ReduceOp

try:
    import torch
except ImportError:
    torch = None


def usable() -> None:
    x = np.ones(3)
    dist.all_reduce(x)
    assert x.tolist() == [float(dist.get_world_size())] * 3


def n() -> int:
    return dist.get_world_size()


def me() -> int:
    return dist.get_rank()


RO = np.ones(4)
RO.flags.writeable = False

CASES = [
    # (name, call, exception type, words the message must contain)
    ("src outside world", lambda: dist.broadcast(np.ones(2), src=n() + 5), ValueError, ["src", "not a rank"]),
    ("src and group_src", lambda: dist.broadcast(np.ones(2), src=0, group_src=0), ValueError, ["either"]),
    ("no src", lambda: dist.broadcast(np.ones(2)), ValueError, ["src"]),
    ("bad group_dst", lambda: dist.reduce(np.ones(2), group_dst=-1), ValueError, ["group_dst"]),
    ("send to self", lambda: dist.send(np.ones(2), dst=me()), ValueError, ["own rank"]),
    ("recv from self", lambda: dist.recv(np.ones(2), src=me()), ValueError, ["own rank"]),
    ("bad tag", lambda: dist.isend(np.ones(2), dst=(me() + 1) % max(n(), 2), tag=-1), ValueError, ["tag"]),
    (
        "list too short",
        lambda: dist.all_gather([np.ones(2)] * (n() + 1), np.ones(2)),
        ValueError,
        ["one array per rank", str(n())],
    ),
    ("not a list", lambda: dist.all_gather(np.ones(2), np.ones(2)), TypeError, ["tensor_list"]),
    (
        "wrong out size",
        lambda: dist.all_gather_into_tensor(np.ones(n() * 2 + 1), np.ones(2)),
        ValueError,
        ["output_tensor", str(n() * 2)],
    ),
    (
        "wrong slot size",
        lambda: dist.all_gather([np.ones(3) for _ in range(n())], np.ones(2)),
        ValueError,
        ["tensor_list"],
    ),
    (
        "dtype mismatch",
        lambda: dist.all_gather_into_tensor(np.ones(2 * n(), dtype=np.float32), np.ones(2)),
        TypeError,
        ["float32", "float64"],
    ),
    ("read-only output", lambda: dist.all_reduce(RO), ValueError, ["read-only"]),
    ("unsupported dtype", lambda: dist.all_reduce(np.array(["a", "b"])), TypeError, ["dtype", "<U1"]),
    ("object dtype", lambda: dist.broadcast(np.array([object()]), src=0), TypeError, ["dtype", "object"]),
    (
        "byte-swapped dtype",
        lambda: dist.all_reduce(np.ones(2, dtype=">f8" if np.little_endian else "<f8")),
        TypeError,
        ["dtype"],
    ),
    ("not an array", lambda: dist.all_reduce([1, 2, 3]), TypeError, ["tensor", "list"]),
    ("bitwise on float", lambda: dist.all_reduce(np.ones(2), op=ReduceOp.BAND), ValueError, ["BAND", "float64"]),
    ("max on complex", lambda: dist.all_reduce(np.ones(2, complex), op=ReduceOp.MAX), ValueError, ["MAX", "complex"]),
    ("not an op", lambda: dist.all_reduce(np.ones(2), op="sum"), TypeError, ["op", "ReduceOp"]),
    ("an unhashable op", lambda: dist.all_reduce(np.ones(2), op=[1]), TypeError, ["op", "ReduceOp", "[1]"]),
    ("an unhashable op, reduce", lambda: dist.reduce(np.ones(2), dst=0, op={}), TypeError, ["op", "ReduceOp"]),
    ("premul without factor", lambda: dist.all_reduce(np.ones(2), op=ReduceOp.PREMUL_SUM), ValueError, ["factor"]),
    (
        "scatter list on non-src",
        lambda: (
            dist.scatter(np.ones(2), [np.ones(2)] * n(), src=(me() + 1) % n())
            if n() > 1
            else dist.scatter(np.ones(2), None, src=0)
        ),
        ValueError,
        ["scatter_list"],
    ),
    ("gather list missing on dst", lambda: dist.gather(np.ones(2), None, dst=me()), ValueError, ["gather_list"]),
    (
        "a2a split sum",
        lambda: dist.all_to_all_single(np.ones(4), np.ones(4), input_split_sizes=[5] + [0] * (n() - 1)),
        ValueError,
        ["input_split_sizes", "sums to 5"],
    ),
    (
        "a2a indivisible",
        lambda: (
            dist.all_to_all_single(np.ones(n() * 2 + 1), np.ones(n() * 2 + 1))
            if n() > 1
            else dist.all_to_all_single(np.ones(2), np.ones(2), output_split_sizes=[3])
        ),
        ValueError,
        ["split"],
    ),
    ("rs wrong input", lambda: dist.reduce_scatter_tensor(np.ones(2), np.ones(2 * n() + 1)), ValueError, ["input"]),
    ("barrier bad timeout", lambda: dist.barrier(timeout=5), TypeError, ["timedelta"]),
    ("group bad type", lambda: dist.all_reduce(np.ones(2), group="world"), TypeError, ["ProcessGroup"]),
    ("new_group bad rank", lambda: dist.new_group([0, n() + 3]), ValueError, ["ranks", str(n() + 3)]),
    ("new_group dup rank", lambda: dist.new_group([0, 0]), ValueError, ["duplicate"]),
    ("subgroups indivisible", lambda: dist.new_subgroups(group_size=n() + 1), ValueError, ["group_size"]),
    ("object list too short", lambda: dist.all_gather_object([None] * (n() - 1), 1), ValueError, ["object_list"]),
    ("get_group_rank non member", lambda: dist.get_group_rank(dist.group.WORLD, n() + 1), ValueError, ["not part"]),
    ("init twice", lambda: dist.init_process_group("mpi"), ValueError, ["twice"]),
    ("unknown backend", lambda: dist.new_group(backend="quic"), ValueError, ["quic", "mpi"]),
    ("bad device map", lambda: dist.new_group(backend="tpu:mpi"), ValueError, ["device"]),
]


@pytest.mark.parametrize(("name", "call", "exc", "words"), CASES, ids=[c[0] for c in CASES])
def test_bad_input_raises_clearly_and_group_stays_usable(name, call, exc, words):
    raises_naming(name, call, exc, words)
    usable()


def test_torch_dtype_errors():
    if torch is None:
        pytest.skip("torch is not installed")
    with pytest.raises(ValueError, match="BXOR"):
        dist.all_reduce(torch.ones(2, dtype=torch.bfloat16), op=ReduceOp.BXOR)
    with pytest.raises(ValueError, match=r"cannot reduce complex32.*torch\.view_as_real"):
        dist.all_reduce(torch.ones(2, dtype=torch.complex32))  # moved as bits (test_bits_dtypes), not reduced
    usable()


def test_receive_timeout_cancels_and_group_stays_usable():
    """A receive whose sender never comes raises after the timeout; the group keeps working."""
    if n() < 2:
        pytest.skip("needs 2 or more ranks")
    if me() == 0:
        w = dist.irecv(np.zeros(2), src=1, tag=77)
        with pytest.raises(dist.DistTimeoutError, match=r"did not complete within 0\.3s"):
            w.wait(timeout=timedelta(seconds=0.3))
        assert isinstance(w.exception(), TimeoutError)
    usable()
