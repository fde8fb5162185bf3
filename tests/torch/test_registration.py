"""How backend "hpcdist" gets registered: import, entry point, ``hpcdist run --torch``; no MPI at import."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import ROOT, run_limited


def _python(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, PYTHONPATH=str(ROOT), **env)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, env=full)


def test_import_registers_without_touching_mpi() -> None:
    out = _python(
        """
        import sys
        import torch.distributed as dist
        import hpcdist.torch
        assert "HPCDIST" in dist.Backend._plugins, dist.Backend._plugins
        assert dist.Backend.backend_capability["hpcdist"] == ["cpu", "cuda"]
        assert "mpi4py.MPI" not in sys.modules, "importing hpcdist.torch initialized MPI"
        print("ok")
        """,
        HPCDIST_TORCH_AUTOLOAD="0",
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]


def test_autoload_opt_out() -> None:
    out = _python(
        """
        import torch.distributed as dist
        print("HPCDIST" in dist.Backend._plugins)
        """,
        HPCDIST_TORCH_AUTOLOAD="0",
    )
    assert out.returncode == 0 and out.stdout.strip() == "False", out.stderr[-2000:]


def test_hpcdist_run_torch(tmp_path: Path) -> None:
    """``hpcdist run --torch`` registers the backend for a script that never imports hpcdist."""
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(
            """
            import sys
            import torch, torch.distributed as dist
            dist.init_process_group("hpcdist")
            t = torch.full((2,), float(dist.get_rank() + 1))
            dist.all_reduce(t)
            print(f"rank {dist.get_rank()} sum {t[0].item():g} args {sys.argv[1:]}", flush=True)
            dist.destroy_process_group()
            """
        )
    )
    env = dict(os.environ, PYTHONPATH=str(ROOT), HPCDIST_TORCH_AUTOLOAD="0", PYTHONUNBUFFERED="1")
    hpcdist = [sys.executable, "-m", "hpcdist", "run", "-n", "2", "--torch", str(script), "x", "--y"]
    res = run_limited(hpcdist, env, 120)
    assert res.returncode == 0 and not res.timed_out, res.output[-3000:]
    for r in range(2):
        assert f"rank {r} sum 3 args ['x', '--y']" in res.stdout, res.output[-3000:]


def test_init_and_destroy_four_times_in_one_process(tmp_path: Path) -> None:
    """Each round rendezvouses afresh: destroy takes back the MASTER_ADDR/MASTER_PORT init exported."""
    from conftest import launch, load, torch

    launch(3, "reinit.py", "hpcdist", tmp_path, limit=180)
    for r in range(3):
        rounds = load(tmp_path, "reinit", r)
        assert len(rounds) == 4
        for before, x in rounds:
            assert before == {"MASTER_ADDR": None, "MASTER_PORT": None}
            assert torch.equal(x, torch.full((3,), 6.0))


def test_stale_torchrun_variables_under_mpiexec_are_refused_not_waited_on(tmp_path: Path) -> None:
    """RANK/WORLD_SIZE/MASTER_* inherited from a parent that ran init_process_group (a GPU test's child job
    hung so) make both ranks of an `mpiexec -n 2` claim rank 0 of 1: torch's env:// then waited forever or
    failed on a busy port. Every rank now raises a ValueError naming the variable, for gloo as for hpcdist."""
    from conftest import free_port, mpiexec

    script = tmp_path / "stale.py"
    script.write_text("import sys, torch.distributed as dist\ndist.init_process_group(sys.argv[1])\nprint('joined')\n")
    for backend in ("hpcdist", "gloo"):
        env = dict(os.environ, PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1", RANK="0", WORLD_SIZE="1")
        env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()))
        env.pop("TORCHELASTIC_RUN_ID", None)
        res = run_limited([mpiexec(), "-n", "2", sys.executable, str(script), backend], env, 90)
        assert not res.timed_out and res.returncode != 0, (backend, res.output[-3000:])
        assert "joined" not in res.stdout, (backend, res.output[-3000:])
        assert "world_size 1 from environment variable WORLD_SIZE contradicts the MPI launch" in res.stderr
        assert (
            "rank 0 from environment variable RANK contradicts the MPI launch (mpiexec), where this process "
            "is rank 1 of 2" in res.stderr
        ), (backend, res.output[-3000:])
