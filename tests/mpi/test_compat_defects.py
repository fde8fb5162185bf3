"""Array collectives' arguments against torch (gloo), found in the adversarial collectives round.

* ``all_to_all_single`` refused an input and an output whose rows differ in
  size ("input and output rows must have the same size"): torch counts each
  array's split sizes in that array's own rows (gloo and NCCL move
  ``split x row`` items), so an input of shape (n, 2) into an output of shape
  (2n,) is a valid exchange there.
* ``all_to_all_single`` refused split sizes held as NumPy integers
  (``list(np_array)``, ``[np.int64(2), ...]``); torch takes any integer.
* ``all_to_all_single`` hung in block mode when one rank's splits were even
  (none given, or given and even) and another's uneven (found auditing the
  lanes): each rank chose MPI_Alltoall or MPI_Alltoallv from its own splits,
  and the two never match. gloo and NCCL exchange such a call.
"""

from __future__ import annotations

from datetime import timedelta
from decimal import Decimal
from fractions import Fraction

import numpy as np
import pytest

import hpcdist as dist

try:
    import torch
except ImportError:
    torch = None


def me() -> int:
    return dist.get_rank()


def n() -> int:
    return dist.get_world_size()


def usable() -> None:
    x = np.ones(3)
    dist.all_reduce(x)
    assert x.tolist() == [float(n())] * 3


@pytest.mark.parametrize("uneven", [False, True])
def test_all_to_all_single_counts_each_arrays_own_rows(uneven):
    """Input rows of 2 items, output rows of 1: rank r sends rows to each peer, as gloo does."""
    size, r = n(), me()
    inp = np.arange(2 * size, dtype=np.float64).reshape(size, 2) + 100 * r  # row j (2 items) goes to rank j
    out = np.zeros(2 * size)
    if uneven:
        dist.all_to_all_single(out, inp, output_split_sizes=[2] * size, input_split_sizes=[1] * size)
    else:
        dist.all_to_all_single(out, inp)
    want = np.concatenate([np.array([2 * r, 2 * r + 1], dtype=np.float64) + 100 * p for p in range(size)])
    assert np.array_equal(out, want), (out, want)
    # the reverse: 1-item input rows into an output of 2-item rows
    back = np.zeros((size, 2))
    dist.all_to_all_single(back, out)
    assert np.array_equal(back, inp)
    usable()


def test_all_to_all_single_items_that_disagree_still_raise_on_every_rank():
    """Input (n, 2) into an output of n items: this rank would send itself 2 items but expects 1."""
    with pytest.raises(ValueError) as info:
        dist.all_to_all_single(np.zeros(n()), np.zeros((n(), 2)))
    msg = str(info.value)
    assert "input_split_sizes" in msg and "2 items" in msg and "expects 1" in msg, msg
    usable()


@pytest.mark.parametrize("form", ["numpy ints", "numpy array", "torch tensor"])
def test_all_to_all_single_takes_integer_split_sizes(form):
    size, r = n(), me()
    splits = [1 + (j + r) % 2 for j in range(size)]  # rows this rank sends rank j
    recv = [1 + (r + j) % 2 for j in range(size)]  # rows rank j sends this rank
    if form == "numpy ints":
        s_in, s_out = [np.int64(s) for s in splits], [np.int32(s) for s in recv]
    elif form == "numpy array":
        s_in, s_out = np.array(splits), np.array(recv)
    else:
        if torch is None:
            pytest.skip("torch is not installed")
        s_in, s_out = torch.tensor(splits), torch.tensor(recv)
    inp = np.concatenate([np.full(s, 10.0 * r + j) for j, s in enumerate(splits)])
    out = np.zeros(sum(recv))
    dist.all_to_all_single(out, inp, s_out, s_in)
    want = np.concatenate([np.full(s, 10.0 * j + r) for j, s in enumerate(recv)])
    assert np.array_equal(out, want), (out, want)
    usable()


@pytest.mark.parametrize("bad", [[True], [1.0], [-1]], ids=["bool", "float", "negative"])
def test_all_to_all_single_refuses_non_integer_split_sizes(bad):
    splits = bad + [1] * (n() - 1)
    with pytest.raises(ValueError, match="input_split_sizes must hold non-negative ints"):
        dist.all_to_all_single(np.zeros(n()), np.zeros(n()), [1] * n(), splits)
    usable()


@pytest.mark.parametrize(
    "op", [True, False, 1, 4, 1.0, 4.0, np.int64(1), 3 + 0j, Fraction(3), Decimal(4), np.complex64(1)], ids=repr
)
def test_a_number_as_op_is_refused_on_every_rank(op):
    """torch raises TypeError for op=True (``all_reduce(t, True)``, meant as async_op) or op=4; hpcdist ran them
    as AVG, SUM, MAX... since a number hashes like the ReduceOp of its value, also after that op's fast lane was
    learned. Refused before any message, on every rank; the group goes on."""
    x = np.ones(4)
    dist.all_reduce(x, op=dist.ReduceOp.MAX)  # the lanes of MAX and AVG are learned: a number must not take them
    dist.all_reduce(x, op=dist.ReduceOp.AVG)
    for call in (
        lambda: dist.all_reduce(np.ones(4), op),
        lambda: dist.all_reduce(np.ones(4), op=op, async_op=True),
        lambda: dist.reduce(np.ones(4), dst=0, op=op),
        lambda: dist.all_reduce_coalesced([np.ones(4)], op=op),
        lambda: dist.reduce_scatter_tensor(np.ones(1), np.ones(dist.get_world_size()), op=op),
    ):
        with pytest.raises(TypeError, match="must be a ReduceOp"):
            call()
    y = np.full(3, float(dist.get_rank() + 1))
    dist.all_reduce(y)
    assert y.tolist() == [sum(range(1, dist.get_world_size() + 1))] * 3


def _sent(src: int, dst: int, mixed: bool, scale: int) -> int:
    """Items ``src`` sends ``dst``: 2 to and from rank 0 (whose splits are even), else uneven when ``mixed``;
    times ``scale`` (large blocks: a rank's own block is then copied outside MPI)."""
    return scale * (2 if 0 in (src, dst) or not mixed else (src + dst) % 3 + 1)


@pytest.mark.parametrize("engine", ["default", "mpi"])
@pytest.mark.parametrize("scale", [1, 4096])
@pytest.mark.parametrize("rank0", ["none", "explicit"])
@pytest.mark.parametrize("mixed", [True, False])
def test_all_to_all_single_ranks_may_pass_even_and_uneven_splits_in_one_call(rank0, mixed, scale, engine, monkeypatch):
    """Rank 0 exchanges 2 items with every rank and passes no split sizes (or even ones); the others pass their
    own, uneven ones. Twice on a fresh group: the second call of an even rank takes its lane. On the group's
    engine, and on MPI's alone (``HPCDIST_SHM=0``: an oversubscribed node sends all-to-alls to shared memory)."""
    if engine == "mpi":
        monkeypatch.setenv("HPCDIST_SHM", "0")  # read when the group builds its engine
    size, rank = n(), me()
    pg = dist.new_group(timeout=timedelta(seconds=30))  # a mismatch fails within 30 s, not the suite's timeout
    for salt in range(2):
        send = [_sent(rank, j, mixed, scale) for j in range(size)]
        recv = [_sent(j, rank, mixed, scale) for j in range(size)]
        x = np.concatenate([1e6 * salt + 1e4 * rank + 100 * j + np.arange(send[j]) for j in range(size)])
        out = np.zeros(sum(recv))
        splits = (None, None) if rank == 0 and rank0 == "none" else (recv, send)
        dist.all_to_all_single(out, x, *splits, group=pg)
        want = np.concatenate([1e6 * salt + 1e4 * j + 100 * rank + np.arange(recv[j]) for j in range(size)])
        assert np.array_equal(out, want), (salt, out, want)
    dist.destroy_process_group(pg)
    usable()
