"""Launch a small script under ``mpiexec`` with a hard time limit (for fault tests)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

from hpcdist._launchenv import TORCHRUN_VARS

ROOT = Path(__file__).resolve().parents[2]


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str
    elapsed: float
    timed_out: bool

    @property
    def output(self) -> str:
        return self.stdout + self.stderr


def mpiexec() -> str:
    here = Path(sys.executable).parent / "mpiexec"
    return str(here) if here.exists() else (shutil.which("mpiexec") or "mpiexec")


def run_mpi(
    n: int,
    script: str,
    tmp_path: Path,
    *,
    env: dict[str, str] | None = None,
    limit: float = 90,
    args: list[str] | None = None,
) -> Result:
    """Run ``script`` (Python source, dedented) on ``n`` ranks; kill the whole launch after ``limit`` s."""
    path = tmp_path / f"script_{abs(hash(script)) % 10**8}.py"
    path.write_text(textwrap.dedent(script))
    # a fresh launch: nothing of a parent's job (a parent that ran init_process_group exports torchrun's variables)
    full_env = {k: v for k, v in os.environ.items() if k not in TORCHRUN_VARS and not k.startswith("TORCHELASTIC_")}
    full_env.pop("HPCDIST_TIMEOUT", None)
    full_env["PYTHONUNBUFFERED"] = "1"
    full_env["PYTHONPATH"] = str(ROOT) + os.pathsep + full_env.get("PYTHONPATH", "")
    full_env["HPCDIST_FLIGHT_DIR"] = str(tmp_path / "hpcdist-flight")  # dumps of failing jobs stay in tmp
    full_env.update(env or {})
    return run_limited([mpiexec(), "-n", str(n), sys.executable, str(path), *(args or [])], full_env, limit)


def run_limited(cmd: list[str], env: dict[str, str], limit: float, cwd: Path | None = None) -> Result:
    """Run ``cmd`` in a session of its own; after ``limit`` s kill it with all it started."""
    t0 = time.monotonic()
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True
    )
    try:
        out, err = proc.communicate(timeout=limit)
        timed_out = False
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        timed_out = True
    return Result(proc.returncode, out, err, time.monotonic() - t0, timed_out)
