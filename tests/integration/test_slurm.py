"""The Slurm CPU template for real, on a one-node Slurm cluster on this host.

`scripts/slurm-up` installs (apt: slurmctld, slurmd, slurm-client, munge) and
starts the cluster, or reuses a running one. Where that is impossible (not
root, no apt, daemons that do not start) the tests skip with the reason — but
in CI (CI=true, as root) they fail instead, so the template is really run there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "jobs" / "slurm_cpu.sbatch"
TERMINAL = {
    "COMPLETED",
    "FAILED",
    "CANCELLED",
    "TIMEOUT",
    "NODE_FAIL",
    "OUT_OF_MEMORY",
    "PREEMPTED",
    "BOOT_FAIL",
    "DEADLINE",
}

pytestmark = pytest.mark.slurm


def _must_run() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes") and os.geteuid() == 0


@pytest.fixture(scope="module")
def slurm():
    """A running one-node cluster (started by scripts/slurm-up)."""
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [str(ROOT / "scripts" / "slurm-up")], capture_output=True, text=True, timeout=420, stdin=subprocess.DEVNULL
        )
        reason = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[-1:] if proc.returncode else None
    except subprocess.TimeoutExpired:
        reason = ["scripts/slurm-up took longer than 420 s"]
    if reason:
        msg = f"no Slurm cluster: {reason[0] if reason else 'scripts/slurm-up failed'}"
        if _must_run():
            pytest.fail(msg + " (CI as root must run the Slurm tests)")
        pytest.skip(msg)
    print(f"slurm-up: {proc.stdout.strip()} ({time.monotonic() - t0:.1f} s)")
    return shutil.which("sbatch") or "/usr/bin/sbatch"


def _job_state(job: str) -> tuple[str, str]:
    out = subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=30).stdout
    state = re.search(r"JobState=(\S+)", out)
    code = re.search(r"ExitCode=(\S+)", out)
    return (state.group(1) if state else "UNKNOWN", code.group(1) if code else "?")


def submit_and_wait(
    sbatch: str, tmp_path: Path, args: list[str], limit: float = 240, template: Path = TEMPLATE
) -> tuple[str, str, str]:
    """Submit the CPU template (or ``template``) for 2 tasks on 1 node; return (state, exit code, output)."""
    out = tmp_path / "job-%j.out"
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    env.pop("SLURM_JOB_ID", None)
    cmd = [sbatch, "--parsable", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2", f"--output={out}", "--time=00:05:00"]
    proc = subprocess.run([*cmd, str(template), *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, f"sbatch failed: {proc.stderr}"
    job = proc.stdout.strip().split(";")[0]
    deadline = time.monotonic() + limit
    state, code = "PENDING", "?"
    while time.monotonic() < deadline:
        state, code = _job_state(job)
        if state in TERMINAL:
            break
        time.sleep(1)
    else:
        subprocess.run(["scancel", job], timeout=30)
        pytest.fail(f"job {job} still {state} after {limit} s; cancelled")
    text = Path(str(out).replace("%j", job)).read_text()
    return state, code, text


@pytest.mark.timeout(600)
def test_cpu_template_runs_demo_on_two_ranks(slurm, tmp_path):
    plot = tmp_path / "demo.png"
    state, code, text = submit_and_wait(
        slurm, tmp_path, ["examples/train_demo.py", "--epochs", "4", "--plot", str(plot)]
    )
    assert state == "COMPLETED" and code == "0:0", text
    assert "srun --mpi=pmi2" in text
    assert "hpcdist demo: 2 ranks" in text  # srun --mpi=pmi2 made one MPI world of size 2
    assert "parameters identical on all 2 ranks: yes" in text
    assert re.search(r"final loss \d+\.\d+\s+test accuracy 0\.\d+", text)
    assert plot.stat().st_size > 1000


@pytest.mark.timeout(600)
def test_cpu_template_failing_rank_fails_job(slurm, tmp_path):
    script = tmp_path / "boom.py"
    script.write_text(
        "import hpcdist as dist\n"
        "dist.init_process_group('mpi')\n"
        "if dist.get_rank() == 1:\n"
        "    raise RuntimeError('rank 1 fails under srun')\n"
        "dist.barrier()\n"
    )
    state, _code, text = submit_and_wait(slurm, tmp_path, [str(script)])
    assert state == "FAILED", text
    assert text.count("[rank 1] RuntimeError: rank 1 fails under srun") == 1, text


@pytest.mark.timeout(600)
def test_hpcdist_run_in_an_allocation_names_a_rank_killed_by_a_signal(slurm, tmp_path):
    """`hpcdist run` inside an allocation launches with srun. The ranks may be on other nodes, so their failure
    records go to the working directory (on a cluster, a file system every node sees) instead of the launching
    node's /tmp: a rank killed by SIGKILL (its warden saw it) is named, the other rank (ended by srun's SIGTERM)
    is not, and the records' directory is gone afterwards."""
    (tmp_path / "die.py").write_text(
        "import os, signal\n"
        "import numpy as np\n"
        "import hpcdist as dist\n"
        "dist.init_process_group('mpi')\n"
        "dist.barrier()\n"
        "if dist.get_rank() == 1:\n"
        "    os.kill(os.getpid(), signal.SIGKILL)\n"
        "dist.all_reduce(np.ones(4))\n"
    )
    batch = tmp_path / "run.sbatch"
    batch.write_text('#!/bin/bash\ncd "$1"\nHPCDIST_TIMEOUT=60 exec "$PYTHON" -m hpcdist run -n 2 die.py\n')
    state, _code, text = submit_and_wait(slurm, tmp_path, [str(tmp_path)], template=batch)
    assert state == "FAILED", text
    lines = [ln for ln in text.splitlines() if ln.startswith("hpcdist run: rank")]
    assert len(lines) == 1 and lines[0].startswith("hpcdist run: rank 1 failed: killed by SIGKILL"), text
    assert not list(tmp_path.glob(".hpcdist-run-*")), "the records' directory was left behind"


@pytest.mark.timeout(60)
def test_template_outside_slurm_refuses():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(["bash", str(TEMPLATE)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2
    assert "submit it with: sbatch" in proc.stderr
