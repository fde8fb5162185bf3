"""The per-rank bootstrap's pieces and `hpcdist info`'s report, in-process."""

from __future__ import annotations

import io
import json
import subprocess
import sys
import textwrap

import pytest

from hpcdist import cli, info
from hpcdist.info import collect, format_text
from hpcdist.launch._bootstrap import PrefixWriter, _parse, map_gpu, set_torchrun_env
from hpcdist.launch.ranks import RankInfo, rank_info


def test_prefix_writer_whole_lines_once():
    buf = io.StringIO()
    w = PrefixWriter(buf, "[rank 3] ")
    w.write("a")
    w.write(" b\nc\n")
    w.write("[rank 3] already\n")
    w.write("tail")
    assert buf.getvalue() == "[rank 3] a b\n[rank 3] c\n[rank 3] already\n"
    w.flush()
    assert buf.getvalue().endswith("[rank 3] tail")


def test_bootstrap_argv():
    assert _parse(["--prefix-output", "--status-dir", "/d", "--", "s.py", "--prefix-output"]) == (
        {"prefix_output": True, "status_dir": "/d", "map_gpu": False},
        ["s.py", "--prefix-output"],
    )
    assert _parse(["-m", "mod", "x"])[1] == ["-m", "mod", "x"]


@pytest.mark.parametrize(
    "env, expected",
    [
        ({}, RankInfo(None, 0, 1, 0, 1)),
        (
            {"PMI_RANK": "1", "PMI_SIZE": "4", "MPI_LOCALRANKID": "1", "MPI_LOCALNRANKS": "2"},
            RankInfo("mpiexec", 1, 4, 1, 2),
        ),
        (
            {
                "SLURM_PROCID": "3",
                "SLURM_NTASKS": "4",
                "SLURM_STEP_ID": "0",
                "SLURM_LOCALID": "1",
                "SLURM_GTIDS": "2,3",
            },
            RankInfo("srun", 3, 4, 1, 2),
        ),
        (
            {
                "OMPI_COMM_WORLD_RANK": "2",
                "OMPI_COMM_WORLD_SIZE": "3",
                "OMPI_COMM_WORLD_LOCAL_RANK": "0",
                "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
            },
            RankInfo("openmpi", 2, 3, 0, 1),
        ),
    ],
)
def test_rank_info(env, expected):
    assert rank_info(env) == expected


def test_torchrun_variables():
    env: dict[str, str] = {"SLURM_JOB_NODELIST": "gpu[07-08]", "SLURM_JOB_ID": "12345"}
    set_torchrun_env(RankInfo("srun", 5, 8, 1, 4), env)
    assert env["RANK"] == "5" and env["WORLD_SIZE"] == "8"
    assert env["LOCAL_RANK"] == "1" and env["LOCAL_WORLD_SIZE"] == "4"
    assert env["MASTER_ADDR"] == "gpu07" and env["MASTER_PORT"] == str(20000 + 12345 % 20000)
    kept = {"MASTER_ADDR": "h", "MASTER_PORT": "7"}
    set_torchrun_env(RankInfo(None, 0, 1, 0, 1), kept)
    assert (kept["MASTER_ADDR"], kept["MASTER_PORT"]) == ("h", "7")


@pytest.fixture(autouse=True)
def no_mpi_import(monkeypatch):
    """Keep mpi4py.MPI out of this process (other unit tests may initialise MPI); `hpcdist info`
    with the real library runs in tests/integration/test_cli_run.py."""
    monkeypatch.setattr(info, "_mpi", lambda initialize: {"mpi4py": "x", "library_version": "Fake MPI 1.0\nline 2"})


def test_info_report_and_secrets_hidden():
    report = collect({"HPCDIST_STORE_SECRET": "s3cret", "SLURM_JOB_ID": "9", "HOME": "/root"})
    assert set(report) >= {"hpcdist", "python", "mpi", "launcher", "gpu", "packages", "environment"}
    assert report["environment"] == {"HPCDIST_STORE_SECRET": "<set, hidden>", "SLURM_JOB_ID": "9"}
    assert "s3cret" not in format_text(report) and "s3cret" not in json.dumps(report)
    assert report["gpu"]["why"]


def test_info_reports_the_open_file_limits_and_the_job_size_they_bound():
    """Run under limits set before the interpreter starts (soft 512, hard 3000): hpcdist info names both, and the
    ~3 descriptors per rank that rank 0 needs make the hard limit good for about 1000 ranks."""
    import resource
    import subprocess
    import sys

    code = "from hpcdist.info import _launcher; print(_launcher({'RANK': '0'})['open_files'])"
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_NOFILE, (512, 3000)),
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == (
        "soft 512, hard 3000: rank 0 holds about 3 per rank and raises the soft limit as needed, up to the hard one "
        "(about 1000 ranks)"
    )


def test_info_cli_json(capsys):
    assert cli.main(["info", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mpi"]["mpi4py"] and data["python"]["version"]


@pytest.mark.parametrize(
    "visible, local_rank, local_size, device",
    [
        (None, 1, 4, "1"),
        ("4,5,6,7", 2, 4, "6"),
        ("0,1", 3, 4, "1"),
        ("GPU-ab,GPU-cd", 0, 2, "GPU-ab"),
        ("", 1, 4, ""),  # no GPU visible stays so (it exposed GPU 1 before)
        (" , ", 0, 2, ""),
    ],
)
def test_map_gpu(visible, local_rank, local_size, device):
    env = {} if visible is None else {"CUDA_VISIBLE_DEVICES": visible}
    assert map_gpu(RankInfo("srun", 0, 8, local_rank, local_size), env) == device
    assert env["CUDA_VISIBLE_DEVICES"].strip(" ,") == device


@pytest.mark.parametrize(
    ("status", "said"),
    [
        (9, "killed by SIGKILL (signal 9: the kernel's out-of-memory killer, or a kill -9)"),
        (11, "killed by SIGSEGV (signal 11: a crash in native code)"),
        (10, "killed by SIGUSR1 (signal 10: sent to this rank alone)"),
        (5 << 8, "exited with status 5 outside Python's exit path (os._exit, or native code)"),
    ],
)
def test_the_wardens_words_for_how_a_rank_ended(status, said):
    """The wait status decoded by os.WIFSIGNALED/WTERMSIG/WEXITSTATUS (a wait status is signal | exit << 8)."""
    from hpcdist.launch._bootstrap import _death

    assert _death(status) == said


def test_at_least_raises_the_soft_open_file_limit_within_the_hard_one():
    """``_descriptors.at_least`` (hpcdist run's launcher inherits what it sets): it raises, never lowers, and stops
    at the hard limit. Run in a child process: the limits are the process's."""
    code = textwrap.dedent(
        """
        import resource
        from hpcdist._descriptors import at_least
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        top = 1 << 20 if hard == resource.RLIM_INFINITY else min(hard, 1 << 20)  # the kernel's default nr_open cap
        resource.setrlimit(resource.RLIMIT_NOFILE, (64, hard))
        print(at_least(100), at_least(80), resource.getrlimit(resource.RLIMIT_NOFILE)[0])
        print(at_least(top + 1000) == (100, top), resource.getrlimit(resource.RLIMIT_NOFILE)[0] == top)
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True)
    assert out.stdout.split("\n")[:2] == ["(64, 100) None 100", "True True"], out.stdout + out.stderr
