"""Run every stage of the test suite with a hard time limit each.

Stages: lint (ruff), types (mypy), unit tests, MPI tests under ``mpiexec`` at
1, 2, 3 and 4 ranks, the checkpoint tests with parallel HDF5 (``mpio``, when
scripts/h5py-mpi has built h5py with MPI), the collectives' tests at 4 ranks forced through the
shared-memory engine (``HPCDIST_SHM=1``), integration tests (they launch their own processes),
the torch backend's tests (tests/torch), a subset of torch's own distributed
test suite on the backend "hpcdist", GPU tests (skip without a GPU), the Sphinx docs with warnings as errors.
Prints one closing line ``N passed, N failed, N skipped`` summed over the
pytest stages; exits non-zero when any stage failed.

Usage: python tests/run_all.py [--only STAGE[,STAGE]] [--ranks 1,2,3,4]
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from hpcdist.topology import affinity

ROOT = Path(__file__).resolve().parent.parent
PY = sys.executable


#: HPCDIST_WAIT per rank count: both wait modes run the whole MPI suite
WAIT_MODE = {1: "block", 2: "poll", 3: "block", 4: "poll"}


def stages(ranks: list[int], tmp: Path) -> list[tuple[str, list[str], Path | None, int]]:
    out: list[tuple[str, list[str], Path | None, int]] = [
        ("ruff", [PY, "-m", "ruff", "check", "hpcdist", "tests", "examples", "jobs"], None, 120),
        ("format", [PY, "-m", "ruff", "format", "--check", "hpcdist", "tests", "examples"], None, 120),
        ("mypy", [PY, "-m", "mypy", "hpcdist"], None, 300),
        ("unit", [PY, "-m", "pytest", "-q", "tests/unit", f"--junitxml={tmp / 'unit.xml'}"], tmp / "unit.xml", 600),
    ]
    mpiexec = shutil.which("mpiexec") or "mpiexec"
    for n in ranks:
        xml = tmp / f"mpi{n}.xml"
        cmd = [mpiexec, "-n", str(n), PY, str(ROOT / "tests" / "mpi_pytest.py"), "-q", "tests/mpi", f"--junitxml={xml}"]
        out.append((f"mpi-{n}-{WAIT_MODE.get(n, 'poll')}", cmd, xml, 600))
    if 3 in ranks:  # once more with every collective's fingerprint checked (TORCH_DISTRIBUTED_DEBUG=DETAIL)
        xml = tmp / "mpi3d.xml"
        cmd = [mpiexec, "-n", "3", PY, str(ROOT / "tests" / "mpi_pytest.py"), "-q", "tests/mpi", f"--junitxml={xml}"]
        out.append(("mpi-3-detail", cmd, xml, 600))
    mpio = mpio_stage(tmp)
    if mpio is not None:
        out.append(mpio)
    if 4 in ranks:  # the collectives' matrix once more, forced through shared memory with 64-byte slots (many chunks)
        xml = tmp / "shm4.xml"
        tests = ["tests/mpi/test_collectives.py", "tests/mpi/test_bucketing.py"]
        cmd = [mpiexec, "-n", "4", PY, str(ROOT / "tests" / "mpi_pytest.py"), "-q", *tests, f"--junitxml={xml}"]
        out.append(("shm-4", cmd, xml, 600))
    out.append(
        (
            "integration",
            [PY, "-m", "pytest", "-q", "tests/integration", f"--junitxml={tmp / 'integ.xml'}"],
            tmp / "integ.xml",
            1200,
        )
    )
    out.append(  # the torch backend "hpcdist": programs under mpiexec against torch's gloo (skips without torch)
        (
            "torch",
            [PY, "-m", "pytest", "-q", "tests/torch", f"--junitxml={tmp / 'torch.xml'}"],
            tmp / "torch.xml",
            900,
        )
    )
    out.append(  # torch's own distributed suite on backend "hpcdist", the CI subset (gloo's passes must pass)
        (
            "torch-suite",
            [PY, "-m", "pytest", "-q", "tests/torch_suite/test_ci_subset.py", f"--junitxml={tmp / 'torchsuite.xml'}"],
            tmp / "torchsuite.xml",
            900,
        )
    )
    out.append(("gpu", [PY, "-m", "pytest", "-q", "tests/gpu", f"--junitxml={tmp / 'gpu.xml'}"], tmp / "gpu.xml", 600))
    if (ROOT / "docs" / "conf.py").exists():
        out.append(
            (
                "docs",
                [PY, "-m", "sphinx", "-q", "-W", "--keep-going", "-b", "html", "docs", str(tmp / "html")],
                None,
                300,
            )
        )
    return out


#: h5py with parallel HDF5, built by scripts/h5py-mpi (absent: the stage is left out, with a note)
H5PY_MPI = ROOT / "build" / "h5py-mpi"


def mpio_stage(tmp: Path) -> tuple[str, list[str], Path | None, int] | None:
    """The checkpoint tests at 3 ranks with h5py's MPI-IO (single-file layout) under Debian's MPICH."""
    mpiexec = shutil.which("mpiexec.mpich") or "/usr/bin/mpiexec.mpich"
    if not (H5PY_MPI / "site" / "h5py").is_dir() or not Path(mpiexec).exists():
        print("note: stage mpio left out (no parallel h5py: run scripts/h5py-mpi to build one)", flush=True)
        return None
    xml = tmp / "mpio.xml"
    cmd = [mpiexec, "-n", "3", PY, str(ROOT / "tests" / "mpi_pytest.py"), "-q", "tests/mpi/test_checkpoint.py"]
    return ("mpio", [*cmd, f"--junitxml={xml}"], xml, 300)


def mpio_env(env: dict[str, str]) -> dict[str, str]:
    """What scripts/h5py-mpi's build needs: its h5py first on the path, mpi4py on Debian's libmpich."""
    lib = str(H5PY_MPI / "lib")
    return {
        **env,
        "PYTHONPATH": os.pathsep.join(p for p in (str(H5PY_MPI / "site"), env.get("PYTHONPATH", "")) if p),
        "MPI4PY_LIBMPI": str(H5PY_MPI / "lib" / "libmpi.so.12"),
        "LD_LIBRARY_PATH": os.pathsep.join(p for p in (lib, env.get("LD_LIBRARY_PATH", "")) if p),
    }


#: CPUs this process may use: an MPI stage with more ranks than these runs its MPICH with yielding waits
CPUS = len(affinity())


def _ranks(cmd: list[str]) -> int:
    """The ranks a stage's command launches (its ``mpiexec -n N``); 0 for a stage that launches none itself."""
    if len(cmd) > 2 and Path(cmd[0]).name.startswith("mpiexec") and cmd[1] == "-n":
        return int(cmd[2])
    return 0


def count(xml: Path) -> tuple[int, int, int]:
    """(passed, failed, skipped) from a JUnit XML file."""
    if not xml.exists():
        return (0, 1, 0)
    root = ET.parse(xml).getroot()
    suites = [root] if root.tag == "testsuite" else list(root)
    tests = failed = skipped = 0
    for s in suites:
        tests += int(s.get("tests", 0))
        failed += int(s.get("failures", 0)) + int(s.get("errors", 0))
        skipped += int(s.get("skipped", 0))
    return (tests - failed - skipped, failed, skipped)


def slowest(xml: Path, k: int = 5) -> list[tuple[float, str]]:
    """The ``k`` slowest tests of a JUnit XML file, (seconds, name), slowest first (for trimming CI time)."""
    if not xml.exists():
        return []
    cases = [
        (float(c.get("time", 0) or 0), f"{c.get('classname', '')}::{c.get('name', '')}")
        for c in ET.parse(xml).getroot().iter("testcase")
    ]
    return sorted(cases, reverse=True)[:k]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", default="", help="comma-separated stage names (prefix match)")
    ap.add_argument("--ranks", default="1,2,3,4")
    args = ap.parse_args()
    ranks = [int(x) for x in args.ranks.split(",") if x]
    only = [s for s in args.only.split(",") if s]
    env = dict(os.environ)
    env.setdefault("HPCDIST_TIMEOUT", "120")  # a mismatched collective in a test fails, never hangs
    # a hung MPI test reports itself (name, stacks) within 240 s: well inside its stage's 600 s limit, which
    # otherwise kills the job first when the hang starts after the stage's first 300 s
    env.setdefault("HPCDIST_TEST_DEADLINE", "240")
    env["PYTHONUNBUFFERED"] = "1"
    tot = [0, 0, 0]
    bad: list[str] = []
    t_all = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="hpcdist-ci-") as td:
        tmp = Path(td)
        for name, cmd, xml, limit in stages(ranks, tmp):
            if only and not any(name.startswith(o) for o in only):
                continue
            t0 = time.monotonic()
            print(f"\n===== stage {name}: {' '.join(cmd[:6])} ... (limit {limit}s)", flush=True)
            stage_env = dict(env)
            if _ranks(cmd) > CPUS:  # MPICH's waits give the CPU away, as hpcdist run sets it (docs/cli.md)
                stage_env.setdefault("MPIR_CVAR_ENABLE_HEAVY_YIELD", "1")
            if name.endswith("-detail"):
                stage_env["TORCH_DISTRIBUTED_DEBUG"] = "DETAIL"
            elif name.startswith("mpi-"):
                stage_env["HPCDIST_WAIT"] = name.rsplit("-", 1)[1]
            elif name == "mpio":
                stage_env = mpio_env(stage_env)
            elif name.startswith("shm-"):
                stage_env.update(HPCDIST_SHM="1", HPCDIST_SHM_SLOT="64")
            proc = subprocess.Popen(cmd, cwd=ROOT, env=stage_env, start_new_session=True)
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every rank it started
                proc.wait()
                rc = 124
                print(f"===== stage {name} ran past its {limit}s limit", flush=True)
            dt = time.monotonic() - t0
            if xml is not None:
                p, f, s = count(xml)
                if rc == 5 and f == 0:  # pytest: nothing ran (e.g. every GPU test module skipped)
                    rc = 0
                tot[0] += p
                tot[1] += f
                tot[2] += s
                print(f"===== stage {name}: rc={rc} {p} passed, {f} failed, {s} skipped in {dt:.0f}s", flush=True)
                for secs, test in slowest(xml):
                    print(f"      {secs:7.1f}s  {test}", flush=True)
            else:
                print(f"===== stage {name}: rc={rc} in {dt:.0f}s", flush=True)
            if rc != 0:
                bad.append(name)
    print(f"\nstages failed: {', '.join(bad) or 'none'}; total time {time.monotonic() - t_all:.0f}s")
    print(f"{tot[0]} passed, {tot[1]} failed, {tot[2]} skipped")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
