"""Each example at 2 ranks under the embedded mpiexec, with a time limit, checking its output."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hpcdist.launch.launchers import find_mpiexec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def run_example(name: str, *args: str, cwd: Path, timeout: int = 150) -> subprocess.CompletedProcess:
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec found")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    cmd = [mpiexec, "-n", "2", sys.executable, str(EXAMPLES / name), *args]
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, f"{name} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}"
    return proc


@pytest.mark.timeout(180)
def test_train_demo(tmp_path):
    proc = run_example("train_demo.py", "--epochs", "5", cwd=tmp_path)
    assert "hpcdist demo: 2 ranks" in proc.stdout
    m = re.search(r"final loss (\d+\.\d+)\s+test accuracy (\d\.\d+)", proc.stdout)
    assert m and float(m.group(1)) < 0.6 and float(m.group(2)) > 0.8, proc.stdout
    assert "parameters identical on all 2 ranks: yes" in proc.stdout
    assert (tmp_path / "demo_loss.png").read_bytes()[:4] == b"\x89PNG"  # default --plot, in the cwd
    assert "training" in proc.stderr  # the tqdm bar, rank 0 only


@pytest.mark.timeout(180)
def test_torch_training(tmp_path):
    proc = run_example("torch_training.py", cwd=tmp_path)
    if importlib.util.find_spec("torch") is None:
        assert "skipped, PyTorch is not installed" in proc.stdout
        return
    mses = [float(x) for x in re.findall(r"mse (\d+\.\d+)", proc.stdout)]
    assert len(mses) == 10 and mses[-1] < mses[0], proc.stdout
    assert "model identical on all 2 ranks: yes" in proc.stdout


@pytest.mark.timeout(120)
def test_subgroups(tmp_path):
    out = run_example("subgroups.py", cwd=tmp_path).stdout
    assert "rank 0: sum over even ranks [0] = 0" in out
    assert "rank 1: not in the even group [0]" in out
    assert out.count("pair [0, 1] got 100 from rank 0") == 2


@pytest.mark.timeout(120)
def test_object_collectives(tmp_path):
    out = run_example("object_collectives.py", cwd=tmp_path).stdout
    assert "all_gather_object: [0, 1]" in out
    assert out.count("broadcast_object_list -> demo lr=0.1") == 2
    assert "gather_object: ['task-0 done by rank 0', 'task-1 done by rank 1']" in out


@pytest.mark.timeout(120)
def test_gpu_allreduce_skips_or_runs(tmp_path):
    out = run_example("gpu_allreduce.py", cwd=tmp_path).stdout
    assert "gpu_allreduce.py: skipped" in out or out.count("all_reduce ok") == 2, out
