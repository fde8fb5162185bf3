"""`hpcdist run` defects found by an adversarial pass, checked with real jobs under the embedded mpiexec.

Each test failed before its fix; the in-process checks are in tests/unit/test_cli_defects.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mpirun import Result, hpcdist_cli, run_within

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 90  # seconds for one launched job


def hpcdist(*args: str, cwd: Path | None = None, timeout: int = LIMIT) -> Result:
    """``python -m hpcdist ARGS`` with this tree's hpcdist and one OpenMP thread per rank."""
    return hpcdist_cli(*args, cwd=cwd, env={"OMP_NUM_THREADS": "1"}, timeout=timeout)


def write(path: Path, body: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(textwrap.dedent(body))
    return path


@pytest.mark.timeout(120)
def test_symlinked_script_imports_beside_its_target(tmp_path):
    """``python bin/train.py`` puts the symlink's target's directory first on sys.path; the bootstrap put
    the link's own (ModuleNotFoundError for the script's sibling module)."""
    write(tmp_path / "proj" / "helper_mod.py", "VALUE = 'found'\n")
    write(tmp_path / "proj" / "train.py", "import os, helper_mod\nos.write(1, f'GOT {helper_mod.VALUE}\\n'.encode())\n")
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "train.py").symlink_to(tmp_path / "proj" / "train.py")
    proc = hpcdist("run", "-n", "1", "bin/train.py", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["GOT found"]


@pytest.mark.timeout(120)
def test_prefix_output_keeps_the_stream_api(tmp_path):
    """writelines, sys.stdout.buffer and reconfigure raised AttributeError on every rank."""
    script = write(
        tmp_path / "streams.py",
        """
        import sys
        sys.stdout.reconfigure(line_buffering=True)
        sys.stdout.writelines(["one\\n", "two\\n"])
        sys.stdout.buffer.write(b"raw bytes\\n")
        sys.stdout.buffer.flush()
        """,
    )
    proc = hpcdist("run", "-n", "1", "--prefix-output", str(script), cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["[rank 0] one", "[rank 0] two", "raw bytes"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("how", "status"), [("sys.exit(3)", 3), ("raise ValueError('bad shard')", 1)])
def test_status_of_a_rank_failing_before_mpi(tmp_path, how, status):
    """The job ended by hpcdist run (the rank's failure recorded, the launcher stopped) exited 15, the
    status of its own SIGTERM to mpiexec; now the failed rank's, as the same failure after
    init_process_group gives (MPI_Abort with it)."""
    script = write(
        tmp_path / "fail.py",
        f"""
        import os, sys, time
        if os.environ["RANK"] == "1":
            {how}
        time.sleep(60)
        """,
    )
    proc = hpcdist("run", "-n", "2", str(script), cwd=tmp_path, timeout=60)
    assert proc.returncode == status, proc.stderr
    assert "hpcdist run: rank 1 failed: " in proc.stderr


@pytest.mark.timeout(120)
def test_a_failure_before_a_short_timeout_keeps_its_status(tmp_path):
    """With --timeout shorter than the grace given a failed rank's launcher (3 s), the job ended with 124 as if it
    had timed out, though rank 1 had exited 3 at once: the rank's failure came first, its status is the job's."""
    script = write(
        tmp_path / "fail.py", "import os, sys, time\nif os.environ['RANK'] == '1':\n    sys.exit(3)\ntime.sleep(60)\n"
    )
    proc = hpcdist("run", "-n", "2", "--timeout", "2", str(script), cwd=tmp_path, timeout=60)
    assert proc.returncode == 3, proc.stderr
    assert "hpcdist run: rank 1 failed: " in proc.stderr and "timed out" not in proc.stderr


@pytest.mark.timeout(120)
def test_abbreviated_option_launches_with_its_value(tmp_path):
    """``--nproc 2`` (argparse's abbreviation of --nprocs) failed with 'expected one argument'."""
    script = write(tmp_path / "size.py", "import os\nos.write(1, f\"SIZE {os.environ['WORLD_SIZE']}\\n\".encode())\n")
    proc = hpcdist("run", "--nproc", "2", str(script), "--nproc", "5", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["SIZE 2", "SIZE 2"]


@pytest.mark.timeout(60)
def test_usage_errors_exit_2_before_launch(tmp_path):
    script = write(tmp_path / "ok.py", "print('never')\n")
    for args, needle in (
        (("run", "--launcher", "mpich", str(script)), "--launcher: expected auto, mpiexec or one of"),
        (("run", "--hostfile", "nope", str(script)), "--hostfile: cannot read 'nope'"),
        (("run", "--hosts", "", str(script)), "--hosts: expected at least one host name, got ''"),
    ):
        proc = hpcdist(*args, cwd=tmp_path, timeout=30)
        assert proc.returncode == 2, (args, proc.stderr)
        assert proc.stderr.count("\n") == 1 and needle in proc.stderr and "never" not in proc.stdout


@pytest.mark.timeout(120)
def test_missing_module_reads_as_python_m(tmp_path):
    """``-m nosuch.mod`` printed runpy's chained traceback on every rank; ``python -m`` prints one line.
    An ImportError raised by the module's own code keeps its traceback."""
    missing = hpcdist("run", "-n", "2", "-m", "nosuch_pkg_xyz.mod", cwd=tmp_path)
    python_m = subprocess.run(
        [sys.executable, "-m", "nosuch_pkg_xyz.mod"], cwd=tmp_path, capture_output=True, text=True, timeout=LIMIT
    )
    assert missing.returncode == python_m.returncode == 1
    assert "Traceback" not in missing.stderr, missing.stderr
    for rank in (0, 1):
        assert f"[rank {rank}] {python_m.stderr.strip()}" in missing.stderr.splitlines(), missing.stderr
    write(tmp_path / "broken_mod_xyz.py", "import nosuch_dependency_xyz\n")
    broken = hpcdist("run", "-n", "1", "-m", "broken_mod_xyz", cwd=tmp_path)
    assert broken.returncode == 1
    assert "Traceback" in broken.stderr and "broken_mod_xyz.py" in broken.stderr, broken.stderr


@pytest.mark.timeout(120)
def test_dry_run_command_runs_as_printed(tmp_path):
    """``--dry-run`` printed ``--status-dir`` of a temporary directory deleted before the user could run it; and
    left out what the launch sets (OMP_NUM_THREADS, the MPI settings, PYTHONPATH): now ``env K=V`` before it, so
    the command runs as printed in a shell that has none of them and the ranks see what hpcdist run gives them."""
    write(
        tmp_path / "hello.py",
        "import os\nos.write(1, ('hello ' + os.environ.get('OMP_NUM_THREADS', '-') + chr(10)).encode())\n",
    )
    bare = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "OMP_NUM_THREADS")}
    dry = hpcdist_cli("run", "--dry-run", "-n", "2", "hello.py", cwd=tmp_path, env={"OMP_NUM_THREADS": None})
    assert dry.returncode == 0, dry.stderr
    assert "--status-dir" not in dry.stdout and dry.stdout.startswith("env "), dry.stdout
    ran = run_within(["bash", "-c", dry.stdout.strip()], bare, LIMIT, cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["hello 1", "hello 1"]
