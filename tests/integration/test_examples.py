"""Each example under the embedded mpiexec, with a time limit, checking its output against known answers.

Most run at 2 ranks; the ring all-reduce also at 3 (an odd ring). The
tutorial programs print with several ``print`` arguments, so they run with
block-buffered output (one write per rank at exit) to keep ranks' lines whole.
"""

from __future__ import annotations

import importlib.util
import itertools
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from mpirun import run_limited

from hpcdist.launch.launchers import find_mpiexec

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
HAS_TORCH = importlib.util.find_spec("torch") is not None
needs_torch = pytest.mark.skipif(not HAS_TORCH, reason="PyTorch is not installed")


def run_example(
    name: str, *args: str, cwd: Path, n: int = 2, timeout: int = 150, unbuffered: bool = False
) -> subprocess.CompletedProcess:
    """Run ``examples/name`` on ``n`` ranks; kill the whole launch after ``timeout`` s; require exit 0.

    Output is block-buffered by default: each rank then writes its lines in one piece at exit, so lines of
    different ranks cannot interleave (under PYTHONUNBUFFERED each print is several writes).
    """
    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec found")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("PYTHONUNBUFFERED", None)
    if unbuffered:
        env["PYTHONUNBUFFERED"] = "1"
    cmd = [mpiexec, "-n", str(n), sys.executable, str(EXAMPLES / name), *args]
    res = run_limited(cmd, env, timeout, cwd)
    out, err = res.stdout, res.stderr
    if res.timed_out:
        pytest.fail(f"{name} on {n} ranks ran past {timeout}s\n{out}\n{err}")
    assert res.returncode == 0, f"{name} exited {res.returncode}\n{out}\n{err}"
    return subprocess.CompletedProcess(cmd, res.returncode, out, err)


def lines(out: str) -> list[str]:
    return sorted(ln.rstrip() for ln in out.splitlines() if ln.strip())


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


@pytest.mark.timeout(120)
def test_gpu_benchmarks_skip_or_print_their_tables(tmp_path):
    """docs/gpu.md's tables come from these scripts: without a GPU they say why and exit 0, with one they print."""
    out = run_example("benchmarks/bench_gpu.py", "--max-mib", "1", "--repeats", "1", cwd=tmp_path).stdout
    if "bench_gpu: skipped" not in out:
        rows = [ln for ln in out.splitlines() if ln.strip()[:1].isdigit()]
        assert [int(r.split("|")[0]) for r in rows] == [4**k for k in range(1, 11)], out
    out = run_example("benchmarks/profile_gpu_path.py", "--iters", "20", cwd=tmp_path, n=1).stdout
    if "profile_gpu_path: skipped" not in out:
        assert "| staged mpi |" in out and "## cProfile, staged mpi" in out, out


# ---------------------------------------------------------------- PyTorch tutorial programs


@needs_torch
@pytest.mark.timeout(120)
def test_tutorial_p2p_blocking(tmp_path):
    out = run_example("tutorial_p2p_blocking.py", cwd=tmp_path, unbuffered=False).stdout
    assert lines(out) == ["Rank  0  has data  tensor(1.)", "Rank  1  has data  tensor(1.)"], out


@needs_torch
@pytest.mark.timeout(120)
def test_tutorial_p2p_blocking_refuses_other_sizes(tmp_path):
    out = run_example("tutorial_p2p_blocking.py", cwd=tmp_path, n=3, unbuffered=False).stdout
    assert lines(out) == ["this tutorial program needs exactly 2 processes, got 3: mpiexec -n 2 python ..."], out


@needs_torch
@pytest.mark.timeout(120)
def test_tutorial_p2p_nonblocking(tmp_path):
    out = run_example("tutorial_p2p_nonblocking.py", cwd=tmp_path, unbuffered=False).stdout
    assert lines(out) == [
        "Rank  0  has data  tensor(1.)",
        "Rank  1  has data  tensor(1.)",
        "Rank 0 started sending",
        "Rank 1 started receiving",
    ], out


@needs_torch
@pytest.mark.timeout(120)
def test_tutorial_group_allreduce(tmp_path):
    out = run_example("tutorial_group_allreduce.py", cwd=tmp_path, unbuffered=False).stdout
    assert lines(out) == ["Rank  0  has data  tensor(2.)", "Rank  1  has data  tensor(2.)"], out


@needs_torch
@pytest.mark.timeout(120)
@pytest.mark.parametrize("n", [2, 3])
def test_ring_allreduce(tmp_path, n):
    out = run_example("ring_allreduce.py", cwd=tmp_path, n=n, unbuffered=False).stdout
    # rank r sends arange(5) + 10 r: the sum is n * k + 10 * n (n - 1) / 2
    total = [float(n * k + 10 * n * (n - 1) // 2) for k in range(5)]
    expected = [f"Rank {r} of {n}: ring allreduce {total}, equal to dist.all_reduce: True" for r in range(n)]
    assert lines(out) == expected, out


@pytest.mark.timeout(180)
def test_sgd_distributed(tmp_path):
    out = run_example("sgd_distributed.py", cwd=tmp_path, unbuffered=False).stdout
    if not HAS_TORCH:
        assert "sgd_distributed.py: skipped, PyTorch is not installed" in out
        return
    losses: dict[int, list[float]] = {0: [], 1: []}
    for rank, epoch, loss in re.findall(r"^Rank  (\d) , epoch  (\d+) :  (\S+)$", out, re.MULTILINE):
        assert int(epoch) == len(losses[int(rank)]), out
        losses[int(rank)].append(float(loss))
    for rank, curve in losses.items():
        assert len(curve) == 10, (rank, out)
        assert abs(curve[0] - math.log(4)) < 0.3, (rank, out)  # 4 classes: starts near chance, ln 4
        assert curve[-1] < 0.45 and all(b < a for a, b in itertools.pairwise(curve)), (rank, out)
    assert "parameters identical on all 2 ranks: yes" in out
    m = re.search(r"accuracy on the whole data set: (\d\.\d+)", out)
    assert m and float(m.group(1)) > 0.85, out


@pytest.mark.timeout(180)
@pytest.mark.parametrize("n", [2, 3])
def test_symmetric_buckets(tmp_path, n):
    """The example asserts the parameters agree across ranks and runs and that the loss fell; here: it said so."""
    out = run_example("symmetric_buckets.py", "--steps", "30", "--features", "256", cwd=tmp_path, n=n).stdout
    assert "every rank holds the same parameters; both runs agree" in out, out
    start, end = map(float, re.search(r"loss (\S+) -> (\S+)$", out, re.MULTILINE).groups())
    assert end < start / 2, out
    assert "symmetric bucket:" in out and f"{n} ranks, 30 steps" in out, out


@pytest.mark.timeout(120)
def test_small_calls_benchmark_prints_its_table(tmp_path):
    """docs/benchmarks/small_calls.md is this script's output: it runs, and its table has the ten calls."""
    out = run_example("benchmarks/bench_small_calls.py", "--rounds", "1", "--iters", "50", cwd=tmp_path).stdout
    rows = [ln for ln in out.splitlines() if ln.startswith("| `")]
    calls = ["all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "all_gather", "gather", "scatter"]
    calls += ["reduce_scatter_tensor", "all_to_all_single", "barrier"]
    assert [r.split("`")[1] for r in rows] == calls, out
    width = 9 if HAS_TORCH else 6  # the torch columns when torch is installed
    assert all(r.count("|") == width for r in rows), out


@pytest.mark.timeout(120)
def test_minmax_benchmark_prints_its_table(tmp_path):
    """docs/benchmarks/small_calls.md's MIN/MAX tables are this script's output: one row per size, every column."""
    out = run_example("benchmarks/bench_minmax.py", "--sizes", "1,5000", "--rounds", "1", "--nan", cwd=tmp_path).stdout
    rows = [ln for ln in out.splitlines() if ln.startswith("| ") and ln[2].isdigit()]
    assert [r.split("|")[1].strip() for r in rows] == ["1", "5000"], out
    assert all(r.count("|") == 8 for r in rows), out
    assert all(
        float(cell) > 0 for r in rows for cell in r.split("|")[2:7] if not cell.strip().startswith(("+", "-"))
    ), out
