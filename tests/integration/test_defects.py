"""Defects of issue #10 (hangs, leaks, the unpickler, wrong results) under a real mpiexec.

Each test launches a real job with a hard limit (``run_mpi(limit=...)``) in
which one rank misbehaves for far longer (``STALL`` s) than the timeout under
test; a job that ends well before the stall proves the timeout was honoured.
The margins are hang guards, never speed claims.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
from mpirun import Result, run_mpi

pytestmark = pytest.mark.timeout(300)

STALL = 120  # seconds a misbehaving rank sleeps: far beyond every timeout and margin below
MARGIN = 40  # seconds allowed beyond the timeout under test (startup and teardown on a loaded 2-core host)

PRELUDE = """
import os, sys, time
from datetime import timedelta
import numpy as np
import hpcdist as dist
from mpi4py import MPI


def say(*parts):
    os.write(1, (" ".join(map(str, parts)) + chr(10)).encode())  # one write: lines of ranks never mix
"""


def orphans(tmp_path: Path, grace: float = 10.0) -> list[str]:
    """Processes still running a script of this test (their command line names ``tmp_path``) after ``grace`` s."""
    deadline = time.monotonic() + grace
    while True:
        found = _running(tmp_path)
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.2)


def _running(tmp_path: Path) -> list[str]:
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if str(tmp_path) in cmd:
            found.append(f"{pid}: {cmd}")
    return found


def ended_promptly(r: Result, tmp_path: Path, timeout: float) -> None:
    """The job ended by itself before its hard limit (the hang guard), non-zero, leaving no process behind."""
    assert not r.timed_out, f"the job hung until killed after {r.elapsed:.0f}s:\n{r.output}"
    assert r.returncode != 0, r.output
    assert orphans(tmp_path) == []


# ---------------------------------------------------------------- 1. init honours its timeout under a launcher


@pytest.mark.parametrize("mode", ["block", "poll"])
def test_init_timeout_under_a_launcher(tmp_path, mode):
    script = (
        PRELUDE
        + f"""
if MPI.COMM_WORLD.Get_rank() == 1:
    time.sleep({STALL})                      # never arrives in time
t0 = time.monotonic()
try:
    dist.init_process_group("mpi", timeout=timedelta(seconds=3))
except dist.DistTimeoutError as e:
    say(f"INIT TIMEOUT after {{time.monotonic() - t0:.1f}}s: {{e}}")
    sys.exit(2)
"""
    )
    r = run_mpi(2, script, tmp_path, env={"HPCDIST_WAIT": mode}, limit=STALL - 20)
    ended_promptly(r, tmp_path, 3)
    assert "INIT TIMEOUT after" in r.stdout, r.output
    assert "init_process_group" in r.stdout and "rank 0 of 2" in r.stdout, r.output


# ---------------------------------------------------------------- 2. poll mode: catch, destroy, exit ends the job


def test_poll_mode_catch_destroy_exit_ends_the_job(tmp_path):
    script = (
        PRELUDE
        + f"""
dist.init_process_group("mpi", timeout=timedelta(seconds=2))
if dist.get_rank() == 0:
    try:
        dist.all_reduce(np.ones(4))            # rank 1 is asleep: times out
    except dist.DistTimeoutError as e:
        say("CAUGHT", e)
        dist.destroy_process_group()
        sys.exit(2)
else:
    time.sleep({STALL})
"""
    )
    r = run_mpi(2, script, tmp_path, env={"HPCDIST_WAIT": "poll"}, limit=STALL - 20)
    ended_promptly(r, tmp_path, 2)
    assert "CAUGHT all_reduce" in r.stdout, r.output


# ---------------------------------------------------------------- 3. the watchdog: one deadline per thread


def test_block_watchdog_aborts_a_call_hung_in_one_thread_while_another_thread_works(tmp_path):
    script = (
        PRELUDE
        + f"""
import threading
dist.init_process_group("mpi", timeout=timedelta(seconds=2))
hung_group = dist.new_group([0, 1], timeout=timedelta(seconds=2))
busy_group = dist.new_group([0, 1], timeout=timedelta(seconds=2))
dist.all_reduce(np.ones(4), group=hung_group)  # the next float64 SUM all_reduce on hung_group takes its lane
if dist.get_rank() == 0:
    threading.Thread(target=lambda: dist.all_reduce(np.ones(4), group=hung_group), name="stuck").start()
t0 = time.monotonic()
x = np.ones(1)
while time.monotonic() - t0 < {STALL}:    # healthy collectives on another group, from the main thread
    dist.all_reduce(x, group=busy_group)
    x[:] = 1
    time.sleep(0.001)
say("NEVER ABORTED")
"""
    )
    r = run_mpi(2, script, tmp_path, env={"HPCDIST_WAIT": "block"}, limit=STALL - 20)
    ended_promptly(r, tmp_path, 2)
    assert "NEVER ABORTED" not in r.stdout
    assert "DistTimeoutError: all_reduce on <ProcessGroup '0'" in r.stderr and "'stuck'" in r.stderr, r.output


@pytest.mark.parametrize("mode", ["block", "poll"])
def test_concurrent_blocking_calls_on_one_group_are_refused(tmp_path, mode):
    script = (
        PRELUDE
        + """
import threading
dist.init_process_group("mpi", timeout=timedelta(seconds=60))
dist.broadcast(np.ones(2), src=0)           # learns the group's broadcast lane: the refused call below is the lane's
done = []
if dist.get_rank() == 0:
    t = threading.Thread(target=lambda: done.append(dist.all_reduce(np.ones(4))))
    t.start()
    time.sleep(1.0)                         # the thread is inside the all_reduce: rank 1 comes at 3 s
    try:
        dist.broadcast(np.ones(2), src=0)
    except dist.DistError as e:
        say("REFUSED", e)
    t.join()
else:
    time.sleep(3)
    dist.all_reduce(np.ones(4))
other = dist.new_group([0, 1])              # different groups from different threads: allowed
out = []
threads = [threading.Thread(target=lambda g=g: out.append(dist.all_reduce(np.ones(2), group=g))) for g in (None, other)]
[t.start() for t in threads]
[t.join() for t in threads]
say("TWO GROUPS", len(out), MPI.Query_thread() == MPI.THREAD_MULTIPLE)
dist.destroy_process_group()
"""
    )
    r = run_mpi(2, script, tmp_path, env={"HPCDIST_WAIT": mode}, limit=90)
    assert r.returncode == 0 and not r.timed_out, r.output
    assert "REFUSED broadcast on <ProcessGroup 'default_pg'" in r.stdout, r.output
    assert "another thread is inside a blocking call on this group" in r.stdout
    assert r.stdout.count("TWO GROUPS 2 True") == 2, r.output


# ---------------------------------------------------------------- 4. dropped Work handles are released

LEAK_SCRIPT = """
import gc


def rss_mib():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS"):
            return int(line.split()[1]) / 1024


dist.init_process_group("mpi", timeout=timedelta(seconds=60))
rank, kind, n = dist.get_rank(), sys.argv[1], int(sys.argv[2])
x = np.ones(4)


def step():
    if kind == "isend":       # fire and forget: the Work is dropped at once
        if rank == 0:
            dist.isend(x, dst=1)
        else:
            dist.recv(np.empty(4), src=0)
    else:
        dist.all_reduce(x, async_op=True)


for _ in range(2000):         # warm up the pools first
    step()
dist.barrier(); gc.collect()
before = rss_mib()
for _ in range(n):
    step()
dist.barrier(); gc.collect()
say(f"RANK {rank} GREW {rss_mib() - before:.1f} MiB")
dist.destroy_process_group()
"""


@pytest.mark.parametrize("kind", ["isend", "async_all_reduce"])
def test_dropped_work_handles_do_not_leak(tmp_path, kind):
    n = 40000  # unfixed: isend grew ~1.7 KB per dropped handle (~65 MiB here); fixed: a bounded pool
    r = run_mpi(2, PRELUDE + LEAK_SCRIPT, tmp_path, args=[kind, str(n)], limit=200)
    assert r.returncode == 0 and not r.timed_out, r.output
    grown = [float(line.split()[3]) for line in r.stdout.splitlines() if line.startswith("RANK")]
    assert len(grown) == 2, r.output
    assert max(grown) < 16, f"RSS grew {grown} MiB over {n} dropped handles:\n{r.output}"


# ---------------------------------------------------------------- 6. every group creation honours its timeout


@pytest.mark.parametrize(
    "call",
    [
        "dist.new_group([0, 1], timeout=T, use_local_synchronization=True)",
        "dist.new_subgroups(timeout=T)",
        "dist.new_group([0, 1], timeout=T)",
        "dist.shrink_group([2])",
    ],
)
def test_group_creation_times_out_when_a_rank_never_calls(tmp_path, call):
    script = (
        PRELUDE
        + f"""
T = timedelta(seconds=3)
dist.init_process_group("mpi", timeout=T)
if dist.get_rank() == 1:
    time.sleep({STALL})                      # never calls
elif dist.get_rank() == 0:
    try:
        {call}
    except dist.DistTimeoutError as e:
        say("GROUP TIMEOUT", e)
        sys.exit(3)
"""
    )
    r = run_mpi(3, script, tmp_path, env={"HPCDIST_WAIT": "poll"}, limit=STALL - 20)
    ended_promptly(r, tmp_path, 3)
    assert "GROUP TIMEOUT" in r.stdout, r.output
    what = call.split("(")[0].removeprefix("dist.")
    assert what in r.stdout.split("GROUP TIMEOUT")[1], r.output
    if "use_local_synchronization" in call:  # the first member waits for the others: it names who did not come
        assert "ranks 1 of the 2 members (0, 1) did not arrive" in r.stdout, r.output


# ---------------------------------------------------------------- 7. monitored_barrier state lives on the group


def test_monitored_barrier_on_recreated_groups_blames_nobody(tmp_path):
    script = (
        PRELUDE
        + """
import gc
dist.init_process_group("mpi", timeout=timedelta(seconds=30))
kept = []
for i in range(25):
    g = dist.new_group([0, 1])
    for _ in range(i % 3 + 1):
        dist.monitored_barrier(group=g, timeout=timedelta(seconds=3))
    dist.destroy_process_group(g)
    if dist.get_rank() == 1:
        kept.append(g)          # rank 1 keeps every group object: Python never reuses their id()s there
    del g
    gc.collect()                # rank 0 frees them: a new group may get an old group's id()
say("ALL PASSED", dist.get_rank())
dist.destroy_process_group()
"""
    )
    r = run_mpi(2, script, tmp_path, limit=150)
    assert r.returncode == 0 and not r.timed_out, r.output
    assert r.stdout.count("ALL PASSED") == 2, r.output


# ---------------------------------------------------------------- any-source receives on launcher-free worlds


def run_free(n: int, script: str, tmp_path: Path, limit: float, args: list[str] | None = None) -> Result:
    """Run ``script`` as ``n`` independent processes (no launcher) that join through env://."""
    import socket
    import sys
    import textwrap

    from mpirun import ROOT, run_limited

    path = tmp_path / "free_script.py"
    path.write_text(textwrap.dedent(script))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "HYDRA_", "SLURM_", "OMPI_"))}
    env.pop("HPCDIST_TIMEOUT", None)
    env.update(PYTHONUNBUFFERED="1", PYTHONPATH=str(ROOT), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1")
    env["MASTER_PORT"] = str(port)
    extra = " ".join(args or [])
    starts = " ".join(f'RANK={r} "{sys.executable}" "{path}" {extra} & pids="$pids $!";' for r in range(n))
    shell = f'pids=""; {starts} rc=0; for p in $pids; do wait $p || rc=1; done; exit $rc'
    return run_limited(["bash", "-c", shell], env, limit)


def test_any_source_receives_complete_on_a_launcher_free_world(tmp_path):
    """Unfixed, MPICH lost Irecv(ANY_SOURCE) on port-joined worlds in 2-3 runs of 5 of one iteration."""
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", init_method="env://", timeout=timedelta(seconds=10))
rank, iters = dist.get_rank(), int(sys.argv[1])
for i in range(iters):
    if rank == 1:
        dist.send(np.full(2, i, dtype=np.int64), dst=0)
        dist.send(np.full(3, -i, dtype=np.int64), dst=0)
    else:
        a, b = np.zeros(2, dtype=np.int64), np.zeros(3, dtype=np.int64)
        assert dist.recv(a) == 1                      # no src: any source
        w = dist.irecv(b)
        w.wait()
        assert w.source_rank() == 1 and a.tolist() == [i] * 2 and b.tolist() == [-i] * 3, (i, a, b)
    if i % 100 == 0:
        dist.barrier()
say("RECEIVED ALL", rank)
dist.destroy_process_group()
"""
    )
    r = run_free(2, script, tmp_path, limit=150, args=["1500"])
    assert r.returncode == 0 and not r.timed_out, r.output
    assert r.stdout.count("RECEIVED ALL") == 2, r.output


# ---------------------------------------------------------------- minors


@pytest.mark.parametrize("sig", ["SIGHUP", "SIGTERM"])
def test_hpcdist_run_forwards_hangup_and_leaves_no_rank_behind(tmp_path, sig):
    import signal
    import subprocess
    import sys

    from mpirun import ROOT

    script = tmp_path / "sleeper.py"
    script.write_text(f"import os, time\nos.write(1, b'UP' + bytes([10]))\ntime.sleep({STALL})\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    env.pop("SLURM_JOB_ID", None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "hpcdist", "run", "-n", "2", str(script)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        assert proc.stdout is not None
        ups = 0
        deadline = time.monotonic() + 60
        while ups < 2 and time.monotonic() < deadline:  # both ranks started
            ups += "UP" in proc.stdout.readline()
        proc.send_signal(getattr(signal, sig))
        _, err = proc.communicate(timeout=MARGIN)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    assert proc.returncode == 128 + getattr(signal, sig), err
    assert f"received {sig}" in err
    assert orphans(tmp_path) == []


def test_detail_names_mismatched_barrier_roots_and_shapes(tmp_path):
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", timeout=timedelta(seconds=20))
r = dist.get_rank()
cases = {
    "barrier": lambda: dist.barrier() if r == 0 else dist.all_reduce(np.ones(4)),
    "root": lambda: dist.broadcast(np.ones(4), src=r),
    "shape": lambda: dist.all_reduce(np.ones(4 + r)),
    "reduce_root": lambda: dist.reduce(np.ones(2), dst=1 - r),
}
for name, call in cases.items():
    try:
        call()
        say("NOT CAUGHT", name)
    except dist.DistError as e:
        say("MISMATCH", name, r, e)
x = np.ones(3)
dist.all_reduce(x)                     # nothing was left in flight: the group still works
say("STILL USABLE", x.tolist())
dist.destroy_process_group()
"""
    )
    r = run_mpi(2, script, tmp_path, env={"HPCDIST_DEBUG": "DETAIL"}, limit=90)
    assert r.returncode == 0 and not r.timed_out, r.output
    assert "NOT CAUGHT" not in r.stdout, r.output
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("MISMATCH")]
    assert len(lines) == 8, r.output
    text = "\n".join(lines)
    assert "global rank 0: barrier()" in text and "global rank 1: all_reduce(float64, SUM, shape (4,))" in text
    assert "broadcast(float64, root 0, shape (4,))" in text and "broadcast(float64, root 1, shape (4,))" in text
    assert "shape (5,)" in text and "reduce(float64, root 1" in text
    assert r.stdout.count("STILL USABLE [2.0, 2.0, 2.0]") == 2, r.output


def test_detail_names_a_mismatched_async_op_in_block_mode(tmp_path):
    """In HPCDIST_WAIT=block, async_op=True on one rank and not the other would hang (MPI does not match
    a blocking and a non-blocking collective): DETAIL names it before any message moves."""
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", timeout=timedelta(seconds=20))
r = dist.get_rank()
x = np.ones(4)
try:
    w = dist.all_reduce(x, async_op=(r == 1))
    say("NOT CAUGHT")
except dist.DistError as e:
    say("MISMATCH", r, e)
w = dist.all_reduce(x, async_op=True)  # the same async_op everywhere: fine
w.wait()
say("STILL USABLE", x.tolist())
dist.destroy_process_group()
"""
    )
    r = run_mpi(2, script, tmp_path, env={"HPCDIST_DEBUG": "DETAIL", "HPCDIST_WAIT": "block"}, limit=90)
    assert r.returncode == 0 and not r.timed_out, r.output
    assert "NOT CAUGHT" not in r.stdout, r.output
    text = "\n".join(ln for ln in r.stdout.splitlines() if ln.startswith("MISMATCH"))
    assert text.count("MISMATCH") == 2 and "with async_op=True" in text, r.output
    assert r.stdout.count("STILL USABLE [2.0, 2.0, 2.0, 2.0]") == 2, r.output


@pytest.mark.parametrize("victim", [2, 0])
def test_launcher_free_world_fails_fast_naming_a_killed_peer(tmp_path, victim):
    script = (
        PRELUDE
        + f"""
import signal
dist.init_process_group("mpi", init_method="env://", timeout=timedelta(seconds={STALL}))
if dist.get_rank() == {victim}:
    os.kill(os.getpid(), signal.SIGKILL)      # dies without a word
time.sleep(0.5)
dist.all_reduce(np.ones(4))                    # the survivors would wait the full timeout
say("NOT ENDED")
"""
    )
    r = run_free(3, script, tmp_path, limit=STALL - 20)
    ended_promptly(r, tmp_path, 0)
    assert "NOT ENDED" not in r.stdout
    assert f"hpcdist: rank {victim} of this launcher-free world of 3 died" in r.stderr, r.output


def test_launcher_free_world_ranks_leaving_at_different_times_is_not_a_death(tmp_path):
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", init_method="env://", timeout=timedelta(seconds=60))
x = np.ones(2)
dist.all_reduce(x)
if dist.get_rank() == 1:
    sys.exit(0)                                # leaves early without destroy_process_group: a normal exit
time.sleep(3)                                  # rank 0 "writes a checkpoint" meanwhile
say("FINISHED", dist.get_rank(), x.tolist())
"""
    )
    r = run_free(2, script, tmp_path, limit=90)
    assert r.returncode == 0 and not r.timed_out, r.output
    assert "FINISHED 0 [2.0, 2.0]" in r.stdout and "died" not in r.stderr, r.output
