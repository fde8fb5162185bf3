"""DistributedDataParallel over backend "hpcdist" at 2 ranks equals the same program on gloo, bit for bit.

One launch per backend trains every mode (progs/ddp.py): plain, no_sync,
find_unused_parameters, static_graph, allreduce_hook, fp16_compress_hook,
PowerSGD, and a DistributedSampler loop. At 2 ranks every sum has two
operands, so any reduction order gives the same bits: the parameters must be
identical to gloo's, and identical across ranks. The same program under
torchrun (no MPI launcher: the ranks join over MPI ports) ends identically.
"""

from __future__ import annotations

from typing import Any

import pytest
from conftest import launch_both, load, same, torchrun

N = 2
MODES = [
    "plain",
    "no_sync",
    "find_unused",
    "static_graph",
    "allreduce_hook",
    "fp16_compress_hook",
    "powersgd",
    "sampler",
]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    out = launch_both(N, "ddp.py", tmp_path_factory)
    d = tmp_path_factory.mktemp("torchrun")
    torchrun(N, "ddp.py", "hpcdist", d)
    out["torchrun"] = [load(d, "ddp", r) for r in range(N)]
    return out


@pytest.mark.parametrize("mode", MODES)
def test_parameters_equal_gloo(runs: dict[str, list[dict[str, Any]]], mode: str) -> None:
    for r in range(N):
        ours, theirs = runs["hpcdist"][r][mode], runs["gloo"][r][mode]
        diff = {k: float((ours[k] - theirs[k]).abs().max()) for k in ours if not same(ours[k], theirs[k])}
        assert not diff, f"rank {r}, {mode}: parameters differ from gloo's (max abs diff per tensor {diff})"


def test_torchrun_equals_mpiexec(runs: dict[str, list[dict[str, Any]]]) -> None:
    for r in range(N):
        assert same(runs["torchrun"][r], runs["hpcdist"][r]), f"rank {r}"


@pytest.mark.parametrize("mode", MODES)
def test_ranks_agree(runs: dict[str, list[dict[str, Any]]], mode: str) -> None:
    assert same(runs["hpcdist"][0][mode], runs["hpcdist"][1][mode])


def test_training_moved_the_parameters(runs: dict[str, list[dict[str, Any]]]) -> None:
    """Guard against a vacuous pass: modes that train the same model differently end differently."""
    res = runs["hpcdist"][0]
    assert not same(res["plain"], res["no_sync"])
    assert not same(res["plain"], res["powersgd"])


def test_sampler_gave_each_rank_its_own_shard(runs: dict[str, list[dict[str, Any]]]) -> None:
    a, b = runs["hpcdist"][0]["sampler_seen"], runs["hpcdist"][1]["sampler_seen"]
    assert a.numel() == b.numel() == 96  # 2 epochs x 48 samples per rank
    assert not set(a[:48].tolist()) & set(b[:48].tolist())
