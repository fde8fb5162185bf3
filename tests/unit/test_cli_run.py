"""`hpcdist run` argument handling and launch commands, without launching anything."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import pytest

from hpcdist import cli
from hpcdist.launch import run as runmod
from hpcdist.launch.launchers import LAUNCHERS, LaunchError, LaunchSpec, read_hostfile, select_launcher
from hpcdist.launch.ranks import RankInfo
from hpcdist.launch.run import UsageError, build_command, parse_args

PY = "/opt/py/bin/python"
BOOT = [PY, "-m", "hpcdist.launch._bootstrap"]


def which_none(_name):
    return None


def which_all(name):
    return f"/usr/bin/{name}"


def test_program_options_are_not_ours(script):
    opts = parse_args(["-n", "4", script, "-n", "3", "--hosts", "x"])
    assert opts.nprocs == 4
    assert opts.program == [script, "-n", "3", "--hosts", "x"]
    assert opts.hosts == []


@pytest.mark.parametrize(
    "argv, program",
    [
        (["-n", "2", "-m", "pkg.mod", "-n", "5"], ["-m", "pkg.mod", "-n", "5"]),
        (["-mpkg.mod", "a"], ["-m", "pkg.mod", "a"]),
    ],
)
def test_module_form(argv, program):
    assert parse_args(argv).program == program


def test_forms_of_n(script):
    assert parse_args(["-n3", script]).nprocs == 3
    assert parse_args(["--nprocs=5", script]).nprocs == 5
    assert parse_args(["-np", "2", script]).nprocs == 2
    assert parse_args([script]).nprocs == 1


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-n", "0", "x.py"], "-n/--nprocs: expected an integer >= 1, got '0'"),
        (["-n", "two", "x.py"], "-n/--nprocs: expected an integer >= 1, got 'two'"),
        (["-n", "2"], "missing program"),
        (["-n", "2", "missing.py"], "script 'missing.py' not found"),
        (["-m"], "-m: expected a module name"),
        (["--timeout", "0", "-m", "x"], "--timeout: expected a number of seconds > 0, got '0'"),
        (["--hosts", "a", "--hostfile", "f", "-m", "x"], "--hosts and --hostfile"),
        (["--hosts", "n[1-", "-m", "x"], "--hosts: hostlist: unclosed"),
        (["--bogus", "-m", "x"], "unrecognized arguments: --bogus"),
    ],
)
def test_bad_input_messages(argv, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UsageError) as info:
        parse_args(argv)
    assert message in str(info.value)


def test_main_prints_one_line_and_exits_2(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli.main(["run", "-n", "0", "x.py"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("hpcdist run: -n/--nprocs")


def test_cli_unknown_command(capsys):
    assert cli.main(["frobnicate"]) == 2
    assert "unknown command 'frobnicate'" in capsys.readouterr().err


def test_hydra_command(script):
    opts = parse_args(["-n", "4", "--hosts", "node[01-02]", "--prefix-output", script, "a"])
    cmd, env = build_command(opts, {}, "/tmp/st", python=PY, which=which_all, flavour=lambda exe: "hydra")
    assert cmd == [
        "/usr/bin/mpiexec",
        "-n",
        "4",
        "-hosts",
        "node01,node02",
        *BOOT,
        "--prefix-output",
        "--status-dir",
        "/tmp/st",
        "--",
        script,
        "a",
    ]
    assert env["MASTER_ADDR"] == "node01" and env["MASTER_PORT"] == "29500"
    assert env["PYTHONUNBUFFERED"] == "1"


def test_openmpi_command_exports_master_vars(script):
    with open("hosts.txt", "w") as f:  # parse_args reads it: a missing hostfile is an argument error
        f.write("node1:2\n")
    opts = parse_args(["-n", "2", "--hostfile", "hosts.txt", script])
    spec_cmd = LAUNCHERS["openmpi"].build(
        "/usr/bin/mpirun",
        LaunchSpec(nprocs=2, program=["p"], hostfile="hosts.txt", export=["MASTER_ADDR", "MASTER_PORT"]),
    )
    assert spec_cmd == [
        "/usr/bin/mpirun",
        "-n",
        "2",
        "--hostfile",
        "hosts.txt",
        "-x",
        "MASTER_ADDR",
        "-x",
        "MASTER_PORT",
        "p",
    ]
    assert opts.hostfile == "hosts.txt"


def test_srun_inside_allocation(script):
    opts = parse_args(["-n", "2", script])
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "c[3-4]"}
    cmd, child = build_command(opts, env, None, python=PY, which=which_all)
    assert cmd == ["/usr/bin/srun", "--mpi=pmi2", "--ntasks=2", "--kill-on-bad-exit=1", *BOOT, "--", script]
    assert child["MASTER_ADDR"] == "c3"


def test_srun_options(script):
    opts = parse_args(["-n", "8", "--hosts", "c[1-2]", "--srun-mpi", "pmix", "--launcher-arg=--cpu-bind=cores", script])
    cmd, _ = build_command(opts, {"SLURM_JOB_ID": "1"}, None, python=PY, which=which_all)
    assert cmd[:6] == [
        "/usr/bin/srun",
        "--mpi=pmix",
        "--ntasks=8",
        "--kill-on-bad-exit=1",
        "--nodelist=c1,c2",
        "--cpu-bind=cores",
    ]


def test_mpiexec_flag_wins_over_slurm(script, tmp_path):
    fake = tmp_path / "mympiexec"
    fake.write_text("#!/bin/sh\n")
    fake.chmod(0o755)
    opts = parse_args(["-n", "2", "--mpiexec", str(fake), script])
    cmd, _ = build_command(opts, {"SLURM_JOB_ID": "1"}, None, python=PY, which=which_all, flavour=lambda e: "hydra")
    assert cmd[:3] == [str(fake), "-n", "2"]


def test_user_master_vars_are_kept(script):
    opts = parse_args(["-n", "2", script])
    _, env = build_command(
        opts,
        {"MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "1234"},
        None,
        python=PY,
        which=which_all,
        flavour=lambda e: "hydra",
    )
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("10.0.0.1", "1234")


@pytest.mark.parametrize(("n", "env", "want"), [(2, {}, "1"), (2, {"OMP_NUM_THREADS": "4"}, "4"), (1, {}, None)])
def test_one_omp_thread_per_rank_unless_set_as_torchrun(script, n, env, want):
    opts = parse_args(["-n", str(n), script])
    cmd, child = build_command(opts, env, None, python=PY, which=which_all, flavour=lambda e: "openmpi")
    assert child.get("OMP_NUM_THREADS") == want
    assert ("OMP_NUM_THREADS" in cmd) == (want is not None)  # exported (-x) where the launcher needs it


def test_local_run_picks_a_free_port(script):
    opts = parse_args(["-n", "2", script])
    _, env = build_command(opts, {}, None, python=PY, which=which_all, flavour=lambda e: "hydra")
    assert env["MASTER_ADDR"] == "127.0.0.1" and 0 < int(env["MASTER_PORT"]) < 65536


def test_mpiexec_next_to_python_first(tmp_path):
    (tmp_path / "bin").mkdir()
    exe = tmp_path / "bin" / "mpiexec"
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    launcher, path = select_launcher(
        "auto", None, {}, which=which_all, flavour=lambda e: "hydra", python=str(tmp_path / "bin" / "python")
    )
    assert (launcher.name, path) == ("hydra", str(exe))


def test_no_mpi_found_is_one_clear_error(tmp_path):
    with pytest.raises(LaunchError, match="no MPI launcher found") as info:
        select_launcher("auto", None, {}, which=which_none, python=str(tmp_path / "python"))
    assert "pip install mpich" in str(info.value) and "\n" not in str(info.value)


def test_unknown_launcher_name(tmp_path):
    with pytest.raises(LaunchError, match="--launcher: expected auto, mpiexec or one of"):
        select_launcher("pbsdsh", "/bin/sh", {}, which=which_all)


def test_srun_requested_but_missing():
    with pytest.raises(LaunchError, match="srun not found"):
        select_launcher("srun", None, {}, which=which_none)


def test_generic_launcher_refuses_hosts():
    with pytest.raises(LaunchError, match="--hosts/--hostfile"):
        LAUNCHERS["generic"].build("/x/mpiexec", LaunchSpec(nprocs=2, program=["p"], hosts=["a"]))


def test_read_hostfile(tmp_path):
    f = tmp_path / "hosts"
    f.write_text("# comment\nnode1:4\nnode2 slots=4\n\nnode3\n")
    assert read_hostfile(str(f)) == ["node1", "node2", "node3"]
    with pytest.raises(LaunchError, match="--hostfile: cannot read"):
        read_hostfile(str(tmp_path / "nope"))


def test_launcher_that_cannot_start(script, monkeypatch, capsys):
    def boom(*a, **k):
        raise FileNotFoundError(2, "No such file or directory")

    monkeypatch.setattr(runmod.subprocess, "Popen", boom)
    monkeypatch.setattr(runmod, "select_launcher", lambda *a, **k: (LAUNCHERS["hydra"], "/gone/mpiexec"))
    assert runmod.main(["-n", "2", script]) == 1
    err = capsys.readouterr().err
    assert err == "hpcdist run: cannot start launcher '/gone/mpiexec': No such file or directory\n"


def test_dry_run_prints_command(script, capsys, monkeypatch):
    monkeypatch.setattr(runmod, "select_launcher", lambda *a, **k: (LAUNCHERS["hydra"], "/x/mpiexec"))
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    monkeypatch.delenv("MASTER_PORT", raising=False)
    assert runmod.main(["--dry-run", "-n", "3", script]) == 0
    out = capsys.readouterr().out
    assert " /x/mpiexec -n 3 " in out and sys.executable in out and out.rstrip().endswith(f"-- {script}")
    assert "--status-dir" not in out  # a temporary directory that would be gone before the user runs it
    # what the launch sets goes first, as `env K=V`: the command runs as hpcdist run would run it
    head = out.split(" /x/mpiexec ")[0].split()
    assert head[0] == "env" and "OMP_NUM_THREADS=1" in head
    assert not any(v.startswith("MASTER_PORT=") for v in head)  # chosen by the bootstrap when the job runs


@pytest.mark.parametrize(
    "argv, name, instead",
    [
        (["--nproc-per-node", "2", "S"], "--nproc-per-node", "-n N"),
        (["--nproc_per_node=2", "S"], "--nproc_per_node", "-n N"),
        (["-n", "2", "--standalone", "S"], "--standalone", "nothing"),
        (["--no_python", "S"], "--no_python", "a Python script or -m module"),
        (["--master-port=29500", "-m", "x"], "--master-port", "MASTER_PORT in the environment"),
    ],
)
def test_torchrun_options_refused_with_what_to_give(script, argv, name, instead):
    with pytest.raises(UsageError, match=f"^{name} is torchrun's option; expected {instead}"):
        parse_args([script if a == "S" else a for a in argv])


def test_torchrun_option_as_a_value_of_ours_is_not_refused_as_torchruns(script):
    assert parse_args(["--launcher-arg=--nnodes", script]).launcher_args == ["--nnodes"]
    with pytest.raises(UsageError, match="--launcher-arg: expected one argument"):  # argparse's, as before
        parse_args(["--launcher-arg", "--nnodes", script])


@pytest.mark.parametrize(
    "info, env, place",
    [
        (RankInfo("hydra", 3, 4, 3, 4), {}, ("0", "1")),  # one node
        (RankInfo("hydra", 5, 8, 1, 4), {}, ("1", "2")),  # blocks of LOCAL_WORLD_SIZE
        (RankInfo("openmpi", 1, 4, 0, 2), {}, None),  # round-robin over nodes: not torchrun's layout
        (RankInfo("srun", 4, 5, 0, 1), {"SLURM_NODEID": "2", "SLURM_STEP_NUM_NODES": "3"}, ("2", "3")),
    ],
)
def test_bootstrap_sets_torchruns_node_role_and_restart_variables(info, env, place):
    from hpcdist.launch._bootstrap import set_torchrun_env

    env = {"GROUP_RANK": "9", **env}  # a parent's value never stays
    set_torchrun_env(info, env)
    assert (env.get("GROUP_RANK"), env.get("GROUP_WORLD_SIZE")) == (place or (None, None))
    assert (env["ROLE_RANK"], env["ROLE_WORLD_SIZE"], env["ROLE_NAME"]) == (str(info.rank), str(info.size), "default")
    assert env["TORCHELASTIC_RESTART_COUNT"] == env["TORCHELASTIC_MAX_RESTARTS"] == "0"
    assert "TORCHELASTIC_RUN_ID" not in env and "TORCHELASTIC_USE_AGENT_STORE" not in env


def test_stop_never_waits_unbounded_even_where_an_interrupted_wait_kept_the_lock():
    """SUSPECT (test_signal_to_the_launcher_ends_every_rank[SIGINT] hung once in 20 s): SIGINT reached
    ``hpcdist run`` as a KeyboardInterrupt, raised between any two bytecodes, also inside ``Popen.wait``
    where it can leave the waitpid lock taken; ``_stop`` then waited on that lock after its SIGKILL with no
    limit. Now SIGINT is handled as SIGTERM (no KeyboardInterrupt) and ``_stop`` never waits unbounded:
    here a launcher that ignores SIGTERM, with the lock held as such a wait leaves it, is killed and
    ``_stop`` returns."""
    import signal
    import subprocess
    import threading

    assert signal.SIGINT in runmod._FORWARDED
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == b"1"  # SIGTERM is ignored from here
        assert proc._waitpid_lock.acquire(False)  # type: ignore[attr-defined]  # as an interrupted wait leaves it
        done = threading.Event()
        stopper = threading.Thread(target=lambda: (runmod._stop(proc, grace=0.3), done.set()), daemon=True)
        stopper.start()
        assert done.wait(30), "_stop waited without limit"
        proc._waitpid_lock.release()  # type: ignore[attr-defined]
        assert proc.wait(timeout=10) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


YIELD = "MPIR_CVAR_ENABLE_HEAVY_YIELD"


@pytest.mark.parametrize(
    ("argv", "env", "flavour", "want"),
    [
        (["-n", "3"], {}, "hydra", {YIELD: "1", "UCX_MEM_EVENTS": "no"}),  # 3 ranks on 2 CPUs
        (["-n", "2"], {}, "hydra", {"UCX_MEM_EVENTS": "no"}),  # a CPU each: MPICH's waits spin
        (["-n", "3"], {YIELD: "0", "UCX_MEM_EVENTS": "yes"}, "hydra", {}),  # the user's settings stay
        (["-n", "3"], {"HPCDIST_MPI_TUNE": "0"}, "hydra", {}),
        (["-n", "3", "--hosts", "a,b"], {}, "hydra", {}),  # other hosts: not this one's CPUs
        (["-n", "3"], {"SLURM_JOB_ID": "7"}, "hydra", {}),  # Hydra spreads the ranks over the allocation
        (["-n", "3"], {"PBS_JOBID": "7.pbs"}, "hydra", {}),
        (["-n", "3"], {}, "openmpi", {}),  # not MPICH
    ],
    ids=["oversubscribed", "cpu-each", "user-set", "tune-off", "hosts", "slurm", "pbs", "openmpi"],
)
def test_ranks_on_this_host_get_the_launcher_free_mpi_settings(script, monkeypatch, argv, env, flavour, want):
    """hpcdist run puts every rank on this host (Hydra, no hosts, no allocation): it starts the embedded MPICH
    with what a launcher-free world on one host gets (hpcdist.rendezvous.mpi_env.choose, the reference here:
    the same call with the job's LOCAL_WORLD_SIZE), exported where the launcher needs it; elsewhere nothing."""
    from hpcdist.rendezvous import mpi_env

    monkeypatch.setattr(mpi_env, "cpus", lambda: 2)
    monkeypatch.setattr(mpi_env, "embedded_mpich", lambda e: True)
    opts = parse_args([*argv, script])
    _, child = build_command(opts, env, None, python=PY, which=which_all, flavour=lambda e: flavour)
    got = {k: child[k] for k in (YIELD, "UCX_MEM_EVENTS") if k in child and k not in env}
    assert got == want
    if want:
        same = mpi_env.choose({**env, "LOCAL_WORLD_SIZE": str(opts.nprocs)}, 2, True)
        assert got == same


def test_summary_names_the_first_failure_first_and_folds_ranks_that_failed_alike():
    """SUSPECT (scale): the summary printed one line per failed rank, in rank order: after a broken collective
    on 1024 ranks, 1024 lines, and the rank that failed first (the cause) somewhere in the middle. Now one line
    per distinct error, the first failure's first, its ranks folded; at most 8 lines."""
    cause = {"rank": 512, "error": "ValueError: bad shard", "time": 1.0}
    timeouts = [{"rank": r, "error": "DistTimeoutError: all_reduce", "time": 2.0 + r} for r in range(1024) if r != 512]
    lines = runmod._summary_lines(runmod.sorted_failures([*timeouts, cause]))
    assert lines == [
        "hpcdist run: rank 512 failed: ValueError: bad shard",
        "hpcdist run: ranks 0-511, 513-1023 failed: DistTimeoutError: all_reduce",
    ]
    many = [{"rank": r, "error": f"E{r}", "time": float(r)} for r in range(20)]
    lines = runmod._summary_lines(runmod.sorted_failures(many))
    assert len(lines) == 8 and lines[:7] == [f"hpcdist run: rank {r} failed: E{r}" for r in range(7)]
    assert lines[7] == "hpcdist run: 13 more ranks failed with 13 other errors"


def test_summary_names_the_host_of_a_failed_rank_where_failures_span_hosts():
    """On one host (every test job here) the lines read as they always did; from several, a lone failed rank's
    line names its host (an OOM kill on one node is then found at once)."""
    one = [{"rank": 3, "error": "E", "time": 1.0, "host": "vm"}, {"rank": 1, "error": "F", "time": 2.0, "host": "vm"}]
    assert runmod._summary_lines(runmod.sorted_failures(one)) == [
        "hpcdist run: rank 3 failed: E",
        "hpcdist run: rank 1 failed: F",
    ]
    two = [
        {"rank": 9, "error": "killed by SIGKILL", "time": 1.0, "host": "node02"},
        *({"rank": r, "error": "DistTimeoutError", "time": 2.0, "host": f"node0{r // 8 + 1}"} for r in range(8)),
    ]
    assert runmod._summary_lines(runmod.sorted_failures(two)) == [
        "hpcdist run: rank 9 on node02 failed: killed by SIGKILL",
        "hpcdist run: ranks 0-7 failed: DistTimeoutError",
    ]


def test_a_failure_record_says_when_and_where(tmp_path):
    """The bootstrap's record carries the time (the summary orders by it) and this host's name."""
    import json
    import socket
    import time

    from hpcdist.launch import _bootstrap

    before = time.time()
    _bootstrap._record(str(tmp_path), 4, ValueError("bad shard"))
    rec = json.loads((tmp_path / "rank-4.json").read_text())
    assert rec["rank"] == 4 and rec["error"] == "ValueError: bad shard" and rec["status"] == 1
    assert before <= rec["time"] <= time.time() and rec["host"] == socket.gethostname()


@pytest.mark.parametrize(
    ("argv", "env", "shared"),
    [
        (["-n", "2"], {}, False),  # every rank on this host: its /tmp
        (["-n", "2", "--hosts", "a,b"], {}, True),
        (["-n", "2", "--launcher", "srun"], {}, True),
        (["-n", "2"], {"SLURM_JOB_ID": "7"}, True),  # an allocation: srun or Hydra spreads the ranks
        (["-n", "2"], {"PBS_JOBID": "1.pbs"}, True),
    ],
    ids=["local", "hosts", "srun", "slurm", "pbs"],
)
def test_failure_records_go_where_every_node_sees_them_when_ranks_may_be_elsewhere(script, tmp_path, argv, env, shared):
    opts = parse_args([*argv, script])
    assert runmod._status_parent(opts, env, cwd=str(tmp_path)) == (str(tmp_path) if shared else None)
    # a working directory this process cannot write into (here: gone): the system's temporary directory after all
    assert runmod._status_parent(opts, env, cwd=str(tmp_path / "gone")) is None


def test_records_left_by_a_killed_launch_of_this_host_are_swept_and_no_other(tmp_path):
    """A SIGKILLed ``hpcdist run`` leaves its hidden records directory in the working directory; the next launch
    there removes those of this host whose process is gone, and leaves a live one's and another host's."""
    host = socket.gethostname()
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    left = {
        "dead": f".hpcdist-run-{host}-{gone.pid}-abc",
        "alive": f".hpcdist-run-{host}-{os.getpid()}-def",
        "elsewhere": f".hpcdist-run-{host}x-{gone.pid}-ghi",  # another host whose name starts like this one
        "elsewhere too": f".hpcdist-run-{host}-2-{gone.pid}-jkl",  # host "<this one>-2"
        "old format": ".hpcdist-run-k2j3",
    }
    for name in left.values():
        (tmp_path / name).mkdir()
        (tmp_path / name / "rank-0.json").write_text("{}")
    (tmp_path / f".hpcdist-run-{host}-{gone.pid}-file").write_text("not a directory")
    runmod._sweep_left_records(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [
            left["alive"],
            left["elsewhere"],
            left["elsewhere too"],
            left["old format"],
            f".hpcdist-run-{host}-{gone.pid}-file",
        ]
    )
    assert runmod._status_prefix() == f".hpcdist-run-{host}-{os.getpid()}-"  # what the sweep parses
