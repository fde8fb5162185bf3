"""``hpcdist bench`` under a real mpiexec: tables, CSV, plot, the selection table's rows.

Tiny sweeps with a hard time limit; the numbers are not checked (never timed
assertions), only that every variant ran and the outputs are well formed.
"""

from __future__ import annotations

import csv
import shutil
import sys

import pytest
from mpirun import run_limited

pytestmark = pytest.mark.timeout(300)


def _mpiexec() -> str:
    return shutil.which("mpiexec") or "mpiexec"


def test_bench_tables_csv_plot_and_selection(tmp_path):
    pytest.importorskip("matplotlib")
    out_csv, out_png = tmp_path / "b.csv", tmp_path / "b.png"
    cmd = [_mpiexec(), "-n", "2", sys.executable, "-m", "hpcdist", "bench", "--ops", "all_reduce,broadcast,barrier"]
    cmd += ["--sizes", "4K,64K", "--rounds", "1", "--iters", "0.02", "--csv", str(out_csv), "--plot", str(out_png)]
    cmd += ["--table", "--progress"]
    r = run_limited(cmd, env=_env(), limit=240)
    assert not r.timed_out and r.returncode == 0, r.output
    assert "### all_reduce, 2 ranks" in r.stdout and "### barrier, 2 ranks" in r.stdout
    assert "| bytes | path | hpcdist µs | shm µs | raw µs |" in r.stdout
    assert "'all_reduce': {2: " in r.stdout  # --table
    assert "2/5" in r.stderr  # the progress bar counted the steps
    rows = list(csv.DictReader(out_csv.open()))
    variants = {row["variant"] for row in rows}
    assert {"hpcdist", "shm", "raw"} <= variants
    assert {(row["op"], row["bytes"]) for row in rows} == {
        ("all_reduce", "4096"),
        ("all_reduce", "65536"),
        ("broadcast", "4096"),
        ("broadcast", "65536"),
        ("barrier", "0"),
    }
    assert all(float(row["time_us"]) > 0 for row in rows)
    shm_rows = [row for row in rows if row["variant"] == "shm"]
    assert all(row["path"] == "shm" for row in shm_rows)
    assert out_png.stat().st_size > 1000 and out_png.read_bytes()[:4] == b"\x89PNG"


def test_bench_symmetric_variant(tmp_path):
    """``--symmetric`` times the four operations on symmetric memory (and no other), with its own ratio column."""
    out_csv = tmp_path / "s.csv"
    ops = "all_reduce,broadcast,all_gather_into_tensor,reduce_scatter_tensor,barrier"
    cmd = [_mpiexec(), "-n", "2", sys.executable, "-m", "hpcdist", "bench", "--ops", ops, "--sizes", "4K,1M"]
    cmd += ["--rounds", "1", "--iters", "0.02", "--no-gloo", "--symmetric", "--csv", str(out_csv)]
    r = run_limited(cmd, env=_env(), limit=240)
    assert not r.timed_out and r.returncode == 0, r.output
    assert "| bytes | path | hpcdist µs | shm µs | symmetric µs | raw µs |" in r.stdout
    assert "| hpcdist/raw | symmetric/raw |" in r.stdout
    rows = list(csv.DictReader(out_csv.open()))
    sym = {(row["op"], row["bytes"]) for row in rows if row["variant"] == "symmetric"}
    assert sym == {(op, size) for op in ops.split(",")[:4] for size in ("4096", "1048576")}
    assert all(float(row["time_us"]) > 0 for row in rows)


def test_bench_rejects_a_bad_size():
    r = run_limited([sys.executable, "-m", "hpcdist", "bench", "--sizes", "12Q"], env=_env(), limit=60)
    assert r.returncode != 0 and "--sizes" in r.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--ranks", "5"], "--ranks: expected group sizes of at least 1 and at most the 2 ranks of this launch"),
        (["--csv", "/nonexistent-dir/b.csv"], "--csv: expected a file in a writable directory"),
        (["--plot", "/"], "--plot: expected a file to write, got the directory '/'"),
    ],
)
def test_bench_refuses_what_needs_the_launch_before_measuring(args, message):
    """Under mpiexec: the launch's size and rank 0's output paths are checked before the sweep, every rank exits
    with status 2 and rank 0 says why once (they were found after the sweep, by a traceback and MPI_Abort)."""
    cmd = [_mpiexec(), "-n", "2", sys.executable, "-m", "hpcdist", "bench", "--sizes", "4K", "--no-gloo", *args]
    r = run_limited(cmd, env=_env(), limit=120)
    assert not r.timed_out and r.returncode == 2, r.output
    assert f"hpcdist bench: error: {message}" in r.stderr
    assert "###" not in r.stdout and "Traceback" not in r.output


def test_bench_rows_report_the_bytes_moved_at_three_ranks(tmp_path):
    """all_gather of a requested 1 KiB at 3 ranks gathers 3 x 85 floats: the row says 1020 bytes, and its
    bandwidths are computed from that."""
    out_csv = tmp_path / "b.csv"
    cmd = [_mpiexec(), "-n", "3", sys.executable, "-m", "hpcdist", "bench", "--ops", "all_gather_into_tensor"]
    cmd += ["--sizes", "1K", "--rounds", "1", "--iters", "0.02", "--no-gloo", "--csv", str(out_csv)]
    r = run_limited(cmd, env=_env(), limit=240)
    assert not r.timed_out and r.returncode == 0, r.output
    rows = list(csv.DictReader(out_csv.open()))
    assert rows and {row["bytes"] for row in rows} == {"1020"}
    for row in rows:
        algbw = 1020 / (float(row["time_us"]) * 1e-6) / 1e9
        assert float(row["algbw_GBps"]) == pytest.approx(algbw, rel=1e-9)


#: rank 1 never makes its first raw MPI call of the sweep, so rank 0 waits in a raw MPI_Allreduce
_STUCK_PEER = """
import sys, time
from mpi4py import MPI
import hpcdist.bench as bench
calls = bench._calls
def stuck(*args):
    out = calls(*args)
    if MPI.COMM_WORLD.Get_rank() == 1:
        out["raw"] = lambda: time.sleep(3600)
    return out
bench._calls = stuck
sys.exit(bench.main(sys.argv[1:]))
"""


def test_a_peer_stuck_in_the_sweep_ends_the_job_naming_the_step():
    """Raw MPI calls cannot time out: the watchdog ends the job after the group's timeout, naming the step.
    Before, rank 0 waited in MPI_Allreduce for as long as rank 1 was stuck."""
    env = dict(_env(), HPCDIST_TIMEOUT="5")
    cmd = [_mpiexec(), "-n", "2", sys.executable, "-c", _STUCK_PEER, "--ops", "all_reduce", "--sizes", "4K"]
    cmd += ["--rounds", "1", "--iters", "0.02", "--no-gloo"]
    r = run_limited(cmd, env=env, limit=90)
    assert not r.timed_out, r.output
    assert r.returncode != 0
    assert "DistTimeoutError" in r.output and "hpcdist bench: all_reduce of 4 KiB on 2 ranks" in r.output, r.output


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.pop("HPCDIST_SHM", None)
    return env
