"""`hpcdist run` beside the real torchrun (``python -m torch.distributed.run``): the same child scripts
under both, comparing what a rank sees (torchrun's variables, ``sys.argv``, ``__file__``, ``sys.path[0]``,
cwd) and what the caller sees (exit status, which ranks are ended, output, signals, argument errors).

Docstrings classify each test: ``GUARD:`` passed from the start; ``SUSPECT:`` found `hpcdist run`
differing in a way a torchrun user trips on, fixed (the test failed before the fix); ``DOCUMENTED:`` a
deliberate difference (hpcdist run is MPI-launched, there is no elastic agent), tested as written in
docs/cli.md "`hpcdist run`"; xfail-strict tests are known differences documented there.

Which variables matter, read off torch 2.13's ``elastic/agent/server/local_elastic_agent.py``:
``RANK``/``LOCAL_RANK``/``WORLD_SIZE``/``LOCAL_WORLD_SIZE`` (every torch program), ``GROUP_RANK``/
``GROUP_WORLD_SIZE`` (the node: Lightning's TorchElasticEnvironment needs ``GROUP_RANK`` to see a
torchrun launch), ``ROLE_*`` and ``TORCHELASTIC_RESTART_COUNT``/``MAX_RESTARTS`` (resume logic reads the
restart count) must be equal; ``MASTER_ADDR`` equal, ``MASTER_PORT`` one port for all ranks (each
launcher picks its own); ``OMP_NUM_THREADS`` 1 when unset; unbuffered output (torchrun runs ``python -u``,
hpcdist run sets ``PYTHONUNBUFFERED``). The agent's own variables (``TORCHELASTIC_RUN_ID``,
``TORCHELASTIC_USE_AGENT_STORE``, ``TORCHELASTIC_ERROR_FILE``) describe a torchrun agent that hpcdist run
does not have: they stay unset. ``TORCH_NCCL_ASYNC_ERROR_HANDLING`` (torchrun: 1 unless set) only
concerns torch's own NCCL process group and is left to torch's default.

Every launch has a hard time limit (``mpirun.run_within``); the file takes about a minute on 2 cores.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest
from mpirun import ROOT, Result, _processes, kill_tree, run_within

from hpcdist._launchenv import free_port

pytest.importorskip("torch")  # the reference launcher
pytestmark = pytest.mark.timeout(180)  # a net under the launches' own limits

PY = sys.executable
LIMIT = 20  # seconds for one launch
REFERENCE_LIMIT = 30  # for one of torchrun's, which run 3 at a time
ENV_KEYS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "ROLE_NAME",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "TORCHELASTIC_USE_AGENT_STORE",
    "TORCHELASTIC_ERROR_FILE",
    "OMP_NUM_THREADS",
)
# what a parent (a torchrun or hpcdist run job running these tests) may have left: each launch starts clean
_INHERITED = (*ENV_KEYS, "PYTHONUNBUFFERED", "SLURM_JOB_ID", "HPCDIST_TIMEOUT", "TORCH_NCCL_ASYNC_ERROR_HANDLING")

PROBE = f"""
import json, os, sys
os.write(1, ("PROBE " + json.dumps({{
    "env": {{k: os.environ.get(k) for k in {ENV_KEYS!r}}},
    "argv": sys.argv, "file": __file__, "name": __name__, "path0": sys.path[0], "cwd": os.getcwd(),
    "unbuffered": sys.stdout.write_through,
}}) + chr(10)).encode())
sys.stdout.write("OUT " + os.environ["RANK"] + chr(10))
sys.stderr.write("ERR " + os.environ["RANK"] + chr(10))
"""

# rank 1 fails as argv[1] says; rank 0 says its pid and sleeps (a job that is not ended takes 30 s)
FAIL = """
import os, signal, sys, time
rank = int(os.environ["RANK"])
os.write(1, f"PID {rank} {os.getpid()}\\n".encode())
if rank == 1:
    time.sleep(0.5)
    how = sys.argv[1]
    if how == "exit3":
        sys.exit(3)
    if how == "raise":
        raise ValueError("rank one is broken")
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    if how == "os_exit5":
        os._exit(5)
    if how == "exit0":
        sys.exit(0)
time.sleep(float(os.environ.get("SLEEP", "30")))
os.write(1, f"DONE {rank}\\n".encode())
"""

SLEEPER = "import os, time\nos.write(1, f'READY {os.getpid()}\\n'.encode())\ntime.sleep(30)\n"


def clean_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _INHERITED}
    env["PYTHONPATH"] = str(ROOT)
    env.update(extra)
    return env


def torchrun(n: int, *program: str) -> list[str]:
    head = [PY, "-m", "torch.distributed.run", "--nproc-per-node", str(n), "--master-addr", "127.0.0.1"]
    return [*head, "--master-port", str(free_port("127.0.0.1")), *program]


def hpcdist_run(n: int, *program: str) -> list[str]:
    return [PY, "-m", "hpcdist", "run", "-n", str(n), *program]


def launch(cmd: list[str], cwd: Path, limit: float = LIMIT, **env: str) -> Result:
    return run_within(cmd, clean_env(**env), limit, cwd=cwd)


def probes(res: Result) -> list[dict]:
    """The PROBE lines of a launch, by rank."""
    out = [json.loads(ln[6:]) for ln in res.stdout.splitlines() if ln.startswith("PROBE ")]
    return sorted(out, key=lambda d: int(d["env"]["RANK"]))


def pids(res: Result) -> dict[int, int]:
    return {int(r): int(p) for _, r, p in (ln.split() for ln in res.stdout.splitlines() if ln.startswith("PID "))}


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def ended(pid: int, within: float = 5.0) -> bool:
    """Whether ``pid`` is gone within ``within`` s; kills it when not (the test fails, nothing is left)."""
    deadline = time.monotonic() + within
    while alive(pid):
        if time.monotonic() > deadline:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
            return False
        time.sleep(0.05)
    return True


@pytest.fixture(scope="module")
def work(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """probe.py in sub/ with link.py (a symlink) beside sub/, a package pkg/mod.py, fail.py, sleeper.py."""
    d = tmp_path_factory.mktemp("run-vs-torchrun")
    (d / "sub").mkdir()
    (d / "sub" / "probe.py").write_text(PROBE)
    (d / "link.py").symlink_to(d / "sub" / "probe.py")
    (d / "pkg").mkdir()
    (d / "pkg" / "__init__.py").write_text("")
    (d / "pkg" / "mod.py").write_text(PROBE)
    (d / "fail.py").write_text(textwrap.dedent(FAIL))
    (d / "sleeper.py").write_text(SLEEPER)
    return d


ARGS = ("a b", "--", "--x", "-n", "3", "--nproc-per-node=2", "-m", "")


MODULE_ARGS = ("-m", "pkg.mod", "--flag", "x y", "--")


def _torchrun_case(work: Path, n: int, program: tuple[str, ...], env: dict[str, str]) -> tuple[Result, dict[int, bool]]:
    res = launch(torchrun(n, *program), work, limit=REFERENCE_LIMIT, **env)
    return res, {r: ended(p) for r, p in pids(res).items()}


@pytest.fixture(scope="module")
def reference(work: Path) -> Iterator[dict[str, Future]]:
    """torchrun's runs of this file, started together at the first test and run 3 at a time beside the
    hpcdist run launches (torchrun starts in seconds on 2 cores): name -> Future of (Result, {rank: ended})."""
    cases: dict[str, tuple[int, tuple[str, ...], dict[str, str]]] = {
        "probe": (3, ("./link.py", *ARGS), {}),
        "module": (2, MODULE_ARGS, {}),
        "raise": (2, ("fail.py", "raise"), {}),
        "exit3": (2, ("fail.py", "exit3"), {}),
        "sigkill": (2, ("fail.py", "sigkill"), {}),
        "exit0": (2, ("fail.py", "exit0"), {"SLEEP": "1"}),
    }
    with ThreadPoolExecutor(3) as pool:
        futures = {name: pool.submit(_torchrun_case, work, *case) for name, case in cases.items()}
        futures["SIGTERM"] = pool.submit(signal_launcher, torchrun(2, "sleeper.py"), work, signal.SIGTERM)
        yield futures


@pytest.fixture(scope="module")
def at3(work: Path, reference: dict[str, Future]) -> dict[str, Result]:
    """The probe at 3 ranks, OMP_NUM_THREADS and PYTHONUNBUFFERED unset, under each launcher."""
    hp = launch(hpcdist_run(3, "./link.py", *ARGS), work)
    out = {"hpcdist": hp, "torchrun": reference["probe"].result()[0]}
    for name, res in out.items():
        assert res.returncode == 0 and len(probes(res)) == 3, (name, res.output[-3000:])
    return out


def envs(at3: dict[str, Result], keys: tuple[str, ...]) -> dict[str, list[dict]]:
    return {k: [{key: p["env"][key] for key in keys} for p in probes(res)] for k, res in at3.items()}


def field(at3: dict[str, Result], name: str, key: str) -> list:
    return [p[key] for p in probes(at3[name])]


def test_rank_and_size_variables_match_torchrun(at3):
    """GUARD: RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE of each of 3 ranks are torchrun's."""
    got = envs(at3, ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE"))
    assert got["hpcdist"] == got["torchrun"]


def test_node_role_and_restart_variables_match_torchrun(at3):
    """SUSPECT: GROUP_RANK, GROUP_WORLD_SIZE, ROLE_RANK, ROLE_WORLD_SIZE, ROLE_NAME, TORCHELASTIC_RESTART_COUNT
    and TORCHELASTIC_MAX_RESTARTS were unset under hpcdist run (Lightning's TorchElasticEnvironment looks for
    GROUP_RANK to recognise a torchrun launch; int(os.environ["TORCHELASTIC_RESTART_COUNT"]) raised KeyError)."""
    keys = (
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "ROLE_NAME",
        "TORCHELASTIC_RESTART_COUNT",
        "TORCHELASTIC_MAX_RESTARTS",
    )
    got = envs(at3, keys)
    assert got["hpcdist"] == got["torchrun"]


def test_master_address_equal_and_one_port_for_all_ranks(at3):
    """GUARD: MASTER_ADDR is the address torchrun gives (127.0.0.1, a local run); MASTER_PORT is one port for
    every rank (its value differs: each launcher picks a free one)."""
    for name in ("torchrun", "hpcdist"):
        addrs = {env["MASTER_ADDR"] for env in field(at3, name, "env")}
        ports = {env["MASTER_PORT"] for env in field(at3, name, "env")}
        assert addrs == {"127.0.0.1"}, (name, addrs)
        assert len(ports) == 1 and ports.pop().isdigit(), (name, ports)


def test_elastic_agent_variables_stay_unset(at3):
    """DOCUMENTED: torchrun's agent sets TORCHELASTIC_RUN_ID, TORCHELASTIC_USE_AGENT_STORE=True (its store holds
    MASTER_PORT) and TORCHELASTIC_ERROR_FILE; hpcdist run has no agent (rank 0 hosts the env:// store) and sets
    none of them, so torch.distributed.is_torchelastic_launched() is False."""
    agent = ("TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_ERROR_FILE")
    got = envs(at3, agent)
    assert all(all(v is not None for v in row.values()) for row in got["torchrun"]), got["torchrun"]
    assert all(row["TORCHELASTIC_USE_AGENT_STORE"] == "True" for row in got["torchrun"])
    assert got["hpcdist"] == [dict.fromkeys(agent)] * 3


def test_one_openmp_thread_and_unbuffered_output_as_torchrun(at3):
    """GUARD: with OMP_NUM_THREADS and PYTHONUNBUFFERED unset, every rank gets OMP_NUM_THREADS=1 and an
    unbuffered (write-through) stdout, as under torchrun (which runs python -u)."""
    for name in ("torchrun", "hpcdist"):
        assert [env["OMP_NUM_THREADS"] for env in field(at3, name, "env")] == ["1"] * 3, name
        assert field(at3, name, "unbuffered") == [True] * 3, name


def test_argv_with_spaces_separators_and_option_lookalikes_passed_verbatim(at3):
    """GUARD: sys.argv is torchrun's: argv[0] as typed (./link.py), then "a b", "--", "--x", "-n", "3",
    "--nproc-per-node=2", "-m" and "" untouched."""
    for name in ("torchrun", "hpcdist"):
        assert field(at3, name, "argv") == [["./link.py", *ARGS]] * 3, name


def test_main_file_is_absolute_as_under_torchrun(at3):
    """SUSPECT: __file__ of the script was the path as typed ("./link.py"), where python (and so torchrun)
    gives the absolute one: os.listdir(os.path.dirname(__file__)) of a script in the cwd failed ("" path),
    and __file__ broke after os.chdir."""
    assert field(at3, "hpcdist", "file") == field(at3, "torchrun", "file")
    assert os.path.isabs(field(at3, "hpcdist", "file")[0])


def test_sys_path_cwd_and_main_name_match_torchrun(at3, work):
    """GUARD: sys.path[0] is the symlink's target's directory (sub/), the cwd is the caller's, __name__ is
    __main__, as under torchrun."""
    for key in ("path0", "cwd", "name"):
        assert field(at3, "hpcdist", key) == field(at3, "torchrun", key), key
    assert field(at3, "hpcdist", "path0") == [str(work / "sub")] * 3


def test_each_ranks_stdout_and_stderr_reach_the_caller(at3):
    """GUARD: what each rank writes to stdout reaches the caller's stdout, stderr its stderr, under both."""
    for name in ("torchrun", "hpcdist"):
        res = at3[name]
        assert sorted(ln for ln in res.stdout.splitlines() if ln.startswith("OUT")) == ["OUT 0", "OUT 1", "OUT 2"]
        assert sorted(ln for ln in res.stderr.splitlines() if ln.startswith("ERR")) == ["ERR 0", "ERR 1", "ERR 2"]


def test_module_form_matches_torchrun(work, reference):
    """GUARD: -m pkg.mod ARGS: sys.argv[0] the module's file, its arguments, __file__, sys.path[0] (the cwd),
    __name__ as under torchrun -m."""
    runs = {"hpcdist": launch(hpcdist_run(2, *MODULE_ARGS), work), "torchrun": reference["module"].result()[0]}
    got = {}
    for name, res in runs.items():
        assert res.returncode == 0, (name, res.output[-3000:])
        got[name] = [{k: p[k] for k in ("argv", "file", "path0", "cwd", "name")} for p in probes(res)]
    assert got["hpcdist"] == got["torchrun"]
    assert got["hpcdist"][0]["argv"] == [str(work / "pkg" / "mod.py"), "--flag", "x y", "--"]


def test_gloo_process_group_over_env_works_as_under_torchrun(tmp_path):
    """GUARD: torch.distributed.init_process_group("gloo") (env://) and an all_reduce work under hpcdist run at
    2 ranks, as under torchrun; is_torchelastic_launched() is False there (DOCUMENTED: no elastic agent)."""
    script = tmp_path / "gloo.py"
    script.write_text(
        "import os, torch, torch.distributed as dist\n"
        'dist.init_process_group("gloo")\n'
        "t = torch.tensor([float(dist.get_rank() + 1)])\n"
        "dist.all_reduce(t)\n"
        "line = f'GLOO {dist.get_rank()} {dist.get_world_size()} {t.item():g} {dist.is_torchelastic_launched()}'\n"
        "os.write(1, (line + chr(10)).encode())\n"
        "dist.destroy_process_group()\n"
    )
    res = launch(hpcdist_run(2, str(script)), tmp_path, limit=40)
    assert res.returncode == 0, res.output[-3000:]
    lines = sorted(ln for ln in res.stdout.splitlines() if ln.startswith("GLOO"))
    assert lines == ["GLOO 0 2 3 False", "GLOO 1 2 3 False"], res.output[-3000:]


def fail_both(work: Path, reference: dict[str, Future], how: str) -> dict[str, tuple[Result, dict[int, bool]]]:
    """fail.py at 2 ranks, rank 1 failing ``how``, under each launcher: its result and whether each rank ended."""
    res = launch(hpcdist_run(2, "fail.py", how), work)
    return {"hpcdist": (res, {r: ended(p) for r, p in pids(res).items()}), "torchrun": reference[how].result()}


def test_rank_raising_ends_the_job_with_status_1_naming_the_rank(work, reference):
    """GUARD: rank 1 raises while rank 0 sleeps: both launchers end rank 0 and exit 1; torchrun's
    ChildFailedError names rank 1 and exitcode 1, hpcdist run prints the traceback once and names rank 1."""
    got = fail_both(work, reference, "raise")
    for name, (res, gone) in got.items():
        assert res.returncode == 1, (name, res.output[-3000:])
        assert gone == {0: True, 1: True}, (name, res.output[-3000:])
    tr = got["torchrun"][0].stderr
    assert "ChildFailedError" in tr and "rank      : 1 (local_rank: 1)" in tr and "exitcode  : 1" in tr
    err = got["hpcdist"][0].stderr
    assert err.count("[rank 1] ValueError: rank one is broken") == 1, err
    assert "hpcdist run: rank 1 failed: ValueError: rank one is broken" in err


def test_rank_exit_status_ends_the_job_and_is_the_launchers_status(work, reference):
    """DOCUMENTED: rank 1 sys.exit(3) while rank 0 sleeps: both end rank 0; torchrun exits 1 (ChildFailedError,
    exitcode 3), hpcdist run exits with the rank's status, 3, and names the rank."""
    got = fail_both(work, reference, "exit3")
    for name, (_res, gone) in got.items():
        assert gone == {0: True, 1: True}, name
    tr, hp = got["torchrun"][0], got["hpcdist"][0]
    assert tr.returncode == 1 and "exitcode  : 3" in tr.stderr and "rank      : 1" in tr.stderr
    assert hp.returncode == 3, hp.output[-3000:]
    assert "hpcdist run: rank 1 failed: exited with status 3" in hp.stderr


def test_rank_killed_by_a_signal_ends_the_job(work, reference):
    """DOCUMENTED: rank 1 SIGKILLed while rank 0 sleeps: both end rank 0 and exit non-zero; torchrun exits 1
    naming exitcode -9, hpcdist run the launcher's status, after mpiexec's report naming the signal, and names
    the rank and the signal (its warden saw it)."""
    got = fail_both(work, reference, "sigkill")
    for name, (res, gone) in got.items():
        assert res.returncode != 0 and gone == {0: True, 1: True}, (name, res.output[-3000:])
    tr, hp = got["torchrun"][0], got["hpcdist"][0]
    assert tr.returncode == 1 and "exitcode  : -9" in tr.stderr
    assert "Killed (signal 9)" in hp.output, hp.output[-3000:]
    assert "hpcdist run: rank 1 failed: killed by SIGKILL (signal 9: " in hp.stderr, hp.output[-3000:]


def test_rank_exiting_0_early_leaves_the_others_running(work, reference):
    """GUARD: rank 1 sys.exit(0) at once, rank 0 sleeps 1 s and finishes: exit 0 and rank 0's last line, as under
    torchrun (a worker that succeeded early is not a failure)."""
    runs = {
        "hpcdist": launch(hpcdist_run(2, "fail.py", "exit0"), work, SLEEP="1"),
        "torchrun": reference["exit0"].result()[0],
    }
    for name, res in runs.items():
        assert res.returncode == 0 and "DONE 0" in res.stdout, (name, res.output[-3000:])


def test_rank_leaving_with_os_exit_ends_the_job(work):
    """SUSPECT (was a strict xfail): rank 1 os._exit(5) before MPI is up while rank 0 sleeps 10 s: torchrun ends
    rank 0 at once; hpcdist run waited for it (Hydra does), as nothing in Python saw rank 1 go. Now the rank's
    warden records it and hpcdist run ends the job after its grace, with status 5, naming the rank."""
    res = launch(hpcdist_run(2, "fail.py", "os_exit5"), work, SLEEP="10")
    assert "hpcdist run: rank 1 failed: exited with status 5 outside Python's exit path" in res.stderr, res.output
    assert res.returncode == 5 and "DONE 0" not in res.stdout, res.output[-3000:]
    assert "rank 0" not in res.stderr, res.output  # ended by the launcher's SIGTERM: not reported as a failure


def signal_launcher(cmd: list[str], cwd: Path, sig: int) -> tuple[int, list[int], str]:
    """Start ``cmd`` (sleeper.py on 2 ranks), send ``sig`` to the launcher once both ranks run; its exit status,
    the ranks' pids still alive 5 s later (killed then) and its stderr. Everything ends within ~2 LIMIT s."""
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=clean_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    lines: queue.Queue[str] = queue.Queue()
    assert proc.stdout is not None
    threading.Thread(target=lambda: [lines.put(ln) for ln in proc.stdout], daemon=True).start()  # type: ignore[union-attr]
    ranks: list[int] = []
    try:
        deadline = time.monotonic() + LIMIT
        while len(ranks) < 2:
            line = lines.get(timeout=max(0.01, deadline - time.monotonic()))
            if line.startswith("READY"):
                ranks.append(int(line.split()[1]))
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=LIMIT)
        return proc.returncode, [p for p in ranks if not ended(p)], err
    finally:
        if proc.poll() is None:
            kill_tree(proc.pid, _processes(proc.pid))
            proc.wait()
        for pid in ranks:
            ended(pid, 0)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_to_the_launcher_ends_every_rank(work, reference, sig):
    """DOCUMENTED: SIGTERM or SIGINT sent to the launcher alone ends both ranks; torchrun exits 1 (its
    SignalException; its SIGINT takes the same path, run for SIGTERM only), hpcdist run 128 + the signal."""
    rc, left, err = reference["SIGTERM"].result()
    assert left == [] and rc == 1 and "SignalException" in err, err[-2000:]
    rc, left, err = signal_launcher(hpcdist_run(2, "sleeper.py"), work, sig)
    assert left == [], err[-2000:]
    assert rc == 128 + sig, err[-2000:]


@pytest.mark.parametrize(
    "args, needle",
    [
        (["-n", "0", "marker.py"], "-n/--nprocs: expected an integer >= 1, got '0'"),
        (["-n", "gpu", "marker.py"], "-n/--nprocs: expected an integer >= 1, got 'gpu'"),
        (["-n", "2", "nosuch.py"], "script 'nosuch.py' not found"),
        (["-n", "2", "-m"], "-m: expected a module name, got nothing"),
        (["--nproc-per-node", "2", "marker.py"], "--nproc-per-node is torchrun's option; expected -n N"),
        (["--nproc_per_node=2", "marker.py"], "--nproc_per_node is torchrun's option; expected -n N"),
        (["--standalone", "-n", "2", "marker.py"], "--standalone is torchrun's option"),
        (["-n", "2", "--no-python", "marker.py"], "--no-python is torchrun's option"),
        (["-n", "2", "--no_python", "marker.py"], "--no_python is torchrun's option"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else None,
)
def test_bad_launcher_arguments_fail_in_one_line_before_any_rank_starts(tmp_path, monkeypatch, capsys, args, needle):
    """SUSPECT (torchrun's options): ``--nproc-per-node 2`` and friends gave ``unrecognized arguments:
    --nproc-per-node`` without the fix; now the line says it is torchrun's option and what hpcdist run takes.
    GUARD for the others. Exit 2, one line on stderr, no rank started (marker.py would write a file).
    In-process (``hpcdist.cli.main``): the real command is run once below."""
    from hpcdist import cli

    (tmp_path / "marker.py").write_text(f"open({str(tmp_path / 'started')!r}, 'w').close()\n")
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", *args]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hpcdist run: ") and needle in err, err
    assert not (tmp_path / "started").exists()


def test_torchrun_nproc_option_refused_by_the_command(tmp_path):
    """SUSPECT: ``hpcdist run --nproc-per-node 2 x.py`` (torchrun's spelling) said only ``unrecognized arguments:
    --nproc-per-node``; now exit 2 and one line naming the option and ``-n N``, nothing started."""
    (tmp_path / "marker.py").write_text(f"open({str(tmp_path / 'started')!r}, 'w').close()\n")
    res = launch([PY, "-m", "hpcdist", "run", "--nproc-per-node", "2", "marker.py"], tmp_path)
    assert res.returncode == 2, res.output
    assert res.stderr == (
        "hpcdist run: --nproc-per-node is torchrun's option; expected -n N (hpcdist run takes no torchrun options)\n"
    )
    assert not (tmp_path / "started").exists()
