"""jobs/slurm_requeue.sbatch for real on the one-node Slurm cluster: USR1 mid-run, save, requeue, resume.

The job runs examples/checkpoint_resume.py on 2 ranks; once its first periodic
checkpoint exists the test sends the warning signal to the batch shell
(``scancel --signal=USR1 --batch``, what ``--signal=B:USR1@120`` does before
the time limit). The job must save, requeue itself, start again, resume from
its checkpoint and finish with the same parameters, bit for bit, as an
uninterrupted run of the same program under mpiexec.

Slurm holds a requeued job back for about two minutes (its BeginTime); the
test moves that to now (``scontrol update StartTime=now``) to stay short, but
only some seconds after the requeue: slurmd revokes the first run's credential
with a timestamp in whole seconds, and a second run launched within that same
second is refused ("Job credential revoked") and ends the job FAILED.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from mpirun import mpiexec
from test_slurm import TERMINAL, _job_state, slurm  # noqa: F401  (slurm: the cluster fixture)

ROOT = Path(__file__).resolve().parents[2]
TEMPLATE = ROOT / "jobs" / "slurm_requeue.sbatch"
pytestmark = pytest.mark.slurm
# seconds between seeing the requeue and starting the next run: past the revoked credential's second
REVOKE_GRACE_S = 3.0
pytest.importorskip("h5py")


def _show(job: str) -> str:
    return subprocess.run(["scontrol", "show", "job", "-o", job], capture_output=True, text=True, timeout=30).stdout


@pytest.mark.timeout(600)
def test_requeue_template_saves_requeues_and_resumes(slurm, tmp_path):  # noqa: F811
    ck = tmp_path / "ck"
    args = ["--steps", "80", "--every", "10"]
    env = {**os.environ, "PYTHON": sys.executable, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    env.pop("SLURM_JOB_ID", None)
    out = tmp_path / "job-%j.out"
    cmd = [slurm, "--parsable", "--nodes=1", "--ntasks=2", "--ntasks-per-node=2", f"--output={out}", "--time=00:05:00"]
    example = ["examples/checkpoint_resume.py", "--ckpt-dir", str(ck), *args, "--sleep", "0.1"]
    proc = subprocess.run(
        [*cmd, str(TEMPLATE), *example, "--out", str(tmp_path / "final.npy")],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, f"sbatch failed: {proc.stderr}"
    job = proc.stdout.strip().split(";")[0]
    log = Path(str(out).replace("%j", job))
    try:
        deadline = time.monotonic() + 180
        while not (ck / "step_000010").exists():  # running, mid-way
            assert time.monotonic() < deadline, f"job {job} made no checkpoint: {_show(job)}"
            assert _job_state(job)[0] not in TERMINAL, log.read_text() if log.exists() else _show(job)
            time.sleep(0.2)
        sig = subprocess.run(["scancel", "--signal=USR1", "--batch", job], capture_output=True, text=True, timeout=30)
        assert sig.returncode == 0, sig.stderr
        deadline = time.monotonic() + 300
        hurried = False
        requeued_at = None
        while True:
            info = _show(job)
            state = re.search(r"JobState=(\S+)", info)
            if state and state.group(1) in TERMINAL:
                break
            if requeued_at is None and "Restarts=1" in info and "Reason=BeginTime" in info:
                requeued_at = time.monotonic()
            if not hurried and requeued_at is not None and time.monotonic() - requeued_at > REVOKE_GRACE_S:
                subprocess.run(["scontrol", "update", f"JobId={job}", "StartTime=now"], timeout=30)
                hurried = True
            assert time.monotonic() < deadline, f"job {job} did not finish: {info}"
            time.sleep(0.5)
    finally:
        if _job_state(job)[0] not in TERMINAL:
            subprocess.run(["scancel", job], timeout=30)
    text = log.read_text()
    state, code = _job_state(job)
    assert state == "COMPLETED" and code == "0:0", text
    assert "Restarts=1" in _show(job), _show(job)
    m = re.search(r"preempted at step (\d+): saved step_(\d+), requeueing", text)
    assert m and m.group(1).lstrip("0") == m.group(2).lstrip("0"), text
    stopped = int(m.group(1))
    assert 10 <= stopped < 80 and "requeued" in text
    assert f"job {job} run 2:" in text and f"resumed from step_{stopped:06d} at step {stopped} (restart 1)" in text
    assert "done: 80 steps on 2 ranks" in text

    ref_env = {k: v for k, v in env.items() if not k.startswith("SLURM_")}
    launch = [mpiexec(), "-n", "2", sys.executable, str(ROOT / "examples" / "checkpoint_resume.py")]
    ref = subprocess.run(
        [*launch, "--ckpt-dir", str(tmp_path / "ref"), *args, "--out", str(tmp_path / "ref.npy")],
        env=ref_env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert ref.returncode == 0, ref.stdout + ref.stderr
    assert np.array_equal(np.load(tmp_path / "final.npy"), np.load(tmp_path / "ref.npy"))


@pytest.mark.timeout(60)
def test_requeue_template_outside_slurm_refuses():
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    proc = subprocess.run(["bash", str(TEMPLATE)], env=env, capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "submit it with: sbatch" in proc.stderr
