"""FSDP2, DTensor over a 2 x 2 device mesh and tensor parallelism over backend "hpcdist" at 4 ranks.

One launch per backend (progs/fsdp_dtensor.py). DTensor results equal the
answers computed here and gloo's bit for bit; tensor parallel training equals
gloo's bit for bit (its reductions have two operands per tp group). FSDP2's
gradient reduce-scatter sums 4 float32 operands, whose order differs between
MPI's and gloo's algorithms: equal to gloo's within float32 rounding of a
4-term sum (rtol 1e-5, atol 1e-6).
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import launch_both, same, torch

N = 4


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    return launch_both(N, "fsdp_dtensor.py", tmp_path_factory)


def test_fsdp2_equals_gloo(runs: dict[str, list[dict[str, Any]]]) -> None:
    for r in range(N):
        ours, theirs = runs["hpcdist"][r]["fsdp2"], runs["gloo"][r]["fsdp2"]
        for k in ours:
            torch.testing.assert_close(ours[k], theirs[k], rtol=1e-5, atol=1e-6, msg=f"rank {r} {k}")


def test_fsdp2_ranks_hold_their_shards_of_one_model(runs: dict[str, list[dict[str, Any]]]) -> None:
    full = runs["hpcdist"][0]["fsdp2"]
    for r in range(N):
        assert same(runs["hpcdist"][r]["fsdp2"], full)
        for k, local in runs["hpcdist"][r]["fsdp2_local"].items():
            rows = full[k].shape[0] // N
            assert same(local, full[k][r * rows : (r + 1) * rows]), (r, k)
    start = torch.nn.Linear(16, 16)  # training moved the weights away from anything trivial
    assert full["0.0.weight"].shape == start.weight.shape and full["0.0.weight"].abs().sum() > 0


def test_dtensor_known_answers(runs: dict[str, list[dict[str, Any]]]) -> None:
    big = torch.arange(64.0).reshape(8, 8)
    a = torch.arange(32.0).reshape(8, 4) / 8
    b = torch.arange(12.0).reshape(4, 3) / 4
    w, v = torch.arange(16.0).reshape(4, 4), torch.arange(8.0).reshape(4, 2)
    for r in range(N):
        res = runs["hpcdist"][r]
        dp, tp = divmod(r, 2)  # mesh (2, 2): rank = dp * 2 + tp
        assert same(res["dtensor_local"], big[dp * 4 : dp * 4 + 4, tp * 4 : tp * 4 + 4])
        assert same(res["dtensor_replicated"], big)
        assert same(res["dtensor_shard1_local"], big[:, tp * 4 : tp * 4 + 4])
        assert same(res["dtensor_matmul"], a @ b)
        assert same(res["dtensor_matmul_partial"], w @ v)


@pytest.mark.parametrize(
    "key", ["dtensor_local", "dtensor_replicated", "dtensor_matmul", "dtensor_matmul_partial", "tp"]
)
def test_equals_gloo_bit_for_bit(runs: dict[str, list[dict[str, Any]]], key: str) -> None:
    for r in range(N):
        assert same(runs["hpcdist"][r][key], runs["gloo"][r][key]), f"rank {r} {key}"
