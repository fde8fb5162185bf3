"""`hpcdist run` and `hpcdist info` for real: processes under the embedded mpiexec."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from mpirun import Result, hpcdist_cli, run_within

ROOT = Path(__file__).resolve().parents[2]
LIMIT = 90  # seconds for one launched job


def hpcdist(*args: str, cwd: Path | None = None, env: dict | None = None, timeout: int = LIMIT) -> Result:
    """``python -m hpcdist ARGS`` (``env`` adds variables; a value None removes one)."""
    return hpcdist_cli(*args, cwd=cwd, env=env, timeout=timeout)


def write(tmp_path: Path, name: str, body: str) -> str:
    path = tmp_path / name
    path.write_text(textwrap.dedent(body))
    return str(path)


@pytest.mark.timeout(120)
def test_run_sets_torchrun_variables_and_passes_args(tmp_path):
    script = write(
        tmp_path,
        "env.py",
        """
        import os, sys
        keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "OMP_NUM_THREADS")
        line = " ".join(["ENV", *(os.environ[k] for k in keys), *sys.argv[1:]]) + chr(10)
        os.write(1, line.encode())  # one write: the two ranks' lines cannot interleave
        """,
    )
    proc = hpcdist("run", "-n", "2", script, "-n", "7", "--x", env={"OMP_NUM_THREADS": None})
    assert proc.returncode == 0, proc.stderr
    lines = sorted(line.split() for line in proc.stdout.splitlines() if line.startswith("ENV"))
    assert [ln[1:5] for ln in lines] == [["0", "2", "0", "2"], ["1", "2", "1", "2"]]
    assert lines[0][5] == "127.0.0.1" and lines[0][6] == lines[1][6]
    assert all(ln[7] == "1" for ln in lines)  # OMP_NUM_THREADS, as torchrun sets it when unset
    assert all(ln[8:] == ["-n", "7", "--x"] for ln in lines)
    assert proc.stderr.count("OMP_NUM_THREADS=1 in every rank (it was unset)") == 1, proc.stderr
    kept = hpcdist("run", "-n", "2", script, env={"OMP_NUM_THREADS": "3"})
    assert kept.returncode == 0 and "OMP_NUM_THREADS" not in kept.stderr, kept.stderr
    assert [ln.split()[7] for ln in kept.stdout.splitlines() if ln.startswith("ENV")] == ["3", "3"]


@pytest.mark.timeout(120)
def test_run_on_this_host_starts_mpi_as_a_launcher_free_world_would(tmp_path):
    """3 ranks on this host get mpi_env.choose's settings for 3 local processes (on this 2-CPU machine:
    MPICH's yielding waits), and the job runs with them."""
    from hpcdist.rendezvous import mpi_env

    keys = ("MPIR_CVAR_ENABLE_HEAVY_YIELD", "UCX_MEM_EVENTS")
    script = write(
        tmp_path,
        "tune.py",
        f"""
        import os
        import numpy as np
        import hpcdist as dist
        dist.init_process_group("mpi")
        x = np.ones(3)
        dist.all_reduce(x)
        os.write(1, ("TUNE " + repr([os.environ.get(k) for k in {keys!r}]) + f" {{x[0]:g}}" + chr(10)).encode())
        dist.destroy_process_group()
        """,
    )
    env = {k: None for k in (*keys, "HPCDIST_MPI_TUNE", "SLURM_JOB_ID", "PBS_JOBID", "LSB_JOBID", "PE_HOSTFILE")}
    proc = hpcdist("run", "-n", "3", script, env=env)
    assert proc.returncode == 0, proc.output
    want = mpi_env.choose({"LOCAL_WORLD_SIZE": "3"}, mpi_env.cpus(), mpi_env.embedded_mpich(os.environ))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("TUNE")]
    assert lines == [f"TUNE {[want.get(k) for k in keys]!r} 3"] * 3, proc.output


@pytest.mark.timeout(200)
@pytest.mark.parametrize(
    ("how", "named"),
    [
        ("os.kill(os.getpid(), signal.SIGKILL)", "killed by SIGKILL (signal 9: the kernel's out-of-memory killer"),
        ("ctypes.string_at(0)", "killed by SIGSEGV (signal 11: a crash in native code)"),
        ("os._exit(7)", "exited with status 7 outside Python's exit path (os._exit, or native code)"),
        (  # a job-wide SIGUSR1 first (as Slurm's --signal sends the process group): the later kill is still named
            "signal.signal(signal.SIGUSR1, lambda *a: None); os.killpg(0, signal.SIGUSR1); time.sleep(0.3); "
            "os.kill(os.getpid(), signal.SIGKILL)",
            "killed by SIGKILL (signal 9: ",
        ),
    ],
    ids=["sigkill", "segv", "os_exit", "usr1-then-sigkill"],
)
def test_a_rank_dying_outside_python_is_named(tmp_path, how, named):
    """SUSPECT: a rank killed by a signal of its own (the OOM killer's SIGKILL, a segfault) or leaving through
    os._exit after init_process_group gave only mpiexec's report (a pid) and `mpiexec exited with status N`.
    Now its warden names it, once, and no other rank (the launcher's SIGKILL of the others is theirs alone);
    with HPCDIST_RUN_WARDEN=0 the rank is the launcher's own process, as before, and is not named."""
    script = write(
        tmp_path,
        "die.py",
        f"""
        import ctypes, os, signal, time
        import numpy as np
        import hpcdist as dist
        dist.init_process_group("mpi")
        os.write(1, f"PPID {{dist.get_rank()}} {{os.getppid()}}" .encode() + bytes([10]))
        dist.barrier()
        if dist.get_rank() == 1:
            {how}
        dist.all_reduce(np.ones(4))
        """,
    )
    env = {"HPCDIST_TIMEOUT": "60", "HPCDIST_RUN_WARDEN": None, "PYTHONFAULTHANDLER": None}
    proc = hpcdist("run", "-n", "3", script, env=env)
    assert proc.returncode != 0, proc.output
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hpcdist run: rank")]
    assert len(lines) == 1 and lines[0].startswith(f"hpcdist run: rank 1 failed: {named}"), proc.output
    assert "Traceback" not in proc.stderr, proc.output  # the warden itself ended quietly
    off = hpcdist("run", "-n", "3", script, env={**env, "HPCDIST_RUN_WARDEN": "0"})
    assert off.returncode != 0 and "hpcdist run: rank" not in off.stderr, off.output
    assert "hpcdist run: mpiexec exited with status" in off.stderr, off.output
    parents = {ln.split()[2] for ln in off.stdout.splitlines() if ln.startswith("PPID")}
    assert len(parents) == 1, off.output  # without wardens every rank is the launcher's (Hydra's proxy's) child


@pytest.mark.timeout(120)
def test_a_rank_ended_by_a_signal_to_the_whole_job_is_not_blamed(tmp_path):
    """GUARD of the warden: SIGTERM sent to rank 1's process group (as Hydra and Slurm signal a job) ends it; the
    warden got the signal too, so no rank is named a failure: mpiexec's report and status stay the only word."""
    script = write(
        tmp_path,
        "term.py",
        """
        import os, signal
        import numpy as np
        import hpcdist as dist
        dist.init_process_group("mpi")
        dist.barrier()
        if dist.get_rank() == 1:
            os.killpg(0, signal.SIGTERM)
        dist.all_reduce(np.ones(4))
        """,
    )
    proc = hpcdist("run", "-n", "2", script, env={"HPCDIST_TIMEOUT": "60", "HPCDIST_RUN_WARDEN": None})
    assert proc.returncode != 0 and "Terminated (signal 15)" in proc.output, proc.output
    assert "hpcdist run: rank" not in proc.stderr and "hpcdist run: mpiexec exited with status" in proc.stderr


@pytest.mark.timeout(120)
def test_ranks_failing_alike_share_one_line_after_the_first_failure(tmp_path):
    """4 ranks before MPI is up: rank 2 fails first with its own error, then the others alike. The summary
    has the first failure's line first, then one line for the three that failed alike; the status is 3,
    rank 2's."""
    script = write(
        tmp_path,
        "fails.py",
        """
        import os, sys, time
        rank = int(os.environ["RANK"])
        if rank == 2:
            sys.exit(3)
        time.sleep(1.0)
        raise RuntimeError("shared storage unreachable")
        """,
    )
    proc = hpcdist("run", "-n", "4", script, env={"HPCDIST_ABORT_ON_EXCEPTION": "0"})
    lines = [ln for ln in proc.stderr.splitlines() if ln.startswith("hpcdist run: rank")]
    assert lines == [
        "hpcdist run: rank 2 failed: exited with status 3",
        "hpcdist run: ranks 0, 1, 3 failed: RuntimeError: shared storage unreachable",
    ], proc.output
    assert proc.returncode == 3, proc.output


@pytest.mark.timeout(120)
def test_run_forms_one_world_and_prefixes_output(tmp_path):
    script = write(
        tmp_path,
        "world.py",
        """
        import sys
        import numpy as np
        import hpcdist as dist
        dist.init_process_group("mpi")
        x = np.array([dist.get_rank() + 1.0])
        dist.all_reduce(x)
        sys.stdout.write(f"size {dist.get_world_size()} sum {x[0]:g}" + chr(10))  # one write per line
        dist.destroy_process_group()
        """,
    )
    proc = hpcdist("run", "-n", "2", "--prefix-output", script)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.splitlines()) == ["[rank 0] size 2 sum 3", "[rank 1] size 2 sum 3"]


@pytest.mark.timeout(120)
def test_run_module_form(tmp_path):
    (tmp_path / "mypkg").mkdir()
    (tmp_path / "mypkg" / "__init__.py").write_text("")
    (tmp_path / "mypkg" / "job.py").write_text(
        "import os, sys\nos.write(1, f\"MOD {__name__} {os.environ['RANK']} {sys.argv[1:]}\\n\".encode())\n"
    )
    proc = hpcdist("run", "-n", "2", "-m", "mypkg.job", "a", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert sorted(proc.stdout.split("\n"))[1:] == ["MOD __main__ 0 ['a']", "MOD __main__ 1 ['a']"]


@pytest.mark.timeout(120)
@pytest.mark.parametrize("init", [True, False], ids=["after-init", "before-init"])
def test_exception_on_rank_1_ends_job_traceback_once(tmp_path, init):
    script = write(
        tmp_path,
        "boom.py",
        f"""
        import os, time
        import hpcdist as dist
        if {init}:
            dist.init_process_group("mpi")
        def fail():
            raise ValueError("rank one is broken")
        if os.environ["RANK"] == "1":
            fail()
        if {init}:
            dist.barrier()  # rank 0 would wait here forever without the abort
        else:
            time.sleep(60)
        """,
    )
    proc = hpcdist("run", "-n", "2", script, timeout=60)
    assert proc.returncode != 0
    err = proc.stderr + proc.stdout
    assert err.count("ValueError: rank one is broken") == 2  # traceback once, summary line once
    assert "[rank 1] Traceback (most recent call last):" in err
    assert err.count("Traceback (most recent call last)") == 1
    assert '[rank 1]     raise ValueError("rank one is broken")' in err
    assert "hpcdist run: rank 1 failed: ValueError: rank one is broken" in proc.stderr
    assert "_bootstrap" not in err and "runpy" not in err


@pytest.mark.timeout(120)
def test_raise_systemexit_on_rank_1_ends_the_job(tmp_path):
    """``raise SystemExit(4)`` does not pass through sys.exit: the bootstrap notes it and the job ends with
    MPI_Abort, saying why (``hpcdist run`` ended such a job before too, from the rank's recorded status, but
    silently; under a bare mpiexec the same program waited for the timeout: test_faults.py)."""
    script = write(
        tmp_path,
        "leave.py",
        """
        import os
        from datetime import timedelta
        import hpcdist as dist
        dist.init_process_group("mpi", timeout=timedelta(seconds=600))
        if os.environ["RANK"] == "1":
            raise SystemExit(4)
        dist.barrier()  # rank 0 would wait here for 10 minutes
        """,
    )
    proc = hpcdist("run", "-n", "2", script, timeout=60)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    assert "hpcdist: exiting with status 4 while the process group is up" in proc.stderr


@pytest.mark.timeout(60)
def test_bad_input_one_line(tmp_path):
    for args, needle in (
        (("run", "-n", "0", "x.py"), "-n/--nprocs: expected an integer >= 1, got '0'"),
        (("run", "-n", "2", "missing.py"), "script 'missing.py' not found"),
        (("run", "-n", "2"), "missing program"),
        (("run", "--mpiexec", "/nonexistent/mpiexec", "-m", "x"), "--mpiexec: expected an executable file"),
    ):
        proc = hpcdist(*args, cwd=tmp_path, timeout=30)
        assert proc.returncode != 0
        assert proc.stderr.count("\n") == 1 and needle in proc.stderr, proc.stderr


@pytest.mark.timeout(60)
def test_failing_launcher_one_line(tmp_path):
    fake = tmp_path / "mpiexec"
    fake.write_text("#!/bin/sh\nexit 3\n")
    fake.chmod(0o755)
    script = write(tmp_path, "ok.py", "print('never')\n")
    proc = hpcdist("run", "-n", "2", "--mpiexec", str(fake), script, env={"OMP_NUM_THREADS": "1"}, timeout=30)
    assert proc.returncode == 3
    assert proc.stderr == "hpcdist run: mpiexec exited with status 3\n"


@pytest.mark.timeout(60)
def test_timeout_ends_job(tmp_path):
    script = write(tmp_path, "sleep.py", "import time\ntime.sleep(60)\n")
    proc = hpcdist("run", "-n", "2", "--timeout", "2", script, timeout=40)
    assert proc.returncode == 124
    assert "hpcdist run: timed out after 2 s" in proc.stderr


@pytest.mark.timeout(60)
def test_info_text_and_json():
    text = hpcdist("info", timeout=45)
    assert text.returncode == 0, text.stderr
    for needle in ("hpcdist:", "mpi4py", "library_version", "launcher:", "cuda_aware", "environment:"):
        assert needle in text.stdout
    js = hpcdist("info", "--json", timeout=45)
    data = json.loads(js.stdout)
    assert data["mpi"]["library_version"]
    assert data["mpi"]["kind"] in ("system", "embedded (mpich wheel from PyPI)")
    assert data["launcher"]["detected"].startswith("none")


@pytest.mark.timeout(60)
def test_info_under_mpiexec_sees_the_launcher():
    from hpcdist.launch.launchers import find_mpiexec

    mpiexec = find_mpiexec()
    if mpiexec is None:
        pytest.skip("no mpiexec")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [mpiexec, "-n", "1", sys.executable, "-m", "hpcdist", "info", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=45,
    )
    assert json.loads(proc.stdout)["launcher"]["detected"] in ("mpiexec", "intelmpi", "openmpi")


@pytest.mark.timeout(150)
def test_run_gives_the_launcher_the_descriptors_its_ranks_need(tmp_path):
    """Under a soft open-file limit of 48, Hydra's mpiexec failed to start 12 ranks ("pipe error (Too many open
    files)": about 4 descriptors per rank); hpcdist run raises the soft limit within the hard one first."""
    script = write(tmp_path, "up.py", "import os\nos.write(1, b'up' + os.environ['RANK'].encode() + bytes([10]))\n")
    cmd = f"ulimit -Sn 48 && exec {shlex.quote(sys.executable)} -m hpcdist run -n 12 {shlex.quote(script)}"
    proc = run_within(["bash", "-c", cmd], _cli_env(), 120, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(proc.stdout.split()) == sorted(f"up{r}" for r in range(12))


@pytest.mark.timeout(150)
def test_run_names_a_hard_open_file_limit_below_what_its_ranks_need(tmp_path):
    script = write(tmp_path, "up.py", "print('up')\n")
    cmd = f"ulimit -n 48 && exec {shlex.quote(sys.executable)} -m hpcdist run -n 12 {shlex.quote(script)}"
    proc = run_within(["bash", "-c", cmd], _cli_env(), 120, cwd=tmp_path)
    assert "12 ranks on one host may need about 352 open files" in proc.stderr and "ulimit -Hn" in proc.stderr
    assert proc.returncode != 0  # the launcher could not start them all


def _cli_env() -> dict[str, str]:
    """The environment :func:`hpcdist_cli` gives ``python -m hpcdist`` (this tree's hpcdist, outside Slurm)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("SLURM_JOB_ID", None)
    return env
