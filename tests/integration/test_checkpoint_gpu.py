"""hpcdist.checkpoint with device arrays: torch CUDA tensors and CuPy arrays saved, loaded in place
(on the device), async-saved, and loaded across devices (CUDA -> NumPy), at 2 ranks under mpiexec (an integration test: tests/gpu runs under mpiexec with its own fixtures).

Skips without a CUDA device (torch or CuPy). The references are host copies taken before the save.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from mpirun import run_within

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import sys
from pathlib import Path
import numpy as np
import hpcdist as dist
from hpcdist import checkpoint as ck

dist.init_process_group("mpi")
r, n = dist.get_rank(), dist.get_world_size()
path = Path(sys.argv[1])
try:
    import torch
    has_torch = torch.cuda.is_available()
except ImportError:
    has_torch = False
try:
    import cupy
    cupy.cuda.runtime.getDeviceCount()
    has_cupy = True
except Exception:
    has_cupy = False

state, want = {}, {}
sh = ck.Shard.even((9, 4), 0, r, n)
glob = np.arange(36, dtype=np.float32).reshape(9, 4)
if has_torch:
    dev = torch.device("cuda", r % torch.cuda.device_count())
    torch.cuda.set_device(dev)
    g = torch.Generator().manual_seed(7)
    w = torch.randn(5, 3, generator=g)
    state["t"] = {"w": w.to(dev), "bf": w.to(torch.bfloat16).to(dev),
                  "shard": ck.Sharded(torch.from_numpy(glob[sh.slices()].copy()).to(dev), sh)}
    want["t"] = {"w": w, "bf": w.to(torch.bfloat16)}
if has_cupy:
    c = np.linspace(0, 1, 6).astype(np.float16)
    state["c"] = {"x": cupy.asarray(c), "shard": ck.Sharded(cupy.asarray(glob[sh.slices()]), sh)}
    want["c"] = c
ck.save(state, path / "sync")
ck.async_save(state, path / "async").wait()
for name in ("sync", "async"):
    if has_torch:
        tgt = {"w": torch.zeros(5, 3, device=dev), "bf": torch.zeros(5, 3, dtype=torch.bfloat16, device=dev),
               "shard": ck.Sharded(torch.zeros(sh.sizes, device=dev), sh)}
        ck.load({"t": tgt}, path / name, strict=False)
        assert tgt["w"].is_cuda and torch.equal(tgt["w"].cpu(), want["t"]["w"])
        assert torch.equal(tgt["bf"].cpu(), want["t"]["bf"])
        assert np.array_equal(tgt["shard"].local.cpu().numpy(), glob[sh.slices()])
        whole = np.zeros((9, 4), np.float32)
        ck.load({"t": {"shard": whole}}, path / name, strict=False)  # saved from CUDA, loaded into NumPy
        assert np.array_equal(whole, glob)
    if has_cupy:
        x = cupy.zeros(6, cupy.float16)
        ck.load({"c": {"x": x}}, path / name, strict=False)
        assert np.array_equal(cupy.asnumpy(x), want["c"])
print(f"rank {r} ok torch={has_torch} cupy={has_cupy}", flush=True)
dist.destroy_process_group()
"""


def _cuda() -> bool:
    try:
        import torch

        if torch.cuda.is_available():
            return True
    except ImportError:
        pass
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


@pytest.mark.timeout(300)
def test_checkpoint_device_arrays(tmp_path):
    pytest.importorskip("h5py")
    if not _cuda():
        pytest.skip("no CUDA device (torch.cuda or CuPy)")
    script = tmp_path / "ck_gpu.py"
    script.write_text(SCRIPT)
    mpiexec = Path(sys.executable).parent / "mpiexec"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = run_within(
        [str(mpiexec) if mpiexec.exists() else "mpiexec", "-n", "2", sys.executable, str(script), str(tmp_path)],
        env,
        240,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "rank 0 ok" in proc.stdout and "rank 1 ok" in proc.stdout
