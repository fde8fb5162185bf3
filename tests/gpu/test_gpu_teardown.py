"""destroy_process_group with NCCL work still queued on the GPU: it finishes, in order, and nothing hangs.

Runs in a fresh process (one rank, its own process group), since tests/gpu's
other modules hold the default group for the whole session.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from gpu_arrays import gpu_missing

pytestmark = pytest.mark.timeout(180)

pytest.importorskip("cupy", reason="the GPU tests need CuPy (pip install 'hpcdist[gpu]')")
_why = gpu_missing()
if _why is not None:
    pytest.skip(_why, allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = textwrap.dedent(
    """
    import cupy as cp
    import hpcdist as dist

    dist.init_process_group("nccl")
    x = cp.full(8 << 20, 1.0, dtype=cp.float64)  # 64 MiB
    works = [dist.all_reduce(x, op=dist._make_nccl_premul_sum(2.0), async_op=True) for _ in range(40)]
    dist.destroy_process_group()  # 40 reductions may still be queued
    cp.cuda.Device().synchronize()
    assert not dist.is_initialized()
    got = cp.asnumpy(x[[0, -1]]).tolist()
    assert got == [2.0**40, 2.0**40], got
    print("ok", len(works))
    """
)


def test_destroy_with_queued_nccl_work_completes_it(tmp_path):
    from hpcdist.backends import is_backend_available

    if not is_backend_available("nccl"):
        pytest.skip("NCCL is not available through CuPy")
    script = tmp_path / "teardown.py"
    script.write_text(SCRIPT)
    launcher = ("PMI_", "PMIX_", "OMPI_", "SLURM_", "HYDRA_")  # a singleton of its own, not a rank of this job
    env = {k: v for k, v in os.environ.items() if not k.startswith(launcher)}
    env["PYTHONPATH"] = str(ROOT)
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=150, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.split() == ["ok", "40"]
