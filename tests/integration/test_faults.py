"""Faults under a real mpiexec: timeouts, an exception on one rank, monitored_barrier, re-init.

Every launch has a hard time limit (``run_mpi(limit=...)``); the asserted
elapsed times are hang guards (generous), never speed claims.
"""

from __future__ import annotations

import os
import re

import pytest
from mpirun import ROOT, run_mpi

pytestmark = pytest.mark.timeout(240)

PRELUDE = """
import os, sys, time
from datetime import timedelta
import numpy as np
import hpcdist as dist


def say(*parts):
    os.write(1, (" ".join(map(str, parts)) + chr(10)).encode())  # one write: lines of ranks never mix
"""


def test_collective_timeout_raises_in_poll_mode(tmp_path):
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", timeout=timedelta(seconds=2))
x = np.ones(4)
if dist.get_rank() == 0:
    t0 = time.monotonic()
    try:
        dist.all_reduce(x)
    except dist.DistTimeoutError as e:
        say(f"TIMEOUT after {time.monotonic() - t0:.1f}s: {e}")
else:
    time.sleep(4)          # arrives late: the pending operation completes and the job ends cleanly
    dist.all_reduce(x)
"""
    )
    r = run_mpi(2, script, tmp_path, env={"HPCDIST_WAIT": "poll"}, limit=60)
    assert not r.timed_out, r.output
    assert "TIMEOUT after" in r.stdout, r.output
    assert "all_reduce" in r.stdout and "did not complete within 2s" in r.stdout
    waited = float(r.stdout.split("TIMEOUT after ")[1].split("s")[0])
    assert waited >= 1.9


def test_collective_timeout_in_block_mode_ends_the_job(tmp_path):
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", timeout=timedelta(seconds=2))
if dist.get_rank() == 0:
    dist.all_reduce(np.ones(4))   # the peer never comes: the watchdog ends the job
else:
    time.sleep(120)
"""
    )
    r = run_mpi(2, script, tmp_path, env={"HPCDIST_WAIT": "block"}, limit=60)
    assert not r.timed_out, "the watchdog did not end the job"
    assert r.returncode != 0
    assert "DistTimeoutError" in r.stderr and "all_reduce" in r.stderr, r.output


# The lanes (the one-call paths of a group's repeated small blocking calls, docs/performance.md) time out as the
# general path does. Each call below runs once on every rank (the general path, which learns the lane), then
# again with rank 1 late: rank 0 waits in the lane. op -> (the call, the name its timeout error gives).
LANE_CALLS = {
    "all_reduce": ("dist.all_reduce(np.ones(4))", "all_reduce"),
    "broadcast": ("dist.broadcast(np.ones(4), src=1)", "broadcast"),
    "all_gather_into_tensor": (
        "dist.all_gather_into_tensor(np.zeros(8), np.ones(4))",
        "all_gather_into_tensor",
    ),
    "barrier": ("dist.barrier()", "barrier"),
    "reduce": ("dist.reduce(np.ones(4), dst=0)", "reduce"),
    "all_to_all_single": ("dist.all_to_all_single(np.zeros(4), np.ones(4))", "all_to_all_single"),
    "all_gather": ("dist.all_gather([np.zeros(4), np.zeros(4)], np.ones(4))", "all_gather"),
    "gather": ("dist.gather(np.ones(4), [np.zeros(4)] * 2 if dist.get_rank() == 0 else None, dst=0)", "gather"),
    "scatter": ("dist.scatter(np.zeros(4), [np.ones(4)] * 2 if dist.get_rank() == 1 else None, src=1)", "scatter"),
    "reduce_scatter_tensor": (
        "dist.reduce_scatter_tensor(np.zeros(4), np.ones(8))",
        "reduce_scatter_tensor",
    ),
}
LANE_SCRIPT = """
from hpcdist.group import default_pg
dist.init_process_group("mpi", timeout=timedelta(seconds=1.5))
pg = default_pg()
for op in OPS:
    call = CALLS[op]
    exec(call)
    lanes = [lane for lanes in pg._lane_tables() for lane in lanes.values() if lane[2] > 4 * 8]
    say("LANE", op, bool(lanes or pg._barrier_lane))
    if dist.get_rank() == 0:
        t0 = time.monotonic()
        try:
            exec(call)
            say("COMPLETED", op)
        except dist.DistTimeoutError as e:
            say(f"TIMEOUT {op} after {time.monotonic() - t0:.1f}s: {e}")
    else:
        time.sleep(LATE)  # poll mode: arrives late, the pending operation completes and the job goes on
        exec(call)
    pg._drop_lanes()  # the next op learns its own lane
    dist.barrier(timeout=timedelta(seconds=30))
x = np.ones(1); dist.all_reduce(x); say("USABLE", x[0])
"""


def _lane_script(ops: list[str], late: float) -> str:
    calls = {op: LANE_CALLS[op][0] for op in ops}
    return PRELUDE + f"OPS = {ops!r}\nCALLS = {calls!r}\nLATE = {late}\n" + LANE_SCRIPT


def test_lane_calls_time_out_in_poll_mode(tmp_path):
    ops = list(LANE_CALLS)
    r = run_mpi(2, _lane_script(ops, 3.5), tmp_path, env={"HPCDIST_WAIT": "poll", "HPCDIST_SHM": "0"}, limit=120)
    assert not r.timed_out, r.output
    # the late peer completed every pending operation and the group went on; a process whose operation timed
    # out still ends with MPI_Abort(124) at exit, not MPI_Finalize (hpcdist/_exit.py: it could not know)
    assert r.stdout.count("USABLE 2.0") == 2 and r.returncode == 124, r.output
    for op in ops:
        assert f"LANE {op} True" in r.stdout, r.output  # the second call was the lane's
        line = next(x for x in r.stdout.splitlines() if x.startswith(f"TIMEOUT {op} "))
        assert f"{LANE_CALLS[op][1]}" in line and "did not complete within 1.5s" in line, line
        assert float(line.split(" after ")[1].split("s")[0]) >= 1.4


@pytest.mark.parametrize("op", list(LANE_CALLS))
def test_lane_calls_time_out_in_block_mode_and_end_the_job(tmp_path, op):
    r = run_mpi(2, _lane_script([op], 120), tmp_path, env={"HPCDIST_WAIT": "block", "HPCDIST_SHM": "0"}, limit=60)
    assert not r.timed_out, "the watchdog did not end the job"
    assert f"LANE {op} True" in r.stdout, r.output
    assert r.returncode != 0
    assert "DistTimeoutError" in r.stderr and LANE_CALLS[op][1] in r.stderr, r.output


def test_receive_timeout_raises(tmp_path):
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", timeout=timedelta(seconds=1.5))
if dist.get_rank() == 0:
    try:
        dist.recv(np.zeros(2), src=1)   # rank 1 never sends
    except dist.DistTimeoutError as e:
        say("RECV TIMEOUT", e)
dist.barrier(timeout=timedelta(seconds=30))
x = np.ones(1); dist.all_reduce(x); say("STILL USABLE", x[0])
"""
    )
    r = run_mpi(2, script, tmp_path, limit=60)
    assert not r.timed_out and r.returncode == 0, r.output
    assert "RECV TIMEOUT" in r.stdout and r.stdout.count("STILL USABLE 2.0") == 2, r.output


def test_exception_on_one_rank_ends_the_job(tmp_path):
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", timeout=timedelta(seconds=600))
if dist.get_rank() == 1:
    raise RuntimeError("boom on purpose")
dist.all_reduce(np.ones(4))   # would wait 10 minutes without the abort hook
"""
    )
    r = run_mpi(3, script, tmp_path, limit=90)
    assert not r.timed_out, "an exception on one rank left the others hanging"
    assert r.returncode != 0
    assert "[rank 1] RuntimeError: boom on purpose" in r.stderr, r.output


@pytest.mark.parametrize(("how", "status"), [("sys.exit(3)", 3), ("sys.exit('bad config')", 1)])
def test_a_failing_sys_exit_on_one_rank_ends_the_job(tmp_path, how, status):
    """argparse's error() and scripts end with sys.exit(nonzero); the rank used to wait in MPI_Finalize for peers
    that waited for it in a collective, until their timeout (10 minutes here)."""
    script = (
        PRELUDE
        + f"""
dist.init_process_group("mpi", timeout=timedelta(seconds=600))
if dist.get_rank() == 1:
    try:
        {how}
    finally:
        say("RANK1 FINALLY RAN")   # the rank leaves as Python does: finally blocks first
dist.all_reduce(np.ones(4))
"""
    )
    r = run_mpi(3, script, tmp_path, limit=90)
    assert not r.timed_out, "a rank that exited with a failing status left the others waiting"
    assert r.returncode == status, r.output
    assert "RANK1 FINALLY RAN" in r.stdout
    assert f"[rank 1] hpcdist: exiting with status {status} while the process group is up" in r.stderr, r.output


@pytest.mark.parametrize("how", ["raise RuntimeError('bad config')", "os._exit(0)"])
def test_a_rank_that_ends_before_init_does_not_leave_the_others_in_mpi_init(tmp_path, how):
    """Under mpiexec (Hydra) a rank that ended before MPI_Init, with any status, left the others waiting in
    MPI_Init for ever (measured: still there after the test's limit). init_process_group's timeout bounds it now:
    each waiting rank says why and is ended, and the launcher ends the job."""
    script = (
        PRELUDE
        + f"""
if os.environ.get("PMI_RANK") == "2":
    {how}
dist.init_process_group("mpi", timeout=timedelta(seconds=3))
say("INIT RETURNED")
"""
    )
    r = run_mpi(3, script, tmp_path, limit=60)
    assert not r.timed_out, "a rank that ended before init left the others in MPI_Init"
    assert r.returncode != 0, r.output
    assert "INIT RETURNED" not in r.stdout, r.output
    assert re.search(r"hpcdist: MPI_Init on rank [01] \(pid \d+\) did not complete within 3s", r.stderr), r.output
    assert "a rank that ended before init_process_group" in r.stderr, r.output


def test_the_torch_backends_init_is_bounded_the_same_way(tmp_path):
    """torch.distributed.init_process_group("hpcdist") under mpiexec starts MPI in hpcdist's mpi:// rendezvous."""
    pytest.importorskip("torch")
    script = """
import os
from datetime import timedelta
if os.environ.get("PMI_RANK") == "1":
    raise RuntimeError("bad config")
import torch.distributed as td
import hpcdist.torch  # the "hpcdist" backend
td.init_process_group("hpcdist", timeout=timedelta(seconds=3))
print("INIT RETURNED", flush=True)
"""
    r = run_mpi(2, script, tmp_path, limit=90)
    assert not r.timed_out, "a rank that ended before init left the other in MPI_Init"
    assert r.returncode != 0 and "INIT RETURNED" not in r.stdout, r.output
    assert "hpcdist: MPI_Init on rank 0 (pid " in r.stderr and "did not complete within 3s" in r.stderr, r.output


def test_init_under_a_launcher_leaves_no_watcher_behind(tmp_path):
    """The MPI_Init bound's watcher process ends once MPI is up: no child of the rank is left after init."""
    script = (
        PRELUDE
        + """
from proc_children import children


dist.init_process_group("mpi", timeout=timedelta(seconds=60))
deadline = time.monotonic() + 10
while children() and time.monotonic() < deadline:
    time.sleep(0.05)
say("rank", dist.get_rank(), "children", children())
dist.barrier()
"""
    )
    path = os.pathsep.join((str(ROOT), str(ROOT / "tests")))  # hpcdist and tests/proc_children
    r = run_mpi(2, script, tmp_path, limit=60, env={"PYTHONPATH": path})
    assert r.returncode == 0 and not r.timed_out, r.output
    said = sorted(line for line in r.stdout.splitlines() if "children" in line)
    assert said == ["rank 0 children []", "rank 1 children []"], r.output


def test_exiting_with_status_0_everywhere_finalizes_normally(tmp_path):
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", timeout=timedelta(seconds=60))
x = np.ones(4)
dist.all_reduce(x)
say("SUM", x[0])
sys.exit(0)   # no destroy_process_group: MPI_Finalize at exit, as before
"""
    )
    r = run_mpi(2, script, tmp_path, limit=60)
    assert not r.timed_out and r.returncode == 0, r.output
    assert r.stdout.count("SUM 2.0") == 2 and "MPI_Abort" not in r.output and "exiting with status" not in r.stderr


def test_abort_hook_can_be_turned_off(tmp_path):
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", timeout=timedelta(seconds=2))
if dist.get_rank() == 1:
    raise RuntimeError("boom on purpose")
try:
    dist.all_reduce(np.ones(4))
except dist.DistTimeoutError:
    say("RANK0 TIMED OUT INSTEAD")
    os._exit(3)
"""
    )
    r = run_mpi(2, script, tmp_path, env={"HPCDIST_ABORT_ON_EXCEPTION": "0", "HPCDIST_WAIT": "poll"}, limit=60)
    assert not r.timed_out, r.output
    assert "hpcdist: unhandled exception; aborting" not in r.stderr
    assert "RuntimeError: boom on purpose" in r.stderr
    assert "RANK0 TIMED OUT INSTEAD" in r.stdout, r.output


@pytest.mark.parametrize(
    ("n", "missing", "wait_all", "expect"), [(3, [2], False, "rank 2 "), (4, [2, 3], True, "ranks 2, 3 ")]
)
def test_monitored_barrier_names_missing_ranks(tmp_path, n, missing, wait_all, expect):
    script = (
        PRELUDE
        + f"""
dist.init_process_group("mpi", timeout=timedelta(seconds=30))
if dist.get_rank() in {missing}:
    time.sleep(8)   # never arrive in time
    os._exit(0)
try:
    dist.monitored_barrier(timeout=timedelta(seconds=1.5), wait_all_ranks={wait_all})
except dist.DistTimeoutError as e:
    say(f"R{{dist.get_rank()}}: {{e}}")
time.sleep(4)       # let every waiting rank reach its own timeout before anyone exits
os._exit(0)
"""
    )
    r = run_mpi(n, script, tmp_path, env={"HPCDIST_ABORT_ON_EXCEPTION": "0"}, limit=60)
    assert not r.timed_out, r.output
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("R0:"))
    assert f"global {expect}failed to pass monitored_barrier" in line, line
    assert any(ln.startswith("R1:") and "did not release" in ln for ln in r.stdout.splitlines()), r.output


def test_destroy_and_reinit(tmp_path):
    script = (
        PRELUDE
        + """
for round in range(3):
    dist.init_process_group("mpi")
    g = dist.new_group([0])
    x = np.ones(3); dist.all_reduce(x)
    assert x[0] == dist.get_world_size()
    dist.destroy_process_group(g)
    dist.destroy_process_group()
    assert not dist.is_initialized()
say("REINIT OK")
"""
    )
    r = run_mpi(2, script, tmp_path, limit=60)
    assert r.returncode == 0 and r.stdout.count("REINIT OK") == 2, r.output


def test_tutorial_init_arguments(tmp_path):
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", rank=0, world_size=0)     # the tutorial's call: take both from MPI
say("TUTORIAL", dist.get_rank(), dist.get_world_size())
dist.destroy_process_group()
dist.init_process_group("gloo", rank=-1, world_size=-1)  # gloo runs on MPI
assert dist.get_backend() == "gloo"
dist.destroy_process_group()
for kwargs in ({"world_size": 5}, {"rank": 1 - int(os.environ.get("PMI_RANK", "0"))}):
    try:
        dist.init_process_group("mpi", **kwargs)
    except ValueError as e:
        say("REFUSED", sorted(kwargs))
"""
    )
    r = run_mpi(2, script, tmp_path, limit=60)
    assert r.returncode == 0, r.output
    assert sorted(ln for ln in r.stdout.splitlines() if ln.startswith("TUTORIAL")) == ["TUTORIAL 0 2", "TUTORIAL 1 2"]
    assert r.stdout.count("REFUSED ['world_size']") == 2 and r.stdout.count("REFUSED ['rank']") == 2, r.output


def _mem_available_gb() -> float:
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return 0.0


@pytest.mark.timeout(400)
def test_counts_beyond_int32(tmp_path):
    """2**31 + 16 elements: broadcast, all_reduce and an object of > 2 GiB (MPI-4 large counts)."""
    if _mem_available_gb() < 16:
        pytest.skip(f"needs ~16 GiB of free memory for 2 ranks x 2 GiB buffers, have {_mem_available_gb():.1f}")
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi")
r = dist.get_rank()
n = 2**31 + 16
a = np.zeros(n, dtype=np.uint8)
if r == 0:
    a[0], a[2**31 - 1], a[2**31], a[-1] = 1, 2, 3, 4
dist.broadcast(a, src=0)
assert (a[0], a[2**31 - 1], a[2**31], a[-1]) == (1, 2, 3, 4), "broadcast"
assert int(a[1:2**31 - 1].max()) == 0
a[:] = 1
dist.all_reduce(a)
assert int(a[-1]) == 2 and int(a[2**31 + 7]) == 2 and int(a.min()) == 2, "all_reduce"
del a
objs = [np.full(2**31 + 16, 7, dtype=np.uint8) if r == 0 else None]
dist.broadcast_object_list(objs, src=0)
assert objs[0].size == 2**31 + 16 and int(objs[0][-1]) == 7, "object"
say("LARGE OK", r)
"""
    )
    res = run_mpi(2, script, tmp_path, limit=380, env={"HPCDIST_WAIT": "poll"})
    assert res.returncode == 0 and res.stdout.count("LARGE OK") == 2, res.output


def test_debug_detail_names_mismatched_collectives(tmp_path):
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", timeout=timedelta(seconds=20))
x = np.ones(4, dtype=np.float32)
try:
    if dist.get_rank() == 1:
        dist.broadcast(x, src=0)       # the others call all_reduce: a bug that would hang or corrupt
    else:
        dist.all_reduce(x)
except dist.DistError as e:
    say(f"R{dist.get_rank()}: {e}")
dist.all_reduce(x)                      # the group is still usable
say("USABLE", x[0])
"""
    )
    r = run_mpi(3, script, tmp_path, env={"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}, limit=60)
    assert r.returncode == 0 and not r.timed_out, r.output
    for rank in range(3):
        line = next(ln for ln in r.stdout.splitlines() if ln.startswith(f"R{rank}:"))
        assert "collective mismatch" in line and "global rank 1: broadcast(float32, root 0" in line, line
        assert "global rank 0: all_reduce(float32, SUM" in line
    assert r.stdout.count("USABLE") == 3


def test_shrink_group_excludes_a_rank_that_is_gone(tmp_path):
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", timeout=timedelta(seconds=30))
if dist.get_rank() == 1:
    time.sleep(6)          # a rank that stopped taking part: it never calls shrink_group
    os._exit(0)
g = dist.shrink_group([1])
x = np.array([float(dist.get_rank())]); dist.all_reduce(x, group=g)
say("SHRUNK", dist.get_rank(), dist.get_process_group_ranks(g), x[0])
time.sleep(7)
os._exit(0)
"""
    )
    r = run_mpi(3, script, tmp_path, limit=60)
    assert not r.timed_out, r.output
    lines = sorted(ln for ln in r.stdout.splitlines() if ln.startswith("SHRUNK"))
    assert lines == ["SHRUNK 0 [0, 2] 2.0", "SHRUNK 2 [0, 2] 2.0"], r.output
