"""The shared-memory engine when a peer does not come: a clear DistTimeoutError, never a hang.

Every launch has a hard time limit (``run_mpi(limit=...)``); elapsed times
asserted are hang guards, never speed claims.
"""

from __future__ import annotations

import pytest
from mpirun import run_mpi

pytestmark = pytest.mark.timeout(240)

PRELUDE = """
import os, sys, time
from datetime import timedelta
import numpy as np
import hpcdist as dist


def say(*parts):
    os.write(1, (" ".join(map(str, parts)) + chr(10)).encode())
"""


def test_peer_missing_at_setup_times_out(tmp_path):
    """One rank never makes the first shared-memory call: the segment's setup is bounded, the others get a timeout."""
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", timeout=timedelta(seconds=2))
x = np.ones(1000, np.float32)
if dist.get_rank() == 0:
    t0 = time.monotonic()
    try:
        dist.all_reduce(x)             # the first shared-memory call: sets the segment up; rank 1 never comes
    except dist.DistTimeoutError as e:
        say(f"TIMEOUT after {time.monotonic() - t0:.1f}s: {e}")
    t0 = time.monotonic()
    try:
        dist.all_reduce(x)             # not another setup and another full timeout: refused at once
    except dist.DistTimeoutError as e:
        say(f"AGAIN after {time.monotonic() - t0:.1f}s: {e}")
    import glob
    say("LEFT", [p for p in glob.glob("/dev/shm/hpcdist-*") if f"-{os.getpid()}-" in p])
    os._exit(0)
else:
    time.sleep(8)
    os._exit(0)
"""
    )
    r = run_mpi(2, script, tmp_path, env={"HPCDIST_SHM": "1"}, limit=90)
    assert not r.timed_out, "the job hung on a missing peer: " + r.output
    assert "TIMEOUT after" in r.stdout and "all_reduce" in r.stdout and "within 2s" in r.stdout, r.output
    assert "shared-memory setup" in r.stdout, r.output
    assert "AGAIN after" in r.stdout and "setup timed out earlier" in r.stdout, r.output
    assert float(r.stdout.split("AGAIN after ")[1].split("s")[0]) < 1.5, r.output  # it retried: 2 s again
    assert "LEFT []" in r.stdout, "the shared-memory file was left in /dev/shm: " + r.output


def test_missing_peer_times_out_and_the_segment_refuses_reuse(tmp_path):
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", timeout=timedelta(seconds=2))
x = np.ones(1000, np.float32)
dist.all_reduce(x)                     # the segment is set up by both ranks
say("FIRST", x[0])
if dist.get_rank() == 0:
    t0 = time.monotonic()
    try:
        dist.all_reduce(x)             # rank 1 never comes
    except dist.DistTimeoutError as e:
        say(f"TIMEOUT after {time.monotonic() - t0:.1f}s: {e}")
    try:
        dist.all_reduce(x)
    except dist.DistTimeoutError as e:
        say("REFUSED", e)
    os._exit(0)
else:
    time.sleep(8)
    os._exit(0)
"""
    )
    r = run_mpi(2, script, tmp_path, env={"HPCDIST_SHM": "1"}, limit=90)
    assert not r.timed_out, r.output
    assert r.stdout.count("FIRST 2.0") == 2, r.output
    assert "TIMEOUT after" in r.stdout and "all_reduce" in r.stdout and "within 2s" in r.stdout, r.output
    assert float(r.stdout.split("TIMEOUT after ")[1].split("s")[0]) >= 1.9
    assert "REFUSED" in r.stdout and "out of step" in r.stdout, r.output


def test_stuck_peer_unhandled_timeout_ends_the_job(tmp_path):
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", timeout=timedelta(seconds=2))
x = np.ones(1 << 16, np.float32)
dist.broadcast(x, src=0)               # both ranks set the segment up
if dist.get_rank() == 1:
    time.sleep(300)                    # stuck: never calls again
dist.broadcast(x, src=0)               # rank 0's timeout is unhandled: the abort hook ends the whole job
say("NOT REACHED")
"""
    )
    r = run_mpi(2, script, tmp_path, env={"HPCDIST_SHM": "1"}, limit=90)
    assert not r.timed_out, "the job hung on a dead peer: " + r.output
    assert r.returncode != 0
    assert "NOT REACHED" not in r.stdout
    assert "DistTimeoutError" in r.stderr and "broadcast" in r.stderr, r.output


def test_dead_peer_ends_the_job(tmp_path):
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", timeout=timedelta(seconds=2))
x = np.ones(1 << 16, np.float32)
dist.all_reduce(x)
if dist.get_rank() == 1:
    os._exit(3)                        # dies without a word
dist.all_reduce(x)
say("NOT REACHED")
"""
    )
    r = run_mpi(2, script, tmp_path, env={"HPCDIST_SHM": "1"}, limit=90)
    assert not r.timed_out, "the job hung on a dead peer: " + r.output
    assert r.returncode != 0 and "NOT REACHED" not in r.stdout


def test_symmetric_memory_stuck_peer_is_a_timeout_and_unhandled_ends_the_job(tmp_path):
    """A peer that stops coming after a symmetric all_reduce: the next one times out with DistTimeoutError on the
    others (their arrays stay readable: the mapping is theirs too); unhandled, the next call ends the job."""
    script = (
        PRELUDE
        + """
from hpcdist import symmetric_memory
dist.init_process_group("mpi", timeout=timedelta(seconds=2))
x = symmetric_memory.empty(1 << 18)
x[:] = 1
dist.all_reduce(x)                     # in step, on symmetric memory
say(f"RANK {dist.get_rank()} FIRST {x[0]}")
if dist.get_rank() == 2:
    time.sleep(30)                     # stuck: never calls again
    os._exit(0)
t0 = time.monotonic()
try:
    dist.all_reduce(x)
except dist.DistTimeoutError as e:
    say(f"RANK {dist.get_rank()} TIMEOUT after {time.monotonic() - t0:.1f}s: {e}")
say(f"RANK {dist.get_rank()} STILL READS {float(x.sum()) > 0}")
dist.all_reduce(x)                     # unhandled now: the abort hook ends the job
say("NOT REACHED")
"""
    )
    r = run_mpi(3, script, tmp_path, env={"HPCDIST_SHM": "1"}, limit=90)
    assert not r.timed_out, "the job hung on a dead peer: " + r.output
    assert r.stdout.count("FIRST 3.0") == 3, r.output
    for rank in (0, 1):
        assert f"RANK {rank} TIMEOUT after" in r.stdout and f"RANK {rank} STILL READS True" in r.stdout, r.output
    assert "all_reduce" in r.stdout and "within 2s" in r.stdout, r.output
    assert r.returncode != 0 and "NOT REACHED" not in r.stdout, r.output


@pytest.mark.parametrize(("mode", "direct"), [("block", "1"), ("poll", "1"), ("block", "0")])
def test_ranks_calling_different_collectives_get_an_error_at_once_not_wrong_data(tmp_path, mode, direct):
    """Rank 1 broadcasts where the others all-reduce: the segment's counters alone would let them pass each
    other's syncs (rank 1 returning wrong data); the operation tags make every rank raise, naming both calls —
    on the direct path before any rank reads a peer's array by an address posted for another operation."""
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", timeout=timedelta(seconds=60))
x = np.ones(1000, np.float32)
dist.all_reduce(x)                     # in step: the segment is set up
t0 = time.monotonic()
try:
    if dist.get_rank() == 1:
        dist.broadcast(x, src=0)
    else:
        dist.all_reduce(x)
    say(f"RANK {dist.get_rank()} RETURNED")
except dist.DistError as e:
    say(f"RANK {dist.get_rank()} {type(e).__name__} after {time.monotonic() - t0:.1f}s: {e}")
try:
    dist.all_reduce(x)                 # the segment is out of step: the next call says why, at once
except dist.DistError as e:
    say(f"LATER {dist.get_rank()} {type(e).__name__}: {e}")
from mpi4py import MPI
MPI.COMM_WORLD.Barrier()               # every rank has said its lines: a rank that exits first (no MPI_Finalize)
os._exit(0)                            # makes mpiexec end the others, which could lose a slower rank's LATER line
"""
    )
    r = run_mpi(
        3, script, tmp_path, env={"HPCDIST_SHM": "1", "HPCDIST_WAIT": mode, "HPCDIST_SHM_DIRECT": direct}, limit=120
    )
    later = [ln for ln in r.stdout.splitlines() if ln.startswith("LATER ")]
    assert len(later) == 3, r.output
    for ln in later:  # a DistError naming the mismatch (it said "since an earlier timeout", a DistTimeoutError)
        assert " DistError: " in ln and "since an earlier error (the ranks called different collectives)" in ln, ln
    assert not r.timed_out, r.output
    lines = sorted(ln for ln in r.stdout.splitlines() if ln.startswith("RANK "))
    assert len(lines) == 3 and not any("RETURNED" in ln for ln in lines), r.output
    for ln in lines:
        assert "DistError after" in ln and "called different collectives" in ln, r.output
        assert "broadcast of 4000 bytes" in ln and "all_reduce of 4000 bytes" in ln, r.output
        assert float(ln.split(" after ")[1].split("s:")[0]) < 30, "not at once: " + ln


def test_a_failed_direct_read_is_a_clear_error_and_the_others_time_out(tmp_path):
    """The last rank's read of a peer's array fails (as when the peer exited): it raises DistError naming the
    operation at once; the others time out at the next sync instead of hanging; the segment then refuses every
    later call at once; the job ends (a timeout left the group out of step: exit status 124)."""
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", timeout=timedelta(seconds=3))
r, n = dist.get_rank(), dist.get_world_size()
x = np.ones(1000, np.float32)
dist.all_reduce(x)                     # sets up the segment, probes the direct reads
eng = dist.group.WORLD.engine("cpu")
say(f"RANK {r} DIRECT {eng.reads_directly} SUM {x[0]:g}")


def refused(rank, remote, local, nbytes):
    raise OSError(3, f"reading {nbytes} bytes of process 0 (process_vm_readv): No such process")


if r == n - 1:
    eng._rd.read = refused
t0 = time.monotonic()
for attempt in ("first", "again"):
    try:
        dist.all_reduce(x)
        say(f"RANK {r} {attempt} RETURNED")
    except dist.DistError as e:
        say(f"RANK {r} {attempt} {type(e).__name__} after {time.monotonic() - t0:.1f}s: {e}")
time.sleep(5)  # the first rank to exit ends the job (poisoned: MPI_Abort): let a rank the host ran late print
"""
    )
    r = run_mpi(3, script, tmp_path, env={"HPCDIST_SHM": "1", "HPCDIST_SHM_DIRECT": "1"}, limit=120)
    assert not r.timed_out, r.output
    out = r.stdout
    assert all(f"RANK {k} DIRECT True SUM 3" in out for k in range(3)), r.output
    assert "RETURNED" not in out, r.output
    failed = [ln for ln in out.splitlines() if ln.startswith("RANK 2 first ")]
    assert failed and "DistError after" in failed[0] and "reading group rank" in failed[0], r.output
    assert float(failed[0].split(" after ")[1].split("s:")[0]) < 2.5, "not at once: " + failed[0]
    for k in (0, 1):
        assert f"RANK {k} first DistTimeoutError" in out, r.output
    for k in (0, 1):  # each later use says why the segment is out of step, as the error it was
        assert f"RANK {k} again DistTimeoutError" in out, r.output
    assert "out of step since an earlier error (a wait timed out)" in out, r.output
    assert "RANK 2 again DistError" in out and "out of step since an earlier error (a direct read failed)" in out
    assert r.returncode == 124, r.output


def test_a_file_left_by_a_job_killed_during_setup_is_removed_by_the_next_segment(tmp_path):
    """A job ended by MPI_Abort while its rank 0 waited for the others to map the new file leaves the file in
    /dev/shm (rank 0 is killed before it unlinks it). The next segment set up on the node removes it: its
    creator, a process of this PID namespace, is gone. Files of live processes stay."""
    import os
    import subprocess
    import sys

    from hpcdist.backends.shm import segment

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    ns = segment._pid_namespace()
    left = f"/dev/shm/hpcdist-{ns}-{child.pid}-{os.urandom(6).hex()}"
    live = f"/dev/shm/hpcdist-{ns}-{os.getpid()}-{os.urandom(6).hex()}"
    for p in (left, live):
        with open(p, "wb") as f:
            f.write(b"\0" * 4096)
    try:
        script = (
            PRELUDE
            + """
dist.init_process_group("mpi", timeout=timedelta(seconds=30))
x = np.ones(1000, np.float32)
dist.all_reduce(x)                     # the first shared-memory call: rank 0 creates the segment's file
say("SUM", x[0])
"""
        )
        r = run_mpi(2, script, tmp_path, env={"HPCDIST_SHM": "1"}, limit=90)
        assert r.returncode == 0 and "SUM 2.0" in r.stdout, r.output
        assert not os.path.exists(left), "the leftover of a dead creator was not removed"
        assert os.path.exists(live), "a live process's file was removed"
    finally:
        for p in (left, live):
            if os.path.exists(p):
                os.unlink(p)


@pytest.mark.parametrize("wait", ["block", "poll"])
def test_barrier_timeout_bounds_the_shared_memory_barrier(tmp_path, wait):
    """``barrier(timeout=2s)`` on a group whose timeout is 60 s: the shared-memory barrier waited the group's
    timeout (30 minutes by default) instead of its own; now rank 0 gets DistTimeoutError naming 2 s."""
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", timeout=timedelta(seconds=60))
dist.barrier()                         # the segment is set up by both ranks
if dist.get_rank() == 0:
    t0 = time.monotonic()
    try:
        dist.barrier(timeout=timedelta(seconds=2))   # rank 1 never comes
    except dist.DistTimeoutError as e:
        say(f"TIMEOUT after {time.monotonic() - t0:.1f}s: {e}")
    os._exit(0)
else:
    time.sleep(15)
    os._exit(0)
"""
    )
    r = run_mpi(2, script, tmp_path, env={"HPCDIST_SHM": "1", "HPCDIST_WAIT": wait}, limit=90)
    assert not r.timed_out, r.output
    assert "TIMEOUT after" in r.stdout and "barrier" in r.stdout and "within 2s" in r.stdout, r.output
    assert 1.9 <= float(r.stdout.split("TIMEOUT after ")[1].split("s")[0]) < 14  # its own bound, not the group's


def test_ranks_pinned_to_different_cpus_take_the_same_path(tmp_path):
    """Rank 0 pinned to one CPU, rank 1 free: each rank judged the node oversubscribed from its own affinity, so
    rank 0 took shared memory for an 8 KiB all_reduce and rank 1 MPI, and both waited for the other until the
    timeout. The node's CPUs now come from init's layout exchange: one answer on every rank."""
    import os
    import shutil
    import sys

    from mpirun import run_limited

    if shutil.which("taskset") is None or len(os.sched_getaffinity(0)) < 2:
        pytest.skip("needs taskset and two CPUs to pin one rank to one of them")
    script = tmp_path / "pinned.py"
    script.write_text(
        PRELUDE
        + """
from hpcdist._world import WORLD
dist.init_process_group("mpi", timeout=timedelta(seconds=10))
x = np.full(2048, dist.get_rank() + 1.0, np.float32)   # 8 KiB: MPI's size unless the node is oversubscribed
dist.all_reduce(x)
eng = dist.group.WORLD.engine("cpu")
say("RESULT", dist.get_rank(), x[0], x[-1], len(os.sched_getaffinity(0)), WORLD.node_cpus, eng.path("all_reduce", 8192))
dist.destroy_process_group()
"""
    )
    mpiexec = shutil.which("mpiexec") or "mpiexec"
    cmd = [mpiexec, "-n", "1", "taskset", "-c", "0", sys.executable, str(script)]
    cmd += [":", "-n", "1", sys.executable, str(script)]
    env = {k: v for k, v in os.environ.items() if k not in ("HPCDIST_SHM", "HPCDIST_WAIT")}
    r = run_limited(cmd, env=env, limit=90)
    assert not r.timed_out and r.returncode == 0, r.output
    lines = sorted(line.split() for line in r.stdout.splitlines() if line.startswith("RESULT"))
    assert [ln[1:4] for ln in lines] == [["0", "3.0", "3.0"], ["1", "3.0", "3.0"]], r.output
    assert lines[0][4] == "1" and lines[1][4] != "1", r.output  # rank 0 was pinned, rank 1 was not
    assert lines[0][5:] == lines[1][5:], r.output  # the same node CPUs and path on both ranks


def test_an_operation_interrupted_on_one_rank_leaves_the_segment_refusing_reuse(tmp_path):
    """An exception raised inside a shared-memory operation on one rank (Ctrl-C in a notebook, a signal handler's
    error) left its counters mid-operation. Calling again there began the next operation on them: its syncs let
    the peer, still in the interrupted one, pass a sync it should wait at and read a slot being rewritten. Now the
    interrupted rank's segment refuses reuse at once, and the peer times out instead of reading garbage."""
    script = (
        PRELUDE
        + """
import signal
dist.init_process_group("mpi", timeout=timedelta(seconds=3))
x = np.full(1 << 16, float(dist.get_rank() + 1), np.float32)
dist.all_reduce(x)                     # the segment is set up by both ranks
if dist.get_rank() == 0:
    def interrupt(signum, frame):
        raise KeyboardInterrupt("interrupted by the test")
    signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 0.5)
    try:
        dist.all_reduce(x)             # rank 1 comes 1.5 s later: interrupted while it waits in the operation
    except KeyboardInterrupt as e:
        say("INTERRUPTED", e)
    y = np.full(1 << 16, 1.0, np.float32)
    try:
        dist.all_reduce(y)
        say("AGAIN RAN", y[:2])
    except dist.DistError as e:
        say("AGAIN REFUSED", type(e).__name__, e)
    time.sleep(6)
    os._exit(0)
else:
    time.sleep(1.5)
    try:
        dist.all_reduce(x)
        say("PEER RETURNED", x[:2])
    except dist.DistError as e:
        say("PEER FAILED", type(e).__name__, e)
    os._exit(0)
"""
    )
    r = run_mpi(2, script, tmp_path, env={"HPCDIST_SHM": "1", "HPCDIST_SHM_SLOT": "4096"}, limit=90)
    assert not r.timed_out, "the job hung: " + r.output
    assert "INTERRUPTED" in r.stdout, r.output
    assert "AGAIN REFUSED DistError" in r.stdout and "interrupted" in r.stdout.split("AGAIN REFUSED")[1], r.output
    assert "PEER FAILED DistTimeoutError" in r.stdout, r.output
