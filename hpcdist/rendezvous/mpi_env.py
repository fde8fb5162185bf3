"""The MPI settings hpcdist makes before it starts MPI in a process no launcher started.

Under a user's ``mpiexec``/``srun`` hpcdist sets no MPI variable: the launcher
and the site's configuration decide. In a launcher-free world (``env://``,
``tcp://``, ``file://``: processes started by multiprocessing, torchrun or a job
script) hpcdist itself starts MPI, in ``init_process_group``, and it starts the
embedded MPICH (the ``mpich`` wheel) with two settings, each only where the
environment says nothing of the kind. ``hpcdist run`` gives its ranks the same
two where it puts them all on this host (MPICH's ``mpiexec``, no ``--hosts`` or
``--hostfile``, outside a batch allocation: ``hpcdist.launch.run``):

``UCX_MEM_EVENTS=no``
    The embedded MPICH talks through UCX, whose memory hooks patch eight
    functions of the C library at load time, about 5 ms each: 40 of the
    50 ms it takes to load the library (measured, docs/benchmarks/init.md).
    The hooks feed UCX's registration cache, which only RDMA networks
    (InfiniBand) use; without it UCX registers memory per transfer there:
    correct, slower for large messages over InfiniBand. Launcher-free worlds
    run on one host or over TCP; set ``UCX_MEM_EVENTS=yes`` to keep the hooks.
``MPIR_CVAR_ENABLE_HEAVY_YIELD=1``
    Only when more processes share this host than it has CPUs (their number
    from ``LOCAL_WORLD_SIZE``, or ``WORLD_SIZE`` when ``MASTER_ADDR`` is a
    loopback address): MPICH's waits then give the CPU away instead of
    spinning on it, which made joining 8 processes on 2 CPUs 12 times faster
    (429 -> 36 ms in the connect/accept rounds). On CPUs of its own a
    process spins: this setting would make each blocking call ~100 µs slower.

``HPCDIST_MPI_TUNE=0`` turns both off. ``hpcdist info`` shows what would be set.
Nothing here runs at import time; :func:`apply` runs once, just before the
first ``import mpi4py.MPI`` of a launcher-free ``init_process_group``.
"""

from __future__ import annotations

import ipaddress
import os
import sys
from collections.abc import Mapping, MutableMapping

from .. import config

__all__ = ["apply", "choose", "cpus", "embedded_mpich"]

#: a variable the user set for UCX's memory hooks means: leave them alone
_UCX_MEM_VARS = ("UCX_MEM_EVENTS", "UCX_MEM_MMAP_HOOK_MODE", "UCX_MEM_MALLOC_HOOKS")


def embedded_mpich(env: Mapping[str, str]) -> bool:
    """Whether mpi4py will load the embedded MPICH (the ``mpich`` wheel), known without loading it."""
    if env.get("MPI4PY_LIBMPI"):
        return False
    from importlib import metadata

    try:
        metadata.distribution("mpich")
    except metadata.PackageNotFoundError:
        return False
    return True


def _local_processes(env: Mapping[str, str]) -> int | None:
    """How many processes of this job share this host, where the environment says so; else None."""
    for name in ("LOCAL_WORLD_SIZE",):
        value = env.get(name, "").strip()
        if value.isdigit():
            return int(value)
    size, addr = env.get("WORLD_SIZE", "").strip(), env.get("MASTER_ADDR", "").strip()
    if size.isdigit() and addr:
        try:
            loopback = addr == "localhost" or ipaddress.ip_address(addr).is_loopback
        except ValueError:
            return None
        if loopback:  # every process reaches the store over this host's loopback: all are here
            return int(size)
    return None


def choose(env: Mapping[str, str], cpus: int, embedded: bool) -> dict[str, str]:
    """The variables to set (see the module docstring); a pure function of its arguments."""
    if not embedded or config.env_flag("HPCDIST_MPI_TUNE", True, env) is False:
        return {}
    out: dict[str, str] = {}
    if not any(name in env for name in _UCX_MEM_VARS):
        out["UCX_MEM_EVENTS"] = "no"
    local = _local_processes(env)
    if local is not None and local > cpus and "MPIR_CVAR_ENABLE_HEAVY_YIELD" not in env:
        out["MPIR_CVAR_ENABLE_HEAVY_YIELD"] = "1"
    return out


def cpus() -> int:
    """The CPUs this process may run on (its affinity)."""
    from ..topology import affinity

    return len(affinity())


def apply(env: MutableMapping[str, str] | None = None) -> dict[str, str]:
    """Set :func:`choose`'s variables in ``env`` (``os.environ``) unless MPI is loaded already; return them."""
    env = os.environ if env is None else env
    if "mpi4py.MPI" in sys.modules:  # too late: MPI read its settings when it started
        return {}
    chosen = choose(env, cpus(), embedded_mpich(env))
    env.update(chosen)
    return chosen
