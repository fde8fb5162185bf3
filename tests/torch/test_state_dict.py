"""progs/state_dict.py at 3 ranks with backend "hpcdist" and with torch's gloo (the reference): see its docstring.

torch gives a Python process group no per-device backends, so before the
group answered ``_device_types`` itself, ``set_model_state_dict(...,
broadcast_from_rank0=True)`` raised ``IndexError`` and ``dcp.async_save``
refused the group ("A CPU backend must be enabled").
"""

from __future__ import annotations

from typing import Any

import pytest
import torch
from conftest import launch_both, same

N = 3


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    return launch_both(N, "state_dict.py", tmp_path_factory, args=lambda d: [str(d / "ckpt")])


def formula(values: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The values rank 0 held (progs/state_dict.py's formula, in sorted name order)."""
    return {
        k: torch.arange(v.numel(), dtype=torch.float32).reshape(v.shape) / (i + 3) + i
        for i, (k, v) in enumerate(sorted(values.items()))
    }


def test_device_types_and_object_device_match_gloo(runs):
    for r in range(N):
        assert runs["hpcdist"][r]["device_types"] == runs["gloo"][r]["device_types"] == ["cpu", "cuda"]
        assert runs["hpcdist"][r]["object_device"] == runs["gloo"][r]["object_device"] == "cpu"


@pytest.mark.parametrize("step", ["broadcast", "async_saved"])
def test_every_rank_ends_with_rank_0s_values(runs, step):
    """broadcast: set_model_state_dict(broadcast_from_rank0); async_saved: dcp.async_save, then dcp.load."""
    want = formula(runs["gloo"][0][step])
    for backend in ("hpcdist", "gloo"):
        for r in range(N):
            got = runs[backend][r][step]
            assert sorted(got) == sorted(want), (backend, r)
            for k in want:
                assert same(got[k], want[k]), (backend, r, step, k)


def test_a_device_map_gives_torch_the_other_backend_for_its_device(runs):
    types, cpu_backend, cuda_is_group, unserved = runs["hpcdist"][0]["routed"]
    assert types == ["cpu", "cuda"]
    assert cpu_backend == "ProcessGroupGloo"
    assert cuda_is_group is True
    assert "xpu" in unserved and "cpu, cuda" in unserved


def test_all_reduces_beside_an_async_save_on_another_group(runs):
    want = torch.stack([torch.full((1000,), float(sum(r + i for r in range(N)))) for i in range(20)])
    for backend in ("hpcdist", "gloo"):
        for r in range(N):
            assert same(runs[backend][r]["sums_during_save"], want), (backend, r)
