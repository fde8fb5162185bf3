"""Backend "hpcdist" without an MPI launcher: the PyTorch tutorial's programs and torchrun.

progs/tutorial.py is the tutorial "Writing Distributed Applications with
PyTorch" (multiprocessing, MASTER_ADDR/MASTER_PORT, the backend name as an
argument): run with init_method env:// (the tutorial's), tcp:// and file://,
its results (point-to-point, a group all_reduce, synchronous SGD) must equal
the same program on gloo bit for bit. The spawned processes never import
hpcdist: torch's ``torch.backends`` entry point registers the backend.
(torchrun: tests/torch/test_ddp.py.)
"""

from __future__ import annotations

import os
import sys
from importlib.metadata import entry_points
from pathlib import Path

import pytest
from conftest import PROGS, ROOT, free_port, load, run_limited, same

pytestmark = pytest.mark.skipif(
    not any(ep.name == "hpcdist" for ep in entry_points(group="torch.backends")),
    reason="hpcdist's torch.backends entry point is not installed: reinstall hpcdist (pip install -e .)",
)


def _env() -> dict[str, str]:
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HPCDIST_TIMEOUT="120")
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(PROGS)])
    return env


def _tutorial(backend: str, init: str, out: Path) -> list[dict]:
    out.mkdir()
    env = dict(_env(), MASTER_PORT=str(free_port()))
    res = run_limited([sys.executable, str(PROGS / "tutorial.py"), backend, str(out), init], env, 180)
    assert not res.timed_out and res.returncode == 0, res.output[-3000:]
    return [load(out, "tutorial", r) for r in range(2)]


@pytest.fixture(scope="module")
def gloo(tmp_path_factory: pytest.TempPathFactory) -> list[dict]:
    return _tutorial("gloo", "env", tmp_path_factory.mktemp("t") / "gloo")


@pytest.mark.parametrize("init", ["env", "tcp", "file"])
def test_tutorial_equals_gloo(gloo: list[dict], init: str, tmp_path: Path) -> None:
    ours = _tutorial("hpcdist", init, tmp_path / init)
    for r in range(2):
        assert ours[r].keys() == {"blocking", "nonblocking", "all_reduce", "sgd"}
        for k in ours[r]:
            assert same(ours[r][k], gloo[r][k]), f"rank {r} {k} (init {init})"
    assert float(ours[1]["blocking"][0]) == 1.0 and float(ours[0]["all_reduce"][0]) == 2.0
