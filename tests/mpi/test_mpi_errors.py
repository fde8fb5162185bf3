"""MPI's own errors in a blocking collective reach the caller as hpcdist's ``DistBackendError``.

In block mode (``HPCDIST_WAIT=block``, the default) a collective whose ranks
disagree on the sizes they exchange (legal shapes for ``gather`` and
``scatter``, which allow uneven parts) makes MPI fail the call on the rank
whose receive is too small. That rank got mpi4py's bare ``MPI.Exception``
("Message truncated, error stack: internal_Scatterv_c(463)...", or at a
gather's root "See the MPI_ERROR field in MPI_Status for the error code")
from both the general path and the lanes. Now it gets a ``DistBackendError``
that names the operation and the group, says what went wrong and points to
DETAIL mode, with MPI's error as ``__cause__``; the other ranks' calls
complete, and the group stays usable.

Poll mode gets no such error: MPICH reports no truncation of a non-blocking
``Iscatterv``/``Igatherv`` (docs/sharp-bits.md); DETAIL mode refuses the call
on every rank before any data moves (tests/mpi/test_detail_sizes.py).
"""

from __future__ import annotations

import numpy as np
import pytest
from mpi4py import MPI

import hpcdist as dist
from hpcdist.config import wait_mode
from hpcdist.debug import DebugLevel, get_debug_level

K = 3


@pytest.fixture(autouse=True)
def _block_mode_without_detail():
    if dist.get_world_size() < 2:
        pytest.skip("needs 2 or more ranks")
    if wait_mode() != "block":
        pytest.skip("poll mode: MPI reports no truncation of a non-blocking scatter or gather (documented)")
    if get_debug_level() == DebugLevel.DETAIL:
        pytest.skip("DETAIL refuses the call before any data moves (test_detail_sizes.py)")


def _outcome(call) -> tuple[str, str, bool]:
    """(the error's type name, its text, whether MPI's error is its cause) of ``call()``; ("", "", False): none."""
    try:
        call()
    except Exception as exc:
        return type(exc).__name__, str(exc), isinstance(exc.__cause__, MPI.Exception)
    return "", "", False


def _everyones(mine: tuple[str, str, bool]) -> list[tuple[str, str, bool]]:
    """Every rank's outcome on every rank: the ranks assert alike, so a failure cannot leave them out of step."""
    seen: list = [None] * dist.get_world_size()
    dist.all_gather_object(seen, mine)
    return seen


def _is_backend_error(outcome: tuple[str, str, bool], op: str) -> bool:
    kind, text, from_mpi = outcome
    return (
        kind == "DistBackendError"
        and from_mpi
        and text.startswith(f"{op} on <ProcessGroup 'default_pg'")
        and "the ranks passed arrays of different sizes" in text
        and "TORCH_DISTRIBUTED_DEBUG=DETAIL" in text
    )


def _still_usable() -> None:
    x = np.full(4, dist.get_rank() + 1.0)
    dist.all_reduce(x)
    n = dist.get_world_size()
    np.testing.assert_array_equal(x, np.full(4, n * (n + 1) / 2))


@pytest.mark.parametrize("warm", [False, True], ids=["general-path", "lane"])
def test_scatter_into_a_too_small_array_is_a_backend_error_naming_the_op(warm):
    n, r, last = dist.get_world_size(), dist.get_rank(), dist.get_world_size() - 1
    if warm:  # an agreeing call first: the ranks with even parts take the scatter lane from now on
        out = np.zeros(K)
        dist.scatter(out, [np.full(K, float(i)) for i in range(n)] if r == 0 else None, src=0)
        assert out.tolist() == [float(r)] * K
    parts = [np.arange(K + (i == last), dtype=np.float64) + 10 * i for i in range(n)] if r == 0 else None
    out = np.full(K, -1.0)
    seen = _everyones(_outcome(lambda: dist.scatter(out, parts, src=0)))
    assert _is_backend_error(seen[last], "scatter"), seen
    assert "larger than the receive buffer (MPI_ERR_TRUNCATE)" in seen[last][1], seen
    assert all(o == ("", "", False) for o in seen[:last]), seen  # the others' calls completed
    if r != last:
        np.testing.assert_array_equal(out, np.arange(K) + 10.0 * r)
    _still_usable()


@pytest.mark.parametrize("warm", [False, True], ids=["general-path", "lane"])
def test_gather_of_a_too_large_part_is_a_backend_error_at_the_root(warm):
    n, r, last = dist.get_world_size(), dist.get_rank(), dist.get_world_size() - 1
    if warm:
        got = [np.zeros(K) for _ in range(n)] if r == 0 else None
        dist.gather(np.full(K, float(r)), got, dst=0)
        if r == 0:
            assert [g.tolist() for g in got] == [[float(i)] * K for i in range(n)]
    mine = np.arange(K + (r == last), dtype=np.float64)
    slots = [np.zeros(K) for _ in range(n)] if r == 0 else None
    seen = _everyones(_outcome(lambda: dist.gather(mine, slots, dst=0)))
    assert _is_backend_error(seen[0], "gather"), seen
    assert all(o == ("", "", False) for o in seen[1:]), seen
    _still_usable()
