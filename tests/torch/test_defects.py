"""progs/defects.py at 3 ranks with backend "hpcdist" and with torch's gloo (the reference): see its docstring."""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import launch, launch_both, load

N = 3


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    return launch_both(N, "defects.py", tmp_path_factory)  # exit status 0: no MPI_Abort(124) after the expired wait


@pytest.mark.parametrize("asynchronous", [False, True])
def test_zero_dim_bfloat16_all_reduce(runs, asynchronous):
    want = torch.tensor(N * (N + 1) / 2, dtype=torch.bfloat16)
    for r in range(N):
        got = runs["hpcdist"][r][f"bf16_0d_async={asynchronous}"]
        assert got.dtype == torch.bfloat16 and got.shape == () and torch.equal(got, want), (r, got)


def test_ddp_under_join_with_uneven_inputs(runs):
    """Identical parameters on every rank, and gloo's up to the summation order of floats."""
    mine = [runs["hpcdist"][r]["join_params"] for r in range(N)]
    assert all(torch.equal(mine[0], p) for p in mine)
    assert torch.allclose(mine[0], runs["gloo"][0]["join_params"], rtol=1e-5, atol=1e-6)


def test_an_expired_wait_on_an_owned_work_leaves_the_operation_to_complete(runs):
    """gloo raises a RuntimeError too; hpcdist's is its DistTimeoutError (a RuntimeError and a TimeoutError)."""
    assert runs["hpcdist"][0]["owned_wait"] == ("DistTimeoutError", True)
    assert runs["gloo"][0]["owned_wait"][1] is True
    for r in range(N):
        assert torch.equal(runs["hpcdist"][r]["owned_result"], torch.full((3,), float(N)))


def _assert_sums(runs: dict[str, list[dict[str, Any]]], key: str, n: int) -> None:
    """Every hpcdist rank's (tensor, n x 2 view) under ``key`` holds the known sum (the view's other column 0)."""
    total = N * (N + 1) / 2
    for r in range(N):
        t, view = runs["hpcdist"][r][key]
        assert torch.equal(t, torch.full((n,), total)), (r, t[:3])
        assert torch.equal(view[:, 0], torch.full((n,), total)), (r, view[:3, 0])
        assert torch.equal(view[:, 1], torch.zeros(n)), r


@pytest.mark.parametrize("n", [16, 1024, 65536])
def test_dropped_async_all_reduces_are_complete_after_a_barrier(runs, n):
    """hpcdist's barrier finishes the group's dropped collectives (docs/sharp-bits.md), on the torch backend too:
    the outputs held nothing, or the sum without its copy-back into a non-contiguous view. The reference is the
    known sum: gloo's own outputs were partial after its barrier in this program (half of the 16 elements at
    rank 0, after DDP under Join), so gloo is not asserted here."""
    _assert_sums(runs, f"dropped_{n}", n)


@pytest.mark.parametrize("how", ["barrier", "async-barrier", "async-barrier-polled"])
@pytest.mark.parametrize("n", [16, 1024, 65536])
def test_held_async_all_reduces_are_complete_after_a_barrier(runs, n, how):
    """gloo's barrier completes after the group's earlier collectives (its source says so, and a program of just
    these calls at 3 ranks gave complete sums on gloo); hpcdist's outputs held nothing at 64 Ki elements until
    the Works were waited. Known sums as the reference: in this program, after DDP under Join, gloo's own
    outputs were partial after its barrier, so gloo is not asserted."""
    _assert_sums(runs, f"held_{how}_{n}", n)


def test_a_barrier_does_not_wait_for_a_receive_whose_send_comes_after_it(runs):
    """docs/torch.md: the barrier waits for earlier collectives, not point-to-point work (it would never end)."""
    for backend in ("hpcdist", "gloo"):
        assert torch.equal(runs[backend][0]["p2p_across_barrier"], torch.arange(4.0)), backend


def _bytes(name: str, rank: int, count: int = 6) -> torch.Tensor:
    """The bytes rank ``rank`` drew for ``count`` elements of ``name`` (progs/defects.py's seeds)."""
    size = torch.empty(0, dtype=getattr(torch, name)).element_size()
    return torch.randint(0, 256, (count * size,), dtype=torch.uint8, generator=torch.Generator().manual_seed(rank))


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2", "uint16", "uint32", "uint64"])
def test_dtypes_numpy_lacks_and_unsigned_ones_move(runs, name):
    """Every data-movement call carries the bytes each rank drew, in the order gloo's p2p and the API define;
    point to point agrees with gloo's (which refuses these dtypes in its collectives, as docs/torch.md says)."""
    for r in range(N):
        got = runs["hpcdist"][r]["dtypes"]
        assert torch.equal(got[name, "broadcast"], _bytes(name, 1)), r
        assert torch.equal(got[name, "all_gather_into_tensor"], torch.cat([_bytes(name, q) for q in range(N)])), r
        size = _bytes(name, 0, 1).numel()  # bytes per element
        want = torch.cat([_bytes(name, q, 2 * N)[2 * r * size : 2 * (r + 1) * size] for q in range(N)])
        assert torch.equal(got[name, "all_to_all_single"], want), r
        assert torch.equal(got[name, "isend/irecv"], _bytes(name, (r - 1) % N)), r
        assert torch.equal(runs["gloo"][r]["dtypes"][name, "isend/irecv"], got[name, "isend/irecv"]), r
        assert got["after"] == [float(N)] * 2
    gloo = runs["gloo"][0]["dtypes"][name, "broadcast"]
    assert isinstance(gloo, tuple) and "Invalid scalar type" in gloo[2], gloo


@pytest.mark.parametrize("name", ["uint16", "uint32", "uint64"])
def test_unsigned_reductions_wrap_and_order_as_unsigned(runs, name):
    bits = {"uint16": 16, "uint32": 32, "uint64": 64}[name]
    base = 2 ** (bits - 1)
    for r in range(N):
        got = runs["hpcdist"][r]["dtypes"]
        assert got[name, "SUM"] == [N * (N + 1) // 2, (N * base + N * (N - 1) // 2) % 2**bits], r
        assert got[name, "MAX"] == [N, base + N - 1], r


@pytest.mark.parametrize("name", ["float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2"])
@pytest.mark.parametrize("op", ["SUM", "MAX"])
def test_bits_only_dtypes_are_not_reduced(runs, name, op):
    """A RuntimeError (as gloo's refusal) and a ValueError, naming the dtype and the conversion, on every rank."""
    for r in range(N):
        kind, is_runtime, msg = runs["hpcdist"][r]["dtypes"][name, op]
        assert kind == "BackendValueError" and is_runtime, (r, kind)
        assert f"cannot reduce {name}" in msg and "tensor.float()" in msg, msg


@pytest.mark.parametrize("debug", ["HPCDIST_DEBUG", "TORCH_DISTRIBUTED_DEBUG"])
def test_detail_refuses_all_reduces_of_different_sizes_or_dtypes(tmp_path, debug):
    """Every rank raises naming what each called, for blocking and async calls; the next all_reduce matches."""
    launch(N, "detail.py", "hpcdist", tmp_path, env={debug: "DETAIL"})
    for r in range(N):
        got = load(tmp_path, "detail", r)
        for case in ("size", "dtype"):
            for asynchronous in (False, True):
                key = f"{case} async={asynchronous}"
                assert isinstance(got[key], str) and got[key].startswith("DistError: collective mismatch"), (r, key)
                assert "all_reduce(float32, SUM, shape (3,))" in got[key] or case == "dtype", (r, key, got[key])
                assert torch.equal(got[key + " after"], torch.full((2,), float(N))), (r, key)
