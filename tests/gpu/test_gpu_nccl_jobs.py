"""NCCL in one-rank jobs of their own: teardown with work queued, and the watchdog.

* destroy_process_group with NCCL work still queued on the GPU: it finishes,
  in order, and nothing hangs;
* NCCL work stuck past its group's timeout while the host waits: the watchdog
  ends the job, naming the operation; with HPCDIST_NCCL_WATCHDOG=0 the host
  just waits.

Each runs a fresh process (one rank, its own process group), since tests/gpu's
other modules hold the default group for the whole session. Under a multi-rank
test job every rank starts its own child at once, without the launcher's and
torchrun's variables: children that inherited them joined each other as one
world on one GPU (seen on the H100 on 2026-11-22; at 2 and 3 ranks they run
apart since 2026-11-27, docs/gpu.md).
"""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import pytest
from gpu_arrays import _load, gpu_missing

from hpcdist._launchenv import TORCHRUN_VARS

pytestmark = pytest.mark.timeout(180)

pytest.importorskip("cupy", reason="the GPU tests need CuPy (pip install 'hpcdist[gpu]')")
_why = gpu_missing()
if _why is not None:
    pytest.skip(_why, allow_module_level=True)

ROOT = Path(__file__).resolve().parents[2]
MPIRUN = _load("hpcdist_test_mpirun", ROOT / "tests" / "integration" / "mpirun.py")

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


HANG = textwrap.dedent(
    """
    import cupy as cp
    from datetime import timedelta
    import hpcdist as dist
    from gpu_arrays import spin

    dist.init_process_group("nccl", timeout=timedelta(seconds=2))
    x = cp.ones(4, dtype=cp.float32)
    dist.all_reduce(x)  # the communicator exists; this one completes
    cp.cuda.get_current_stream().synchronize()
    spin(60.0)  # about a minute of GPU time, on the same stream
    dist.all_reduce(x)  # enqueued behind the spin: returns at once, cannot complete for a minute
    print("enqueued", flush=True)
    x.get()  # blocks the host: only the watchdog can end this
    print("the watchdog did not fire", flush=True)
    """
)


def _one_child_per_job(request) -> None:
    from hpcdist.backends import is_backend_available

    if not is_backend_available("nccl"):
        pytest.skip("NCCL is not available through CuPy")
    if request.node.callspec.params.get("gpu_path") != "staged":
        pytest.skip("runs once per job, in the staged pass (the child makes its own NCCL group)")


def _run_child(tmp_path, source: str, limit: float = 120.0, **env_extra: str) -> tuple[int, str]:
    """Run ``source`` as a one-rank job of its own; (exit code, output). Killed with its helpers at ``limit``."""
    script = tmp_path / "child.py"
    script.write_text(source)
    # a singleton of its own, not a rank of this job: no launcher variables
    launcher = ("PMI_", "PMIX_", "OMPI_", "SLURM_", "HYDRA_", "MPI_LOCAL", "TORCHELASTIC_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(launcher) and k not in TORCHRUN_VARS}
    env.update(PYTHONPATH=os.pathsep.join([str(ROOT), str(ROOT / "tests" / "gpu")]), **env_extra)
    res = MPIRUN.run_limited([sys.executable, str(script)], env, limit)
    if res.timed_out:
        pytest.fail(f"the one-rank NCCL job did not end within {limit:g} s; its output: {res.output!r}")
    return res.returncode, res.output


def test_destroy_with_queued_nccl_work_completes_it(tmp_path, request):
    _one_child_per_job(request)
    code, out = _run_child(tmp_path, SCRIPT)
    assert code == 0, out
    assert out.split() == ["ok", "40"]


def test_nccl_work_stuck_past_the_timeout_ends_the_job_with_its_name(tmp_path, request):
    _one_child_per_job(request)
    code, out = _run_child(tmp_path, HANG)
    assert "enqueued" in out, out
    assert "the watchdog did not fire" not in out, out
    assert "DistTimeoutError: all_reduce on" in out and "(NCCL) did not complete on the GPU within 2s" in out, out
    assert code != 0, out


def test_nccl_watchdog_off_lets_the_host_wait(tmp_path, request):
    _one_child_per_job(request)
    short = HANG.replace("spin(60.0)", "spin(3.0)")  # a few seconds of spin, past the 2 s timeout
    code, out = _run_child(tmp_path, short, HPCDIST_NCCL_WATCHDOG="0")
    assert code == 0 and "the watchdog did not fire" in out, out
