"""Which launcher started this process, from environment variables only.

No MPI call, no subprocess, no file access: safe at any time, also before
MPI is initialised (``hpcdist info`` uses it to say how a job was launched).

Launchers are tried in the order of :data:`LAUNCHERS`. MPI launchers come
before Slurm because ``mpiexec`` inside an allocation starts its proxies with
``srun``, so the application processes inherit ``SLURM_*`` variables that
describe the proxies, not the ranks. When an MPI launcher's variables agree
with a Slurm step's (``srun --mpi=pmi2`` or ``--mpi=pmix`` sets both), the
launcher is reported as ``"srun"``.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

__all__ = ["LAUNCHERS", "Launcher", "detect_launcher", "launcher_local_rank_size", "launcher_rank_size"]

# Slurm step ids of the batch script, the extern step and an interactive
# allocation shell: a process started by one of those was not started by srun.
_NON_SRUN_STEPS = {"batch", "extern", "interactive", "4294967294", "4294967295", "4294967293"}


@dataclass(frozen=True)
class Launcher:
    """How to recognise one launcher and read rank and size from its variables.

    ``rank_var`` must be set for the launcher to match; every name in
    ``require`` must be set too; when ``any_of`` is not empty at least one of
    those names (or name prefixes ending in ``*``) must be set.
    """

    name: str
    rank_var: str
    size_vars: tuple[str, ...] = ()
    local_rank_vars: tuple[str, ...] = ()
    local_size_vars: tuple[str, ...] = ()
    require: tuple[str, ...] = ()
    any_of: tuple[str, ...] = ()

    def matches(self, env: Mapping[str, str]) -> bool:
        """True when ``env`` looks like a process started by this launcher."""
        if not _present(env, self.rank_var) or not all(_present(env, v) for v in self.require):
            return False
        return not self.any_of or any(_has(env, pattern) for pattern in self.any_of)


def _present(env: Mapping[str, str], name: str) -> bool:
    return bool(env.get(name, "").strip())


def _has(env: Mapping[str, str], pattern: str) -> bool:
    if pattern.endswith("*"):
        return any(key.startswith(pattern[:-1]) for key in env)
    return _present(env, pattern)


#: The launchers hpcdist recognises, in the order they are tried.
LAUNCHERS: tuple[Launcher, ...] = (
    Launcher(
        "openmpi",
        "OMPI_COMM_WORLD_RANK",
        ("OMPI_COMM_WORLD_SIZE",),
        ("OMPI_COMM_WORLD_LOCAL_RANK",),
        ("OMPI_COMM_WORLD_LOCAL_SIZE",),
    ),
    Launcher(
        "mvapich",
        "MV2_COMM_WORLD_RANK",
        ("MV2_COMM_WORLD_SIZE",),
        ("MV2_COMM_WORLD_LOCAL_RANK",),
        ("MV2_COMM_WORLD_LOCAL_SIZE",),
    ),
    Launcher(
        "pals",
        "PALS_RANKID",
        ("PMI_SIZE",),
        ("PALS_LOCAL_RANKID", "PMI_LOCAL_RANK"),
        ("PALS_LOCAL_SIZE", "PMI_LOCAL_SIZE"),
    ),
    Launcher(
        "jsrun",
        "JSM_NAMESPACE_RANK",
        ("JSM_NAMESPACE_SIZE",),
        ("JSM_NAMESPACE_LOCAL_RANK",),
        ("JSM_NAMESPACE_LOCAL_SIZE",),
    ),
    Launcher("flux", "FLUX_TASK_RANK", ("FLUX_JOB_SIZE",), ("FLUX_TASK_LOCAL_ID",)),
    Launcher(
        "intelmpi",
        "PMI_RANK",
        ("PMI_SIZE",),
        ("MPI_LOCALRANKID",),
        ("MPI_LOCALNRANKS",),
        any_of=("I_MPI_ROOT", "I_MPI_HYDRA_*"),
    ),
    Launcher(
        "mpiexec",
        "PMI_RANK",
        ("PMI_SIZE",),
        ("MPI_LOCALRANKID", "PMI_LOCAL_RANK"),
        ("MPI_LOCALNRANKS", "PMI_LOCAL_SIZE"),
    ),
    Launcher("pmix", "PMIX_RANK", ("OMPI_COMM_WORLD_SIZE",), ("PMIX_LOCAL_RANK",), ("PMIX_LOCAL_SIZE",)),
    Launcher(
        "srun",
        "SLURM_PROCID",
        ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"),
        ("SLURM_LOCALID",),
        (),
        require=("SLURM_STEP_ID",),
        any_of=("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS", "SLURM_NPROCS"),
    ),
)

_SRUN = LAUNCHERS[-1]


def _int(env: Mapping[str, str], names: tuple[str, ...]) -> int | None:
    for name in names:
        raw = env.get(name, "").strip()
        if raw:
            try:
                return int(raw)
            except ValueError:
                return None
    return None


def _is_srun(env: Mapping[str, str]) -> bool:
    return _SRUN.matches(env) and env.get("SLURM_STEP_ID", "").strip().lower() not in _NON_SRUN_STEPS


def _find(env: Mapping[str, str]) -> Launcher | None:
    for launcher in LAUNCHERS:
        if launcher is _SRUN:
            return launcher if _is_srun(env) else None
        if launcher.matches(env):
            return launcher
    return None


def _name(launcher: Launcher, env: Mapping[str, str]) -> str:
    """``srun`` when an MPI launcher's rank and size agree with a Slurm step's."""
    if launcher is _SRUN or not _is_srun(env):
        return launcher.name
    same_rank = _int(env, (launcher.rank_var,)) == _int(env, (_SRUN.rank_var,))
    same_size = _int(env, launcher.size_vars) in (None, _int(env, _SRUN.size_vars))
    return "srun" if same_rank and same_size else launcher.name


def detect_launcher(env: Mapping[str, str] | None = None) -> str | None:
    """The name of the launcher that started this process, or None.

    Names: ``openmpi``, ``mvapich``, ``pals`` (Cray), ``jsrun`` (LSF),
    ``flux``, ``intelmpi``, ``mpiexec`` (MPICH Hydra and other PMI-1/PMI-2
    launchers), ``pmix``, ``srun`` (Slurm). Reads ``env`` (default
    ``os.environ``) only; no MPI call.
    """
    env = os.environ if env is None else env
    launcher = _find(env)
    return None if launcher is None else _name(launcher, env)


def launcher_rank_size(env: Mapping[str, str] | None = None) -> tuple[int, int] | None:
    """``(rank, size)`` as the launcher's variables state them, or None.

    None when no launcher is detected or when its variables do not give both
    numbers as integers (PMIx alone, for one, does not publish the size).
    """
    env = os.environ if env is None else env
    launcher = _find(env)
    if launcher is None:
        return None
    rank, size = _int(env, (launcher.rank_var,)), _int(env, launcher.size_vars)
    if launcher is not _SRUN and size is None and _is_srun(env):
        size = _int(env, _SRUN.size_vars)
    if rank is None or size is None or not 0 <= rank < size:
        return None
    return rank, size


def launcher_local_rank_size(env: Mapping[str, str] | None = None) -> tuple[int | None, int | None]:
    """``(local_rank, local_size)`` from the launcher's variables; None where unknown."""
    env = os.environ if env is None else env
    launcher = _find(env)
    if launcher is None:
        return None, None
    return _int(env, launcher.local_rank_vars), _int(env, launcher.local_size_vars)
