"""``hpcdist run``: launch N ranks of a script or module with the MPI in use.

::

    hpcdist run -n 4 train.py --epochs 3
    hpcdist run -n 8 --hosts node[01-02] -m mypkg.train
    hpcdist run -n 2 --prefix-output --timeout 60 job.py

Every rank runs ``python -m hpcdist.launch._bootstrap ... -- PROGRAM``, which
sets torchrun's variables for that rank and runs the program. When a rank
fails, its traceback is printed once (prefixed ``[rank N]``), the job ends and
``hpcdist run`` exits non-zero with one summary line. Bad input prints one line
``hpcdist run: ...`` on stderr and exits 2; a launcher that cannot start, 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hpcdist._descriptors import UNLIMITED, at_least, limits
from hpcdist._launchenv import free_port
from hpcdist._ranklist import ranks_text
from hpcdist.config import parse_number
from hpcdist.launch.launchers import (
    LaunchError,
    LaunchSpec,
    check_launcher_name,
    parse_hosts,
    read_hostfile,
    select_launcher,
)

__all__ = ["RunOptions", "UsageError", "build_command", "main", "parse_args"]

# after a rank reported a failure, how long the launcher may take to end the job by itself
_FAILURE_GRACE_S = 3.0
_OMP_NOTE = (
    "OMP_NUM_THREADS=1 in every rank (it was unset), as torchrun sets it: ranks that each start a thread per "
    "CPU overload the node; set OMP_NUM_THREADS to give each rank more threads"
)


def _one_omp_thread(opts: RunOptions, env: Mapping[str, str]) -> bool:
    """Whether the ranks get ``OMP_NUM_THREADS=1``: several ranks and the variable unset (torchrun's rule)."""
    return opts.nprocs > 1 and "OMP_NUM_THREADS" not in env


class UsageError(ValueError):
    """Bad ``hpcdist run`` arguments; the message names the argument."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # type: ignore[override]
        raise UsageError(message)


@dataclass
class RunOptions:
    nprocs: int
    program: list[str]  # ["script.py", *args] or ["-m", "module", *args]
    hosts: list[str]
    hostfile: str | None
    prefix_output: bool
    map_gpu: bool
    mpiexec: str | None
    launcher: str
    launcher_args: list[str]
    srun_mpi: str
    timeout: float | None
    dry_run: bool


def _parser() -> _Parser:
    p = _Parser(
        prog="hpcdist run",
        usage="hpcdist run [options] (script.py | -m module) [args ...]",
        description="Launch N ranks of a Python script or module with MPI (or srun inside a Slurm allocation). "
        "Everything after the script or module goes to the program.",
    )
    p.add_argument("-n", "--nprocs", "-np", dest="nprocs", default="1", help="number of ranks (default 1)")
    p.add_argument("--hosts", action="append", default=[], help="hosts, a comma list or hostlist (node[01-04])")
    p.add_argument("--hostfile", help="a hostfile as the launcher reads it (host or host:slots lines)")
    p.add_argument("--prefix-output", action="store_true", help="start every output line with [rank N]")
    p.add_argument("--map-gpu", action="store_true", help="give each rank one GPU (CUDA_VISIBLE_DEVICES by local rank)")
    p.add_argument("--mpiexec", help="the mpiexec to use (default: next to python, else on PATH)")
    p.add_argument("--launcher", default="auto", help="auto (default), mpiexec, srun, hydra, openmpi, generic")
    p.add_argument(
        "--launcher-arg",
        dest="launcher_args",
        action="append",
        default=[],
        help="pass one argument to the launcher (write --launcher-arg=--flag for flags)",
    )
    p.add_argument("--srun-mpi", default="pmi2", help="srun --mpi= type (default pmi2, which the embedded MPICH needs)")
    p.add_argument("--timeout", help="end the job after this many seconds (exit 124)")
    p.add_argument("--dry-run", action="store_true", help="print the launch command and exit")
    p.add_argument("-m", dest="module", help="run a module, like python -m")
    p.add_argument(
        "--torch",
        action="store_true",
        help="register torch.distributed's backend 'hpcdist' before the program runs (python -m hpcdist.torch)",
    )
    return p


# options of `hpcdist run` that take a value (so the next token is not the program)
_VALUE_OPTS = {
    "-n",
    "-np",
    "--nprocs",
    "--hosts",
    "--hostfile",
    "--mpiexec",
    "--launcher",
    "--launcher-arg",
    "--srun-mpi",
    "--timeout",
}


def _takes_value(tok: str) -> bool:
    """Whether ``tok`` is one of our options that takes a value: written out, or a long one
    abbreviated as argparse allows (``--nproc`` for ``--nprocs``)."""
    if tok in _VALUE_OPTS:
        return True
    return tok.startswith("--") and len(tok) > 2 and any(opt.startswith(tok) for opt in _VALUE_OPTS)


def _split(argv: list[str]) -> tuple[list[str], list[str]]:
    """Split ``argv`` into hpcdist's options and the program (``script args`` or ``-m mod args``).

    The first token that is not one of our options starts the program, so the
    program's own options (``-n 3`` included) are never read as ours.
    """
    i = 0
    while i < len(argv):
        tok = argv[i]
        if tok == "--":
            return argv[:i], argv[i + 1 :]
        if tok == "-m":
            if i + 1 >= len(argv):
                raise UsageError("-m: expected a module name, got nothing")
            return argv[:i], ["-m", *argv[i + 1 :]]
        if tok.startswith("-m") and not tok.startswith("--"):
            return argv[:i], ["-m", tok[2:], *argv[i + 1 :]]
        if not tok.startswith("-") or tok == "-":
            return argv[:i], argv[i:]
        if _takes_value(tok):
            i += 2
            continue
        i += 1
    return argv, []


#: torchrun's options a torchrun user may give: what hpcdist run takes instead
_TORCHRUN_OPTS = {
    "--nproc-per-node": "-n N",
    "--nnodes": "-n with --hosts or --hostfile (the launcher places the ranks)",
    "--node-rank": "-n with --hosts or --hostfile (the launcher places the ranks)",
    "--standalone": "nothing (a run on this host is the default)",
    "--no-python": "a Python script or -m module (hpcdist run starts Python programs only)",
    "--module": "-m MODULE",
    "--master-addr": "MASTER_ADDR in the environment",
    "--master-port": "MASTER_PORT in the environment",
    "--max-restarts": "nothing (a failing rank ends the job; there are no restarts)",
    "--rdzv-backend": "nothing (the launcher starts every rank; rank 0 hosts the env:// store)",
    "--rdzv-endpoint": "nothing (the launcher starts every rank; rank 0 hosts the env:// store)",
    "--rdzv-id": "nothing (the launcher starts every rank; rank 0 hosts the env:// store)",
}
_TORCHRUN_OPTS.update({k.replace("-", "_").replace("__", "--", 1): v for k, v in _TORCHRUN_OPTS.items()})


def _refuse_torchrun_options(head: list[str]) -> None:
    """A torchrun option among ours: say so and what to give instead (argparse says only 'unrecognized')."""
    i = 0
    while i < len(head):
        name = head[i].split("=", 1)[0]
        if name in _TORCHRUN_OPTS:
            raise UsageError(
                f"{name} is torchrun's option; expected {_TORCHRUN_OPTS[name]} (hpcdist run takes no torchrun options)"
            )
        i += 2 if _takes_value(head[i]) else 1  # skip our options' values (--launcher-arg X)


def _number(raw: str, what: str, **kw) -> Any:
    """:func:`hpcdist.config.parse_number`, its ValueError turned into a UsageError."""
    try:
        return parse_number(raw, what, **kw)
    except ValueError as exc:
        raise UsageError(str(exc)) from None


def parse_args(argv: list[str]) -> RunOptions:
    """Parse ``hpcdist run`` arguments; raise :class:`UsageError` on bad input."""
    head, program = _split(list(argv))
    _refuse_torchrun_options(head)
    ns = _parser().parse_args(head)
    if ns.module:
        program = ["-m", ns.module, *program]
    nprocs = _number(ns.nprocs, "-n/--nprocs", minimum=1)
    if not program:
        raise UsageError("missing program: expected a script path or -m module after the options")
    if program[0] != "-m" and not Path(program[0]).is_file():
        if Path(program[0]).is_dir():
            raise UsageError(f"script {program[0]!r}: expected a Python file, got a directory")
        raise UsageError(f"script {program[0]!r} not found (cwd {os.getcwd()})")
    timeout = None
    if ns.timeout is not None:
        timeout = _number(ns.timeout, "--timeout", minimum=0, unit="a number of seconds", kind=float)
    if ns.hosts and ns.hostfile:
        raise UsageError("--hosts and --hostfile: expected one of them, got both")
    try:
        check_launcher_name(ns.launcher)
        hosts = parse_hosts(ns.hosts)
        if ns.hostfile:
            read_hostfile(ns.hostfile)
    except LaunchError as exc:
        raise UsageError(str(exc)) from None
    if ns.torch:  # the program runs under `python -m hpcdist.torch`, which registers the backend first
        program = ["-m", "hpcdist.torch", *program]
    return RunOptions(
        nprocs=nprocs,
        program=program,
        hosts=hosts,
        hostfile=ns.hostfile,
        prefix_output=ns.prefix_output,
        map_gpu=ns.map_gpu,
        mpiexec=ns.mpiexec,
        launcher=ns.launcher,
        launcher_args=ns.launcher_args,
        srun_mpi=ns.srun_mpi,
        timeout=timeout,
        dry_run=ns.dry_run,
    )


def _master(opts: RunOptions, launcher_name: str, env: Mapping[str, str]) -> tuple[str, str]:
    """``(MASTER_ADDR, MASTER_PORT)``: the user's when set; else the first host and a port."""
    hosts = opts.hosts or (read_hostfile(opts.hostfile) if opts.hostfile else [])
    if not hosts and launcher_name == "srun" and env.get("SLURM_JOB_NODELIST"):
        from hpcdist.launch.hostlist import expand_hostlist

        hosts = expand_hostlist(env["SLURM_JOB_NODELIST"])[:1]
    local = {"localhost", "127.0.0.1", socket.gethostname(), socket.gethostname().split(".")[0]}
    addr = env.get("MASTER_ADDR") or (hosts[0] if hosts else "127.0.0.1")
    port = env.get("MASTER_PORT") or str(free_port("127.0.0.1") if addr in local else 29500)
    return addr, port


#: variables of the batch systems whose allocations MPICH's Hydra spreads the ranks over, without --hosts
_ALLOCATION_VARS = ("SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "PE_HOSTFILE", "COBALT_JOBID")


def _may_run_elsewhere(opts: RunOptions, env: Mapping[str, str]) -> bool:
    """Whether some rank may run on another host: ``--hosts``/``--hostfile``, srun, or inside a batch allocation
    (over which srun and Hydra spread the ranks)."""
    return bool(opts.hosts or opts.hostfile or opts.launcher == "srun" or any(env.get(v) for v in _ALLOCATION_VARS))


def _one_host_mpi_settings(opts: RunOptions, launcher_name: str, env: Mapping[str, str]) -> dict[str, str]:
    """The MPI variables a launcher-free world on one host starts the embedded MPICH with
    (:func:`hpcdist.rendezvous.mpi_env.choose`: ``MPIR_CVAR_ENABLE_HEAVY_YIELD=1`` when the ranks outnumber
    the CPUs, ``UCX_MEM_EVENTS=no``), for a launch that puts every rank on this host: Hydra's mpiexec with
    no ``--hosts``/``--hostfile`` outside a batch allocation. Elsewhere (other hosts, srun, Open MPI) none."""
    if launcher_name != "hydra" or _may_run_elsewhere(opts, env):
        return {}
    from ..rendezvous import mpi_env

    return mpi_env.choose({**env, "LOCAL_WORLD_SIZE": str(opts.nprocs)}, mpi_env.cpus(), mpi_env.embedded_mpich(env))


def build_command(
    opts: RunOptions, env: Mapping[str, str], status_dir: str | None = None, python: str | None = None, **select_kw
) -> tuple[list[str], dict[str, str]]:
    """The launcher's argument list and the environment it runs with."""
    launcher, exe = select_launcher(opts.launcher, opts.mpiexec, env, python=python, **select_kw)
    boot = [python or sys.executable, "-m", "hpcdist.launch._bootstrap"]
    if opts.prefix_output:
        boot.append("--prefix-output")
    if opts.map_gpu:
        boot.append("--map-gpu")
    if status_dir:
        boot += ["--status-dir", status_dir]
    tune = _one_host_mpi_settings(opts, launcher.name, env)
    spec = LaunchSpec(
        nprocs=opts.nprocs,
        program=[*boot, "--", *opts.program],
        hosts=opts.hosts,
        hostfile=opts.hostfile,
        export=["MASTER_ADDR", "MASTER_PORT", "PYTHONUNBUFFERED", "PYTHONPATH", *tune]
        + (["OMP_NUM_THREADS"] if opts.nprocs > 1 or "OMP_NUM_THREADS" in env else []),  # set below, or the user's
        extra=opts.launcher_args,
        srun_mpi=opts.srun_mpi,
    )
    cmd = launcher.build(exe, spec)
    child_env = dict(env)
    child_env["MASTER_ADDR"], child_env["MASTER_PORT"] = _master(opts, launcher.name, env)
    child_env.setdefault("PYTHONUNBUFFERED", "1")  # see output as it happens, not at exit
    child_env.update(tune)
    if _one_omp_thread(opts, env):
        child_env["OMP_NUM_THREADS"] = "1"
    # the ranks import hpcdist from where this one lives, also from a source tree not installed
    pkg_root = Path(__file__).resolve().parents[2]
    if pkg_root.name not in ("site-packages", "dist-packages"):
        child_env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pkg_root), env.get("PYTHONPATH", "")) if p)
    return cmd, child_env


def _failures(status_dir: str) -> list[dict]:
    """The ranks' failure records in ``status_dir``, the first failure first (:func:`sorted_failures`)."""
    out = []
    for path in Path(status_dir).glob("rank-*.json"):
        try:
            out.append(json.loads(path.read_text()))
        except (OSError, ValueError):
            continue
    return sorted_failures(out)


def sorted_failures(records: list[dict]) -> list[dict]:
    """Failure records by the time each was written, then rank: the first failure, most often the cause, first."""
    return sorted(records, key=lambda d: (float(d.get("time", 0.0)), int(d.get("rank", 0))))


#: lines of failures hpcdist run prints at most (one per distinct error; at scale, thousands of ranks can fail)
_SUMMARY_LINES = 8


def _summary_lines(failures: list[dict]) -> list[str]:
    """``hpcdist run``'s summary of failure records (:func:`_failures`' order): one line per distinct error, in
    the order of each error's first failure, with the ranks that had it (``rank 3 failed: ...``, ``ranks 0-511,
    513-1023 failed: ...``; ``rank 3 on node07 failed: ...`` where the failures come from several hosts); past
    :data:`_SUMMARY_LINES` errors, one line counting the rest."""
    by_error: dict[str, list[int]] = {}
    host = {}
    for fail in failures:
        by_error.setdefault(str(fail.get("error", "")), []).append(int(fail.get("rank", -1)))
        host[int(fail.get("rank", -1))] = fail.get("host")
    several_hosts = len(set(host.values())) > 1  # a rank's host is named only where the failures span hosts

    def who(ranks: list[int]) -> str:
        if len(ranks) > 1:
            return f"ranks {ranks_text(ranks)}"
        return f"rank {ranks[0]}" + (f" on {host[ranks[0]]}" if several_hosts and host[ranks[0]] else "")

    groups = list(by_error.items())
    shown = groups if len(groups) <= _SUMMARY_LINES else groups[: _SUMMARY_LINES - 1]
    lines = [f"hpcdist run: {who(r)} failed: {error}" for error, r in shown]
    if rest := groups[len(shown) :]:
        lines.append(f"hpcdist run: {sum(len(r) for _, r in rest)} more ranks failed with {len(rest)} other errors")
    return lines


def _failed_status(status_dir: str) -> int:
    """The exit status the rank that failed first recorded (1 for an exception or a status that is not 1..255)."""
    for fail in _failures(status_dir):
        code = fail.get("status")
        return code if isinstance(code, int) and 1 <= code <= 255 else 1
    return 1


#: Signals that end the job: forwarded to the launcher as SIGTERM (torchrun handles the same set, and SIGINT as
#: SIGTERM). SIGINT is handled too, not left to KeyboardInterrupt: raised between any two bytecodes, that could leave
#: subprocess's waitpid lock taken, and the wait after it would never return.
_FORWARDED = tuple(getattr(signal, n) for n in ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT") if hasattr(signal, n))


def _stop(proc: subprocess.Popen, grace: float = 5.0) -> None:
    """SIGTERM the launcher (it forwards to the ranks), SIGKILL after ``grace`` seconds; never waits unbounded."""
    if proc.poll() is not None:
        return
    proc.terminate()
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=grace)


def _supervise(
    proc: subprocess.Popen, status_dir: str, timeout: float | None, signalled: list[int]
) -> tuple[int, str | None]:
    """Wait for the launcher; end it on a reported failure, the timeout or a signal (``signalled`` non-empty)."""
    start = time.monotonic()
    failed_at: float | None = None
    while True:
        try:
            rc = proc.wait(timeout=0.2)
            return rc, None
        except subprocess.TimeoutExpired:
            pass
        if signalled:  # the handler asked the launcher to end the ranks: give it the grace, then kill it
            _stop(proc)
            return proc.returncode if proc.returncode is not None else 128 + signalled[0], None
        now = time.monotonic()
        if failed_at is None and any(Path(status_dir).glob("rank-*.json")):
            failed_at = now
        if failed_at is not None and now - failed_at > _FAILURE_GRACE_S:
            _stop(proc)  # a rank failed before MPI was up: the launcher may wait for the others forever
            return _failed_status(status_dir), None  # the rank's, not the launcher's after our SIGTERM
        if timeout is not None and now - start > timeout:
            _stop(proc)
            if failed_at is not None:  # a rank had failed first: the job ends for that, not for the timeout
                return _failed_status(status_dir), None
            return 124, f"timed out after {timeout:g} s; job ended"


#: variables of the launch that --dry-run leaves out: the bootstrap picks them when they are unset
_DRY_RUN_UNSET = ("MASTER_ADDR", "MASTER_PORT")


def _dry_run_env(env: Mapping[str, str], child_env: Mapping[str, str]) -> list[str]:
    """``env K=V ...`` for what the launch sets beyond ``env`` (OMP_NUM_THREADS, the MPI settings, PYTHONPATH),
    so that the printed command runs as ``hpcdist run`` would; [] when there is nothing."""
    extra = [f"{k}={v}" for k, v in child_env.items() if env.get(k) != v and k not in _DRY_RUN_UNSET]
    return ["env", *extra] if extra else []


def _status_parent(opts: RunOptions, env: Mapping[str, str], cwd: str | None = None) -> str | None:
    """Where the ranks' failure records go: the working directory (on a cluster, a file system every node
    sees) when the ranks may run on other hosts (``--hosts``/``--hostfile``, ``--launcher srun``, a batch
    allocation), so that their failures are named too; else, or where it is not writable, the system's
    temporary directory (None)."""
    where = os.getcwd() if cwd is None else cwd
    return where if _may_run_elsewhere(opts, env) and os.access(where, os.W_OK | os.X_OK) else None


def _host_prefix() -> str:
    """The records directories of this host's launches are named ``.hpcdist-run-HOST-PID-XXXXXXXX``."""
    return f".hpcdist-run-{socket.gethostname()}-"


def _status_prefix() -> str:
    """The name of this launch's records directory starts so: who made it, to find it again if it is left."""
    return f"{_host_prefix()}{os.getpid()}-"


def _sweep_left_records(parent: str) -> None:
    """Remove records directories in ``parent`` that a ``hpcdist run`` of this host left when it was killed (no
    cleanup runs after a SIGKILL): those whose process is gone. Another host's, or a live one's, stay."""
    mine = _host_prefix()
    with contextlib.suppress(OSError), os.scandir(parent) as entries:
        for entry in entries:
            # PID-RANDOM (tempfile's names have no "-"): not "2-PID-RANDOM" of a host named like this one + "-2"
            made = re.fullmatch(r"(\d+)-[a-z0-9_]+", entry.name[len(mine) :]) if entry.name.startswith(mine) else None
            if made is None or not entry.is_dir(follow_symlinks=False):
                continue
            try:
                os.kill(int(made.group(1)), 0)
            except ProcessLookupError:
                shutil.rmtree(entry.path, ignore_errors=True)
            except OSError:  # alive, another user's
                pass


#: descriptors a launcher holds per rank it starts on its host, with room to spare: Hydra's proxy keeps the
#: rank's stdio pipes and its PMI socket, about 4 (measured: ``mpiexec -n 16`` failed under a soft limit of 64 and
#: ``-n 32`` under 128, "HYDU_create_process ... pipe error (Too many open files)"), so the common soft limit of
#: 1024 stopped a one-node job near 250 ranks
FDS_PER_RANK = 8
FDS_BASE = 256


def _enough_descriptors(nprocs: int) -> None:
    """Raise this process's soft open-file limit (the launcher inherits it) to what ``nprocs`` ranks on one host
    need, within the hard limit; where the hard limit is lower, say so (the launcher's own error is obscure)."""
    need = FDS_BASE + FDS_PER_RANK * nprocs
    at_least(need)
    now = limits()
    if now is not None and now[0] != UNLIMITED and now[0] < need:
        print(
            f"hpcdist run: note: {nprocs} ranks on one host may need about {need} open files in the launcher, "
            f"above this process's hard limit ({now[1]}); if the launcher fails with 'Too many open files', "
            "raise the hard limit (ulimit -Hn, LimitNOFILE, limits.conf) or spread the ranks over more hosts",
            file=sys.stderr,
        )


def execute(opts: RunOptions, env: Mapping[str, str] | None = None) -> int:
    """Launch the job; return the exit status for ``hpcdist run``."""
    env = os.environ if env is None else env
    if opts.dry_run:  # the command as a user can run it: no status directory (it would be gone by then)
        cmd, child_env = build_command(opts, env)
        print(shlex.join(_dry_run_env(env, child_env) + cmd))
        return 0
    parent = _status_parent(opts, env)
    if parent is not None:
        _sweep_left_records(parent)
    with tempfile.TemporaryDirectory(prefix=_status_prefix(), dir=parent) as status_dir:
        cmd, child_env = build_command(opts, env, status_dir)
        _enough_descriptors(opts.nprocs)
        try:
            proc = subprocess.Popen(cmd, env=child_env)
        except OSError as exc:
            raise LaunchError(f"cannot start launcher {cmd[0]!r}: {exc.strerror or exc}") from None
        if _one_omp_thread(opts, env):
            print(f"hpcdist run: {_OMP_NOTE}", file=sys.stderr)
        got: list[int] = []

        def forward(signum: int, _frame: object) -> None:  # as torchrun: end the job, report the signal
            got.append(signum)  # _supervise ends the launcher: no work here, where the main thread was interrupted

        previous = {sig: signal.signal(sig, forward) for sig in _FORWARDED}
        try:
            rc, note = _supervise(proc, status_dir, opts.timeout, got)
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        if got:  # _supervise has ended the launcher
            name = signal.Signals(got[0]).name
            print(f"hpcdist run: received {name}; ended the job", file=sys.stderr)
            return 128 + got[0]
        if rc < 0:
            rc = 128 - rc
        failures = _failures(status_dir)
        for line in _summary_lines(failures):
            print(line, file=sys.stderr)
        if note:
            print(f"hpcdist run: {note}", file=sys.stderr)
        elif rc != 0 and not failures:
            print(f"hpcdist run: {Path(cmd[0]).name} exited with status {rc}", file=sys.stderr)
        return rc


def main(argv: list[str]) -> int:
    """Entry point of ``hpcdist run``; returns the exit status."""
    try:
        opts = parse_args(argv)
    except UsageError as exc:
        print(f"hpcdist run: {exc}", file=sys.stderr)
        return 2
    try:
        return execute(opts)
    except LaunchError as exc:
        print(f"hpcdist run: {exc}", file=sys.stderr)
        return 1
