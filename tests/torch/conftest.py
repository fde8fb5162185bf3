"""Shared by the tests of the torch backend: launch a program of progs/ under mpiexec, load its output.

Every program runs with backend "hpcdist" and with torch's own "gloo" (on
loopback, MASTER_ADDR/MASTER_PORT set here) and saves per-rank results with
``progs/common.save``; the tests compare the two and known answers.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from hpcdist._launchenv import free_port as _free_port
from hpcdist.topology import affinity

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "integration"))

from mpirun import ROOT, Result, mpiexec, run_limited  # noqa: E402

torch = pytest.importorskip("torch", reason="the torch backend tests need torch")
PROGS = HERE / "progs"


def free_port() -> int:
    """A port for MASTER_PORT, below the ephemeral range (hpcdist._launchenv.free_port)."""
    return _free_port("127.0.0.1")


def launch(
    n: int,
    prog: str,
    backend: str,
    out: Path,
    *,
    args: list[str] | None = None,
    env: dict[str, str] | None = None,
    limit: float = 240,
) -> Result:
    """Run progs/``prog`` on ``n`` ranks with ``backend``, saving into ``out``; fail the test if it fails."""
    out.mkdir(parents=True, exist_ok=True)
    full = dict(os.environ)
    full.pop("HPCDIST_TIMEOUT", None)
    full.update({"PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1", "HPCDIST_TIMEOUT": "120"})
    full["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(PROGS), full.get("PYTHONPATH", "")])
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        full.pop(k, None)
    if backend in ("gloo", "torch.distributed"):  # torch's own rendezvous (env://)
        full.update({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(free_port())})
    if n > len(affinity()):  # MPICH's waits yield, as hpcdist run sets it for ranks that outnumber the CPUs
        full.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
    full.update(env or {})
    cmd = [mpiexec(), "-n", str(n), sys.executable, str(PROGS / prog), backend, str(out), *(args or [])]
    res = run_limited(cmd, full, limit)
    assert not res.timed_out, f"{prog} on {backend} ran past {limit}s:\n{res.output[-4000:]}"
    assert res.returncode == 0, f"{prog} on {backend} failed (rc {res.returncode}):\n{res.output[-4000:]}"
    return res


def launch_both(
    n: int,
    prog: str,
    factory: pytest.TempPathFactory,
    *,
    args: Callable[[Path], list[str]] | None = None,
    limit: float = 240,
    backends: tuple[str, ...] = ("hpcdist", "gloo"),
) -> dict[str, list[Any]]:
    """Run progs/``prog`` on ``n`` ranks with "hpcdist" and with gloo; each rank's saved output, by backend.

    ``prog`` saves under its own stem (``progs/common.save``); ``args(d)`` gives its
    arguments after the output directory ``d``. ``backends``: the first arguments to pass instead
    ("torch.distributed" gets gloo's MASTER_ADDR/MASTER_PORT).
    """
    out: dict[str, list[Any]] = {}
    for backend in backends:
        d: Path = factory.mktemp(f"{Path(prog).stem}-{backend}")
        launch(n, prog, backend, d, args=args(d) if args else None, limit=limit)
        out[backend] = [load(d, Path(prog).stem, r) for r in range(n)]
    return out


def torchrun(n: int, prog: str, backend: str, out: Path, limit: float = 240) -> Result:
    """Run progs/``prog`` under torchrun (no MPI launcher: the ranks join over MPI ports)."""
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1", OMP_NUM_THREADS="1", HPCDIST_TIMEOUT="120")
    for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(k, None)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), str(PROGS)])
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "--master-addr", "127.0.0.1"]
    cmd += ["--master-port", str(free_port()), str(PROGS / prog), backend, str(out)]
    res = run_limited(cmd, env, limit)
    assert not res.timed_out and res.returncode == 0, f"{prog} under torchrun failed:\n{res.output[-3000:]}"
    return res


def load(out: Path, name: str, rank: int) -> Any:
    return torch.load(out / f"{name}.rank{rank}.pt", weights_only=False)


def same(a: Any, b: Any) -> bool:
    """Bit-identical tensors (dtype, shape, values), recursively through lists, tuples and dicts."""
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return a.dtype == b.dtype and a.shape == b.shape and bool(torch.equal(a, b))
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    return bool(a == b)
