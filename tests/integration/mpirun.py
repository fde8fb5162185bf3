"""Launch a small script under ``mpiexec`` with a hard time limit (for fault tests)."""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import tempfile
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
    full_env["PYTHONFAULTHANDLER"] = "1"  # a rank still running at the limit prints its threads' tracebacks
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
        rows = _processes(proc.pid)  # what was still running, and where it waited
        python_tracebacks(rows)
        kill_tree(proc.pid, rows)
        out, err = proc.communicate()
        err += processes_report(rows)
        timed_out = True
    return Result(proc.returncode, out, err, time.monotonic() - t0, timed_out)


def kill_tree(root: int, rows: list[tuple[int, list[str], str, str]]) -> None:
    """SIGKILL the session of ``root`` and every process of ``rows`` (:func:`_processes`): Hydra's proxies and
    their ranks run in sessions of their own, so ``killpg`` alone reaches only mpiexec."""
    os.killpg(root, signal.SIGKILL)
    for pid, *_ in rows:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


#: where the flight recorder dumps of jobs started by :func:`hpcdist_cli` go (not the test's working directory)
CLI_FLIGHT_DIR = Path(tempfile.gettempdir()) / f"hpcdist-cli-flight-{os.getpid()}"


def hpcdist_cli(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: float = 90) -> Result:
    """``python -m hpcdist ARGS`` with this tree's hpcdist, under :func:`run_limited`'s hard limit (past it, the
    whole tree is killed and the test fails with where each process waited).

    ``env`` adds variables to this process's (a value None removes one). ``SLURM_JOB_ID`` is removed (mpiexec
    even inside an allocation); flight recorder dumps go to :data:`CLI_FLIGHT_DIR` unless ``env`` names a place.
    """
    merged = {**os.environ, "PYTHONPATH": str(ROOT), "HPCDIST_FLIGHT_DIR": str(CLI_FLIGHT_DIR), **(env or {})}
    full_env = {k: v for k, v in merged.items() if v is not None}
    full_env.pop("SLURM_JOB_ID", None)
    return run_within([sys.executable, "-m", "hpcdist", *args], full_env, timeout, cwd=cwd)


def run_within(cmd: list[str], env: dict[str, str], limit: float, cwd: Path | None = None) -> Result:
    """:func:`run_limited`, failing the test when ``cmd`` ran past ``limit`` (with where each process waited)."""
    res = run_limited(cmd, env, limit, cwd=cwd)
    assert not res.timed_out, f"{' '.join(cmd)[:300]} ran past its {limit} s limit:\n{res.stderr[-4000:]}"
    return res


def python_tracebacks(rows: list[tuple[int, list[str], str, str]], grace: float = 2.0) -> None:
    """Make the Python processes of ``rows`` (:func:`_processes`) that run with ``PYTHONFAULTHANDLER=1``
    (:func:`run_mpi` sets it) print where every thread of theirs is: SIGABRT, which faulthandler turns into
    tracebacks on stderr even in a process stuck in C with the GIL held.

    Ranks share the launcher's stderr and faulthandler writes a traceback in many small writes, so ranks aborted
    together interleave their tracebacks mid-line (seen in CI: ``line \\n...\\n6 in <module>``); and aborted one
    after another, the first one's death makes the launcher kill the rest before they print. So the other
    processes of the launch (mpiexec, Hydra's proxies) are stopped first; the ranks are aborted one at a time, each
    given up to ``grace`` seconds to dump into its pipe and die; then the launcher goes on and forwards each pipe's
    traceback whole."""
    targets, others = [], []
    for pid, _fields, _wchan, cmd in rows:
        try:
            with open(f"/proc/{pid}/environ", "rb") as f:
                faulthandler = b"\0PYTHONFAULTHANDLER=1\0" in b"\0" + f.read()
        except OSError:
            continue
        (targets if faulthandler and "python" in cmd.split(" ", 1)[0] else others).append(pid)
    if not targets:
        return
    _signal_each(others, signal.SIGSTOP)
    try:
        for pid in targets:
            _signal_each([pid], signal.SIGABRT)
            deadline = time.monotonic() + grace
            while time.monotonic() < deadline and _alive(pid):
                time.sleep(0.01)
    finally:
        _signal_each(others, signal.SIGCONT)
    time.sleep(grace)  # the launcher forwards what the ranks printed


def _signal_each(pids: list[int], sig: signal.Signals) -> None:
    for pid in pids:
        with contextlib.suppress(OSError):
            os.kill(pid, sig)


def _alive(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return _stat_fields(stat)[0] not in ("Z", "X")


def _stat_fields(stat: str) -> list[str]:
    """The fields of a /proc/PID/stat line from the state on (the command name before them may hold spaces)."""
    return stat[stat.rindex(")") + 2 :].split()


def _processes(root: int) -> list[tuple[int, list[str], str, str]]:
    """(pid, /proc/pid/stat fields from the state on, wchan, command line) of ``root`` and every process it started,
    in whatever session (Hydra starts its proxies in sessions of their own)."""
    table: dict[int, tuple[list[str], str, str]] = {}
    try:
        pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
    except OSError:
        return []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                stat = f.read()
            fields = _stat_fields(stat)  # state ppid pgrp session ...
            with open(f"/proc/{pid}/wchan") as f:
                wchan = f.read().strip() or "-"
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()[:200]
        except (OSError, ValueError, IndexError):  # gone meanwhile
            continue
        table[pid] = (fields, wchan, cmd)
    keep, frontier = set(), {root}
    while frontier:
        keep |= frontier
        frontier = {pid for pid, (fields, _w, _c) in table.items() if int(fields[1]) in frontier} - keep
    return [(pid, *table[pid]) for pid in sorted(keep) if pid in table]


def processes_report(rows: list[tuple[int, list[str], str, str]]) -> str:
    """The processes of ``rows`` (:func:`_processes`: a launch that outlived its limit), each with its state, the
    kernel function it sleeps in and its command line: a report for the failing test's message ("" for none)."""
    lines = [f"  pid {pid} ppid {f[1]} state {f[0]} wchan {wchan}: {cmd}" for pid, f, wchan, cmd in rows]
    if not lines:
        return ""
    return (
        "\n--- processes of the launch at its time limit (tracebacks above from those with PYTHONFAULTHANDLER=1) ---\n"
        + "\n".join(lines)
        + "\n"
    )
