"""Launcher registry: how to find a launcher and build its command line.

Each launcher turns a :class:`LaunchSpec` into an argument list (never a shell
string). :func:`select_launcher` picks one: ``--launcher`` when given; else
``srun`` inside a Slurm allocation (``SLURM_JOB_ID`` set and ``srun`` found)
unless ``--mpiexec`` was given; else the ``mpiexec`` of the MPI in use (next to
the Python executable, where the ``mpich`` wheel puts it, then ``mpiexec`` and
``mpirun`` on ``PATH``). The flavour of an ``mpiexec`` (MPICH/Intel Hydra,
Open MPI) is read from its ``--version`` output.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

__all__ = [
    "LAUNCHERS",
    "LaunchError",
    "LaunchSpec",
    "Launcher",
    "check_launcher_name",
    "find_mpiexec",
    "mpiexec_flavour",
    "register_launcher",
    "select_launcher",
]


class LaunchError(RuntimeError):
    """The job cannot be launched (no launcher found, bad hosts, ...); the message is one line."""


@dataclass
class LaunchSpec:
    """What to launch: ``nprocs`` copies of ``program`` (a full argument list)."""

    nprocs: int
    program: list[str]
    hosts: list[str] = field(default_factory=list)
    hostfile: str | None = None
    export: list[str] = field(default_factory=list)  # variables a launcher must be told to pass on
    extra: list[str] = field(default_factory=list)  # the user's --launcher-arg values, verbatim
    srun_mpi: str = "pmi2"


@dataclass(frozen=True)
class Launcher:
    """One way to start ranks: its executable names and its command builder."""

    name: str
    description: str
    build: Callable[[str, LaunchSpec], list[str]]


#: name -> Launcher. ``hydra`` (MPICH, Intel MPI, MVAPICH), ``openmpi``, ``srun``, ``generic``.
LAUNCHERS: dict[str, Launcher] = {}


def register_launcher(launcher: Launcher) -> None:
    """Add a launcher; a name already registered raises ``ValueError``."""
    if not isinstance(launcher, Launcher):
        raise TypeError(f"register_launcher: expected a Launcher, got {type(launcher).__name__}")
    if launcher.name in LAUNCHERS:
        raise ValueError(f"register_launcher: launcher {launcher.name!r} is already registered")
    LAUNCHERS[launcher.name] = launcher


def _hydra(exe: str, spec: LaunchSpec) -> list[str]:
    cmd = [exe, "-n", str(spec.nprocs)]
    if spec.hosts:
        cmd += ["-hosts", ",".join(spec.hosts)]
    if spec.hostfile:
        cmd += ["-f", spec.hostfile]
    return cmd + spec.extra + spec.program  # Hydra passes the whole environment on by default


def _openmpi(exe: str, spec: LaunchSpec) -> list[str]:
    cmd = [exe, "-n", str(spec.nprocs)]
    if spec.hosts:
        cmd += ["--host", ",".join(spec.hosts)]
    if spec.hostfile:
        cmd += ["--hostfile", spec.hostfile]
    for name in spec.export:
        cmd += ["-x", name]
    return cmd + spec.extra + spec.program


def _srun(exe: str, spec: LaunchSpec) -> list[str]:
    if spec.hostfile:  # ignored, the ranks would run elsewhere than the hostfile (and MASTER_ADDR) says
        raise LaunchError(
            f"--hostfile: srun does not read hostfiles (got {spec.hostfile!r}); give the nodes with --hosts "
            "(srun --nodelist), or pass --mpiexec PATH to launch with mpiexec inside the allocation"
        )
    cmd = [exe, f"--mpi={spec.srun_mpi}", f"--ntasks={spec.nprocs}", "--kill-on-bad-exit=1"]
    if spec.hosts:
        cmd.append(f"--nodelist={','.join(spec.hosts)}")
    return cmd + spec.extra + spec.program  # srun's default is --export=ALL


def _generic(exe: str, spec: LaunchSpec) -> list[str]:
    if spec.hosts or spec.hostfile:
        raise LaunchError(
            f"don't know how to pass --hosts/--hostfile to {exe} (not MPICH/Intel Hydra nor Open MPI); "
            "pass them with --launcher-arg"
        )
    return [exe, "-n", str(spec.nprocs), *spec.extra, *spec.program]


register_launcher(Launcher("hydra", "mpiexec of MPICH / Intel MPI / MVAPICH (Hydra)", _hydra))
register_launcher(Launcher("openmpi", "mpirun/mpiexec of Open MPI", _openmpi))
register_launcher(Launcher("srun", "Slurm's srun, inside an allocation", _srun))
register_launcher(Launcher("generic", "an mpiexec of unknown flavour (-n N only)", _generic))

#: substrings of ``mpiexec --version`` output -> launcher name, tried in order.
_FLAVOURS: tuple[tuple[str, str], ...] = (
    ("HYDRA", "hydra"),
    ("Intel(R) MPI", "hydra"),
    ("Open MPI", "openmpi"),
    ("OpenRTE", "openmpi"),
    ("PRRTE", "openmpi"),
)


def mpiexec_flavour(exe: str, timeout: float = 15.0) -> str:
    """``hydra``, ``openmpi`` or ``generic``, from ``exe --version``."""
    try:
        proc = subprocess.run([exe, "--version"], capture_output=True, text=True, timeout=timeout, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return "generic"
    text = proc.stdout + proc.stderr
    for needle, name in _FLAVOURS:
        if needle in text:
            return name
    return "generic"


def find_mpiexec(which: Callable[[str], str | None] = shutil.which, python: str | None = None) -> str | None:
    """The ``mpiexec`` of the MPI in use: next to the Python executable, else on ``PATH``."""
    bindir = Path(python or sys.executable).parent
    for name in ("mpiexec", "mpirun"):
        candidate = bindir / name
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return str(candidate)
    for name in ("mpiexec", "mpirun"):
        found = which(name)
        if found:
            return found
    return None


def select_launcher(
    choice: str,
    mpiexec: str | None,
    env: Mapping[str, str],
    which: Callable[[str], str | None] = shutil.which,
    flavour: Callable[[str], str] = mpiexec_flavour,
    python: str | None = None,
) -> tuple[Launcher, str]:
    """``(launcher, executable)`` for ``--launcher choice`` (``auto``, ``srun``, ``mpiexec``
    or a registered name) and ``--mpiexec``; raises :class:`LaunchError` when none is found."""
    if choice == "srun" or (choice == "auto" and mpiexec is None and env.get("SLURM_JOB_ID") and which("srun")):
        srun = which("srun")
        if not srun:
            raise LaunchError("--launcher srun: srun not found on PATH")
        return LAUNCHERS["srun"], srun
    if mpiexec is not None:
        if not (os.path.isfile(mpiexec) and os.access(mpiexec, os.X_OK)) and not which(mpiexec):
            raise LaunchError(f"--mpiexec: expected an executable file, got {mpiexec!r} (not found)")
        exe = mpiexec if os.path.isfile(mpiexec) else str(which(mpiexec))
    else:
        found = find_mpiexec(which, python)
        if found is None:
            where = Path(python or sys.executable).parent
            raise LaunchError(
                f"no MPI launcher found: no mpiexec/mpirun in {where} nor on PATH; "
                "install the embedded MPI (pip install mpich), load your site's MPI module, or pass --mpiexec PATH"
            )
        exe = found
    if choice in ("auto", "mpiexec"):
        return LAUNCHERS[flavour(exe)], exe
    check_launcher_name(choice)
    return LAUNCHERS[choice], exe


def check_launcher_name(choice: str) -> None:
    """Raise :class:`LaunchError` unless ``choice`` is ``auto``, ``mpiexec`` or a registered launcher."""
    if choice not in ("auto", "mpiexec") and choice not in LAUNCHERS:
        raise LaunchError(
            f"--launcher: expected auto, mpiexec or one of {', '.join(sorted(LAUNCHERS))}; got {choice!r}"
        )


def read_hostfile(path: str) -> list[str]:
    """Host names of a hostfile (``host``, ``host:slots`` or ``host slots=N`` lines; ``#`` comments)."""
    try:
        text = Path(path).read_text()
    except OSError as exc:
        raise LaunchError(f"--hostfile: cannot read {path!r}: {exc.strerror or exc}") from None
    hosts = []
    for line in text.splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            hosts.append(line.split()[0].split(":")[0])
    if not hosts:
        raise LaunchError(f"--hostfile: expected at least one host in {path!r}, found none")
    return hosts


def parse_hosts(hosts: Sequence[str]) -> list[str]:
    """Expand ``--hosts`` values (each a Slurm hostlist, ``h1,h2`` or ``node[01-04]``)."""
    from hpcdist.launch.hostlist import expand_hostlist

    out: list[str] = []
    for value in hosts:
        try:
            expanded = expand_hostlist(value)
        except ValueError as exc:
            raise LaunchError(f"--hosts: {exc}") from None
        if not expanded:  # an empty $HOSTS: the job would silently run on this host alone
            raise LaunchError(f"--hosts: expected at least one host name, got {value!r}")
        out.extend(expanded)
    return out
