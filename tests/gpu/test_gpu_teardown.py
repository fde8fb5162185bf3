"""destroy_process_group with NCCL work still queued on the GPU: it finishes, in order, and nothing hangs.

Runs in a fresh process (one rank, its own process group), since tests/gpu's
other modules hold the default group for the whole session.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from gpu_arrays import gpu_missing

import hpcdist as dist

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


def test_destroy_with_queued_nccl_work_completes_it(tmp_path, request):
    from hpcdist.backends import is_backend_available

    if not is_backend_available("nccl"):
        pytest.skip("NCCL is not available through CuPy")
    if request.node.callspec.params.get("gpu_path") != "staged":
        pytest.skip("runs once per job, in the staged pass (the child makes its own NCCL group)")
    if dist.get_world_size() != 1:
        # seen on the H100 test machine: under `mpiexec -n 2` the child (launcher variables removed) failed
        # with NCCL_ERROR_INVALID_USAGE or hung in its singleton MPI init; cause not established
        pytest.skip("runs in a one-rank job only: a singleton MPI child of a multi-rank MPICH job is unreliable")
    script = tmp_path / "teardown.py"
    script.write_text(SCRIPT)
    # a singleton of its own, not a rank of this job: no launcher variables
    launcher = ("PMI_", "PMIX_", "OMPI_", "SLURM_", "HYDRA_", "MPI_LOCAL")
    env = {k: v for k, v in os.environ.items() if not k.startswith(launcher)}
    env["PYTHONPATH"] = str(ROOT)
    child = subprocess.Popen(
        [sys.executable, str(script)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,  # its MPI helpers too can be killed as one group
    )
    try:
        out, _ = child.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        out, _ = child.communicate()
        pytest.fail(f"the one-rank NCCL job did not end within 120 s; its output: {out!r}")
    assert child.returncode == 0, out
    assert out.split() == ["ok", "40"]
