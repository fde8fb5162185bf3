"""``hpcdist info``: what a bug report needs, as text or ``--json``.

Versions (hpcdist, Python, mpi4py, NumPy, torch, CuPy, NCCL, h5py), the MPI
library (``MPI_Get_library_version``), whether it is the embedded one (the
``mpich`` wheel) or a system MPI and where it lives, the ``mpiexec`` that
``hpcdist run`` would use, the launcher that started this process, CUDA-aware
MPI support and why, and the relevant environment variables.

The MPI library is asked only what it can answer before ``MPI_Init``
(``hpcdist info`` imports ``mpi4py.MPI`` with ``rc.initialize = False``).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.metadata as md
import json
import os
import platform
import sys
from collections.abc import Callable, Mapping
from typing import Any

from hpcdist._launchenv import TORCHRUN_VARS

__all__ = ["ENV_NAMES", "ENV_PREFIXES", "collect", "format_text", "main"]

#: exact names of relevant variables (besides hpcdist's own knobs)
ENV_NAMES = (
    *TORCHRUN_VARS,
    "CUDA_VISIBLE_DEVICES",
    "TORCH_DISTRIBUTED_DEBUG",
    "LD_LIBRARY_PATH",
)
#: prefixes of relevant variables
ENV_PREFIXES = ("HPCDIST_", "SLURM_", "PMI_", "PMIX_", "OMPI_", "MPI4PY_", "I_MPI_", "MPICH_", "MPIR_CVAR_")
_SECRET_WORDS = ("SECRET", "TOKEN", "PASSWORD", "KEY")


def _version(dist: str) -> str | None:
    try:
        return md.version(dist)
    except md.PackageNotFoundError:
        return None


def _mpi(initialize: bool) -> dict[str, Any]:
    """MPI library, its version, its file and whether it is the embedded wheel's."""
    out: dict[str, Any] = {"mpi4py": _version("mpi4py")}
    try:
        import mpi4py

        if "mpi4py.MPI" not in sys.modules and not initialize:
            mpi4py.rc.initialize = False
            mpi4py.rc.finalize = False
        from mpi4py import MPI
    except Exception as exc:  # an mpi4py without a loadable libmpi
        out["error"] = f"{type(exc).__name__}: {exc}"
        return out
    out["library_version"] = MPI.Get_library_version().strip()
    out["standard"] = "{}.{}".format(*MPI.Get_version())
    out["library_path"] = _loaded_libmpi()
    out["embedded"] = _is_embedded(out["library_path"])
    out["kind"] = "embedded (mpich wheel from PyPI)" if out["embedded"] else "system"
    out["mpich_wheel"] = _version("mpich")
    return out


def _loaded_libmpi() -> str | None:
    """The libmpi this process mapped (Linux: /proc/self/maps)."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.split()[-1] if len(line.split()) >= 6 else ""
                base = os.path.basename(path)
                if base.startswith(("libmpi.so", "libmpich.so", "libmpi_", "impi.so", "libmpi_ibm")):
                    return path
    except OSError:
        return None
    return None


def _is_embedded(libpath: str | None) -> bool:
    if not libpath or _version("mpich") is None:
        return False
    try:
        files = md.distribution("mpich").files or []
    except md.PackageNotFoundError:
        return False
    root = md.distribution("mpich").locate_file("")
    real = os.path.realpath(libpath)
    return any(os.path.realpath(str(root / f)) == real for f in files if "libmpi" in str(f))


def _launcher(env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    try:
        from hpcdist.rendezvous.detect import detect_launcher, launcher_rank_size
    except ImportError:
        return {"detected": "unknown (hpcdist.rendezvous.detect not available)"}
    out["detected"] = detect_launcher(env) or "none (not started by a launcher)"
    rs = launcher_rank_size(env)
    out["rank_size"] = list(rs) if rs else None
    from hpcdist.launch.launchers import find_mpiexec

    out["mpiexec"] = find_mpiexec()
    import shutil

    out["srun"] = shutil.which("srun")
    out["slurm_allocation"] = env.get("SLURM_JOB_ID")
    out["open_files"] = _open_files()
    if detect_launcher(env) is None:  # a launcher-free init_process_group would start MPI with these
        from hpcdist.rendezvous.mpi_env import choose, cpus, embedded_mpich

        try:
            chosen = choose(env, cpus(), embedded_mpich(env))
        except ValueError as exc:  # a garbled HPCDIST_MPI_TUNE: reported, as init_process_group would raise it
            out["launcher_free_mpi"] = f"error: {exc}"
        else:
            out["launcher_free_mpi"] = " ".join(f"{k}={v}" for k, v in chosen.items()) or "none"
    return out


def _open_files() -> str | None:
    """This process's open-file limits, and the job size they bound: rank 0 holds about three connections per
    rank (its store server's two, the liveness one), raising its soft limit as far as the hard one
    (:mod:`hpcdist._descriptors`)."""
    from hpcdist._descriptors import UNLIMITED, limits

    now = limits()
    if now is None:  # pragma: no cover - not POSIX
        return None
    soft, hard = now

    def shown(n: int) -> str:
        return "unlimited" if n == UNLIMITED else str(n)

    most = "no limit" if hard == UNLIMITED else f"about {hard // 3} ranks"
    return (
        f"soft {shown(soft)}, hard {shown(hard)}: rank 0 holds about 3 per rank and raises the soft limit as "
        f"needed, up to the hard one ({most})"
    )


def _find_cuda_probe() -> Callable[..., Any] | None:
    """hpcdist's CUDA-aware MPI detection, where its GPU support provides one."""
    try:
        from hpcdist.gpu.cuda_aware import cuda_aware_mpi

        return cuda_aware_mpi
    except ImportError:
        pass
    try:
        hpcdist = importlib.import_module("hpcdist")
    except Exception:
        return None
    return getattr(hpcdist, "cuda_aware_mpi", None) or getattr(hpcdist, "cuda_aware", None)


def _cuda_aware() -> dict[str, Any]:
    """CUDA-aware MPI: the answer of hpcdist's GPU support, and why."""
    probe = _find_cuda_probe()
    if probe is None:
        return {"cuda_aware": None, "why": "unknown (no GPU support module)"}
    try:
        result = probe()
    except Exception as exc:
        return {"cuda_aware": None, "why": f"unknown ({type(exc).__name__}: {exc})"}
    if isinstance(result, tuple) and len(result) == 2:
        enabled, why, source = bool(result[0]), str(result[1]), None
    else:
        enabled = bool(getattr(result, "enabled", result))
        why = str(getattr(result, "reason", "") or "as reported by hpcdist's GPU support")
        source = getattr(result, "source", None)
    mpi = sys.modules.get("mpi4py.MPI")
    if source == "default" and not (mpi is not None and mpi.Is_initialized()):
        why += " (MPI was not initialized, so the library was not asked: use hpcdist info --init-mpi)"
    return {"cuda_aware": enabled, "source": source, "why": why}


def _torch() -> dict[str, Any]:
    version = _version("torch")
    if version is None:
        return {"version": None}
    try:
        import torch
    except Exception as exc:
        return {"version": version, "error": f"{type(exc).__name__}: {exc}"}
    out: dict[str, Any] = {"version": torch.__version__, "cuda": torch.version.cuda}
    out["cuda_available"] = bool(torch.cuda.is_available())
    try:
        out["nccl"] = ".".join(map(str, torch.cuda.nccl.version())) if torch.version.cuda else None
    except Exception:
        out["nccl"] = None
    return out


def _cupy() -> dict[str, Any]:
    dists = [d for d in ("cupy", "cupy-cuda12x", "cupy-cuda11x", "cupy-cuda13x") if _version(d)]
    if not dists:
        return {"version": None}
    out: dict[str, Any] = {"version": _version(dists[0]), "distribution": dists[0]}
    try:
        import cupy

        out["devices"] = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:
        out["devices"] = 0
        out["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    try:
        from cupy.cuda import nccl

        out["nccl"] = str(nccl.get_version())
    except Exception:
        out["nccl"] = None
    return out


def _environment(env: Mapping[str, str]) -> dict[str, str]:
    try:
        from hpcdist.config import KNOBS

        knobs = set(KNOBS)
    except ImportError:
        knobs = set()
    out = {}
    for name in sorted(env):
        if name in knobs or name in ENV_NAMES or name.startswith(ENV_PREFIXES):
            secret = any(word in name for word in _SECRET_WORDS)
            out[name] = "<set, hidden>" if secret else env[name]
    return out


def _settings() -> dict[str, Any]:
    """Every ``HPCDIST_*`` value of this process that hpcdist would refuse, with the error it would raise."""
    from .config import problems

    bad = problems()
    return {"errors": bad} if bad else {"errors": "none: every HPCDIST_* variable set has a valid value"}


def _shared_memory() -> dict[str, Any]:
    """The shared-memory engine's setting and the path each host collective takes (ranks on one node)."""
    from . import config
    from .backends.shm import table

    try:
        mode = config.shm_mode()
    except ValueError as exc:
        return {"error": str(exc)}
    out: dict[str, Any] = {
        "mode": {"auto": "auto (the table)", "on": "on (HPCDIST_SHM=1)", "off": "off (HPCDIST_SHM=0)"}[mode]
    }
    try:
        out["slot_bytes"] = config.shm_slot_bytes()
    except ValueError as exc:
        out["slot_bytes"] = str(exc)
    try:
        direct = config.shm_direct()
        out["direct_reads"] = (
            "on where the OS allows it (HPCDIST_SHM_DIRECT=1): all_reduce, broadcast, all_gather, reduce_scatter"
            if direct
            else "off (HPCDIST_SHM_DIRECT=1 turns them on)"
        )
    except ValueError as exc:
        out["direct_reads"] = str(exc)
    out["symmetric_memory"] = (
        "arrays of hpcdist.symmetric_memory.empty are read where they lie by all_reduce, broadcast, "
        "all_gather_into_tensor (input), reduce_scatter_tensor (input) where the path is shm"
        if mode != "off"
        else "allocations work; every collective takes MPI (HPCDIST_SHM=0)"
    )
    try:
        sel = table.active(mode)
    except ValueError as exc:
        out["table"] = f"{exc}; groups built now raise this"
        return out
    out["table"] = sel.label()
    out["paths"] = {
        op: "; ".join(f"{k} ranks: {table.describe(op, k, mode, rows=sel.rows)}" for k in (2, 4)) for op in table.OPS
    }
    if mode == "auto":
        out["oversubscribed"] = "more ranks on a node than its CPUs: shm for every operation at every size"
    return out


def collect(env: Mapping[str, str] | None = None, initialize_mpi: bool = False) -> dict[str, Any]:
    """Everything ``hpcdist info`` reports, as a JSON-ready dict.

    With ``initialize_mpi=False`` (the command's default) mpi4py is imported
    without ``MPI_Init`` when it was not imported yet; a program that calls
    this and later ``init_process_group`` should pass ``True`` or import
    mpi4py.MPI first.
    """
    env = os.environ if env is None else env
    from hpcdist._version import __version__

    return {
        "hpcdist": {"version": __version__, "path": os.path.dirname(os.path.abspath(__file__))},
        "python": {"version": platform.python_version(), "executable": sys.executable, "platform": platform.platform()},
        "mpi": _mpi(initialize_mpi),
        "launcher": _launcher(env),
        "gpu": {**_cuda_aware(), "torch": _torch(), "cupy": _cupy()},
        "packages": {name: _version(name) for name in ("numpy", "h5py", "matplotlib", "tqdm", "mpich")},
        "shared_memory": _shared_memory(),
        "settings": _settings(),
        "environment": _environment(env),
    }


def _fmt(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return " ".join(map(str, value))
    return str(value)


def format_text(report: Mapping[str, Any]) -> str:
    """The report as aligned ``section.key: value`` text."""
    lines = []
    for section, body in report.items():
        lines.append(f"{section}:")
        if section == "environment" and not body:
            lines.append("  (none of the relevant variables is set)")
        for key, value in body.items():
            if isinstance(value, dict):
                for sub, subvalue in value.items():
                    lines.append(f"  {key + '.' + sub:<22} {_fmt(subvalue)}")
            elif key == "library_version" and isinstance(value, str) and "\n" in value:
                first, *rest = value.splitlines()
                lines.append(f"  {key:<22} {first}")
                lines.extend(f"  {'':<22} {line}" for line in rest[:3])
            else:
                lines.append(f"  {key:<22} {_fmt(value)}")
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    """Entry point of ``hpcdist info``."""
    parser = argparse.ArgumentParser(prog="hpcdist info", description="Report versions, MPI, launcher and GPU support.")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    parser.add_argument(
        "--init-mpi", action="store_true", help="initialise MPI first, so the library can answer CUDA-awareness queries"
    )
    args = parser.parse_args(argv)
    report = collect(initialize_mpi=args.init_mpi)
    print(json.dumps(report, indent=2, sort_keys=False) if args.json else format_text(report))
    return 0
