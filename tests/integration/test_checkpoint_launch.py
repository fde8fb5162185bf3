"""hpcdist.checkpoint across launches: a 4-rank save loaded at 1, 2 and 3 ranks; a save killed
with SIGKILL mid-write; the preemption example stopped by USR1 and resumed under mpiexec.

References are computed independently: the global array is ``np.arange``-based in each script,
and the resumed training is compared with an uninterrupted run of the same program.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from mpirun import ROOT, mpiexec, run_limited, run_mpi

pytest.importorskip("h5py")

SHAPE = (10, 6)

COMMON = """
import sys
from pathlib import Path
import numpy as np
import hpcdist as dist
from hpcdist import checkpoint as ck
SHAPE = (10, 6)
REF = (np.arange(60) * 1.5).reshape(SHAPE).astype(np.float32)
dist.init_process_group("mpi")
r, n = dist.get_rank(), dist.get_world_size()
path = Path(sys.argv[1])
"""

SAVE4 = (
    COMMON
    + """
sh = ck.Shard.even(SHAPE, 0, r, n)
state = {
    "model": {"w": ck.Sharded(REF[sh.slices()].copy(), sh), "b": np.arange(6, dtype=np.int16)},
    "bf16": ck.Sharded(REF[sh.slices()].astype("float32").view(np.uint32).astype(np.uint16), sh),
    "step": 41,
    "note": "saved at %d ranks" % n,
}
ck.save(state, path, layout=sys.argv[2])
print(f"rank {r} saved", flush=True)
dist.destroy_process_group()
"""
)

LOAD = (
    COMMON
    + """
ref_bf = REF.view(np.uint32).astype(np.uint16)
for dim, order in ((1, r), (0, n - 1 - r)):  # other slicings than the save's
    sh = ck.Shard.even(SHAPE, dim, order, n)
    w = np.zeros(sh.sizes, np.float32)
    bf = np.zeros(sh.sizes, np.uint16)
    state = {"model": {"w": ck.Sharded(w, sh), "b": np.zeros(6, np.int16)}, "bf16": ck.Sharded(bf, sh),
             "step": 0, "note": None}
    ck.load(state, path)
    assert np.array_equal(w, REF[sh.slices()]), (r, dim)
    assert np.array_equal(bf, ref_bf[sh.slices()]), (r, dim)
    assert state["model"]["b"].tolist() == list(range(6)) and state["step"] == 41 and state["note"] == "saved at 4 ranks"
print(f"rank {r} of {n} loaded ok", flush=True)
dist.destroy_process_group()
"""
)


H5PY_MPI = ROOT / "build" / "h5py-mpi"


def _save_env(layout: str) -> tuple[dict[str, str] | None, str | None]:
    """(extra environment, mpiexec) for a save in ``layout``; single-file needs scripts/h5py-mpi's build."""
    if layout == "per-rank":
        return None, None
    launcher = Path("/usr/bin/mpiexec.mpich")
    if not (H5PY_MPI / "site" / "h5py").is_dir() or not launcher.exists():
        pytest.skip("no parallel h5py (build one with scripts/h5py-mpi)")
    lib = H5PY_MPI / "lib"
    env = {
        "PYTHONPATH": f"{H5PY_MPI / 'site'}{os.pathsep}{ROOT}",
        "MPI4PY_LIBMPI": str(lib / "libmpi.so.12"),
        "LD_LIBRARY_PATH": str(lib),
    }
    return env, str(launcher)


@pytest.mark.parametrize("layout", ["per-rank", "single-file"])
def test_save_at_4_ranks_loads_at_1_2_3(tmp_path, layout):
    """Loads run with the venv's serial h5py and MPICH wheel, whatever layout wrote the checkpoint."""
    path = tmp_path / "ck4"
    env, launcher = _save_env(layout)
    script = tmp_path / "save4.py"
    script.write_text(SAVE4)
    full_env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", **(env or {})}
    full_env.pop("HPCDIST_TIMEOUT", None)
    res = run_limited([launcher or mpiexec(), "-n", "4", sys.executable, str(script), str(path), layout], full_env, 120)
    assert res.returncode == 0 and not res.timed_out, res.output
    files = sorted(p.name for p in path.iterdir())
    assert ("data.h5" in files) == (layout == "single-file"), files
    assert sum(f"rank {r} saved" in res.stdout for r in range(4)) == 4
    for n in (1, 2, 3):
        res = run_mpi(n, LOAD, tmp_path, args=[str(path)], limit=120)
        assert res.returncode == 0 and not res.timed_out, res.output
        for r in range(n):
            assert f"rank {r} of {n} loaded ok" in res.stdout, res.output


KILLED = (
    COMMON
    + """
import os
asynchronous = sys.argv[2] == "async"
small = {"marker": np.full(4, 1.0), "step": 1}
ck.save(small, path / "step_1")
print("saved step_1", flush=True)
big = {f"layer{i:03d}": np.full((512, 1024), float(i)) for i in range(32)}  # 128 MiB per rank
big["step"] = 2
for _ in range(50):  # keep saving until killed
    if asynchronous:
        ck.async_save(big, path / "step_2", overwrite=True).wait()
    else:
        ck.save(big, path / "step_2", overwrite=True)
"""
)

LOAD_LATEST = (
    COMMON
    + """
last = ck.latest(path)
state = {"marker": np.zeros(4), "step": 0}
ck.load(state, last)
assert last.name == "step_1" and state["step"] == 1 and state["marker"].tolist() == [1.0] * 4, (last, state)
print(f"rank {r} loaded {last.name}", flush=True)
"""
)


def _kill_when(cond, proc: subprocess.Popen, limit: float) -> bool:
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        if cond():
            os.killpg(proc.pid, signal.SIGKILL)
            return True
        if proc.poll() is not None:
            return False
        time.sleep(0.005)
    os.killpg(proc.pid, signal.SIGKILL)
    return False


@pytest.mark.parametrize("mode", ["sync", "async"])
@pytest.mark.parametrize("moment", ["temporary-directory", "rank-file"])
def test_sigkill_mid_save_leaves_previous_checkpoint(tmp_path, mode, moment):
    path = tmp_path / "ck"
    script = tmp_path / "killed.py"
    script.write_text(KILLED)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    env.pop("HPCDIST_TIMEOUT", None)
    proc = subprocess.Popen(
        [mpiexec(), "-n", "2", sys.executable, str(script), str(path), mode],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )

    def writing() -> bool:
        tmps = list(path.glob(".step_2.tmp-*")) if path.exists() else []
        if moment == "temporary-directory":
            return bool(tmps)
        return any(f.stat().st_size > (1 << 20) for t in tmps for f in t.glob("rank-*.h5"))

    try:
        killed = _kill_when(writing, proc, 120)
    finally:
        out = proc.communicate()[0].decode()
    assert killed, f"the save never reached the {moment} stage: {out}"
    assert "saved step_1" in out
    assert not (path / "step_2").exists()  # never committed
    res = run_mpi(2, LOAD_LATEST, tmp_path, args=[str(path)], limit=90)
    assert res.returncode == 0, res.output
    assert "rank 0 loaded step_1" in res.stdout and "rank 1 loaded step_1" in res.stdout


def _rank_pids(root: int, needle: str) -> list[int]:
    """The descendants of process ``root`` whose command line holds ``needle`` (the ranks, not the launcher)."""
    parent: dict[int, int] = {}
    cmds: dict[int, str] = {}
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            stat = (p / "stat").read_text()
            cmds[int(p.name)] = (p / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        parent[int(p.name)] = int(stat.rsplit(")", 1)[1].split()[1])

    def descends(pid: int) -> bool:
        while pid > 1:
            pid = parent.get(pid, 0)
            if pid == root:
                return True
        return False

    return sorted(
        pid
        for pid, cmd in cmds.items()
        if descends(pid) and needle in cmd and "mpiexec" not in cmd and "proxy" not in cmd
    )


def test_preemption_example_resumes_bit_identical(tmp_path):
    example = str(ROOT / "examples" / "checkpoint_resume.py")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    common = ["--steps", "60", "--every", "10"]
    ref = run_mpi_cmd([example, "--ckpt-dir", str(tmp_path / "ref"), *common, "--out", str(tmp_path / "ref.npy")], env)
    assert ref.returncode == 0 and "done: 60 steps" in ref.stdout, ref.stdout + ref.stderr

    ck = tmp_path / "ck"
    cmd = [mpiexec(), "-n", "2", sys.executable, example, "--ckpt-dir", str(ck), *common, "--sleep", "0.1"]
    cmd += ["--out", str(tmp_path / "final.npy")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (ck / "step_000010").exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.05)
        pids = _rank_pids(proc.pid, "checkpoint_resume.py")
        assert len(pids) == 2, pids
        os.kill(pids[-1], signal.SIGUSR1)  # one rank only: the flag is agreed at the next step
        out = proc.communicate(timeout=120)[0].decode()
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 0, out
    assert "preempted at step" in out and "not in a Slurm job" in out and "done:" not in out, out
    stopped = int(out.split("preempted at step ")[1].split(":")[0])
    assert 10 <= stopped < 60
    again = run_mpi_cmd([example, "--ckpt-dir", str(ck), *common, "--out", str(tmp_path / "final.npy")], env)
    assert f"resumed from step_{stopped:06d} at step {stopped}" in again.stdout, again.stdout + again.stderr
    assert "done: 60 steps" in again.stdout
    assert np.array_equal(np.load(tmp_path / "final.npy"), np.load(tmp_path / "ref.npy"))


def run_mpi_cmd(args: list[str], env: dict[str, str], n: int = 2) -> subprocess.CompletedProcess:
    return subprocess.run(
        [mpiexec(), "-n", str(n), sys.executable, *args], env=env, capture_output=True, text=True, timeout=180
    )
