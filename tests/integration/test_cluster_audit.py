"""Audit of collectives across several nodes: real processes, real node layouts, hard time limits.

Two kinds of job:

* **One host, several "nodes" by ``HPCDIST_NODE_ID``** (``mpiexec``; each rank
  sets its node name from its rank before ``init_process_group``, so the
  node layout comes from init as on a cluster, not from a patched
  ``WORLD.node_of``). Used where the point is timing or failure behaviour of
  the hierarchical engine, which a shared test session cannot survive.
* **The simulated cluster** (``scripts/cluster-up``: network, UTS and mount
  namespaces; as tests/integration/test_cluster.py): uneven nodes (2+1 on two
  nodes, 2+2+1 on three), groups of some ranks only, a rank that dies
  mid-collective, and a rank whose host name equals another node's while its
  ``/dev/shm`` is its own.

Every launch is killed after its limit (``run_mpi(limit=)``, ``JOB_LIMIT``);
no elapsed time is asserted (a timeout is checked by the limit its error names). Docstrings say
``DEFECT:`` (fails on the code audited, file:line) or ``GUARD:`` (a risky edge that works).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import simcluster
from mpirun import ROOT, mpiexec, run_limited, run_mpi

pytestmark = pytest.mark.timeout(600)

NAME = f"hpcau{os.getpid() % 100000}"  # clusters of this test session's own
JOB_LIMIT = 240.0  # seconds for one cluster job, all ranks together

# --------------------------------------------------------------------------------------------------------------------
# One host, nodes named by HPCDIST_NODE_ID
# --------------------------------------------------------------------------------------------------------------------

PRELUDE = """
import os, sys, time
from datetime import timedelta
import numpy as np

RANK = int(os.environ["PMI_RANK"])
LAYOUT = os.environ["AUDIT_LAYOUT"].split(",")       # node name of each rank
os.environ["HPCDIST_NODE_ID"] = LAYOUT[RANK]          # before init: init's node layout is this one
import hpcdist as dist
import hpcdist.work


def say(*parts):
    os.write(1, (f"[{RANK}] " + " ".join(map(str, parts)) + chr(10)).encode())


# leave once every rank said its results (one rank leaving ends the launch), at the latest ``limit`` s after ``t0``:
# each rank leaves a file beside this script, then waits for the others'
def leave_together(t0, limit):
    here = os.path.dirname(os.path.abspath(__file__))
    open(os.path.join(here, f"done-{RANK}"), "w").close()
    n = len(LAYOUT)
    while time.monotonic() < t0 + limit and not all(os.path.exists(os.path.join(here, f"done-{r}")) for r in range(n)):
        time.sleep(0.05)
    os._exit(0)
"""


def _node_env(layout: str, **extra: str) -> dict[str, str]:
    env = {"AUDIT_LAYOUT": layout, "HPCDIST_HIER": "1", "HPCDIST_SHM": "1", "HPCDIST_WAIT": "poll"}
    env.update(extra)
    return env


def _lines(out: str, tag: str) -> dict[int, str]:
    """``{rank: rest of line}`` of the lines ``[rank] TAG rest``."""
    found = {}
    for line in out.splitlines():
        if line.startswith("[") and f"] {tag} " in line:
            rank = int(line[1 : line.index("]")])
            found[rank] = line.split(f"] {tag} ", 1)[1]
    return found


# every rank but the laggard all-reduces ``x`` ({call}) and says the limit its error names; all leave together once
# they have (15 s after it at the latest)
_ALL_BUT = """
t0 = time.monotonic()
if RANK != {laggard}:
    try:
        {call}
        say("RESULT none")
    except dist.DistError as e:
        import re
        say("RESULT", type(e).__name__, re.search(r"within ([0-9.]+)s", str(e)).group(1))
leave_together(t0, 15)
"""


def test_set_timeout_after_first_hierarchical_call_bounds_the_node_steps(tmp_path):
    """DEFECT: ``ProcessGroup.set_timeout`` does not reach the node-local steps of the hierarchical engine.

    hpcdist/backends/hierarchical.py:146-154 builds the node group with ``timeout=pg._timeout`` once (on the first
    hierarchical call); hpcdist/group.py:141 ``set_timeout`` changes only the parent's ``_timeout_s``. The step
    between the nodes reads the parent's (hierarchical.py:227), the node steps their own copy (shm segment waits:
    ``seg.timeout_s = self.pg._timeout_s`` of the node group, shm/engine.py:224). So after ``set_timeout(3 s)`` a
    rank whose node peer never comes waits the *old* timeout (30 s here) while its peer across the nodes gives up
    after 3 s; lowering a timeout that was raised for a long phase leaves ranks stuck for the long one, and raising
    it (say, for a slow checkpoint) still fails the node steps at the short one.

    Nodes a = ranks 0, 1 and b = rank 2; rank 1 never calls the second all_reduce.
    """
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", timeout=timedelta(seconds=30))
x = np.ones(4096, np.float32)
dist.all_reduce(x)                                  # the topology and the node group, with the 30 s timeout
pg = dist.group.WORLD
pg.set_timeout(timedelta(seconds=3))
say("NODE_TIMEOUT", pg.engine("cpu")._topo.node_pg.timeout.total_seconds())
"""
        + _ALL_BUT.format(laggard=1, call="dist.all_reduce(x)")
    )
    r = run_mpi(3, script, tmp_path, env=_node_env("a,a,b"), limit=120)
    assert not r.timed_out, r.output
    node_timeouts = _lines(r.stdout, "NODE_TIMEOUT")
    results = _lines(r.stdout, "RESULT")
    assert set(results) == {0, 2}, r.output
    # every rank's error is the group's new 3 s timeout, the node steps' too (they kept the first call's 30 s)
    assert all(v.split() == ["DistTimeoutError", "3"] for v in results.values()), (results, node_timeouts)


def test_timed_out_step_between_nodes_keeps_its_request_and_buffers(tmp_path):
    """DEFECT: a step between the nodes that times out drops its in-flight MPI request and buffers.

    hpcdist/backends/hierarchical.py:225-228 ``_wait_between_nodes`` raises ``timeout_error`` without
    ``strand([req], buffers)``, where every other timed-out path keeps them for good (mpi/engine.py:192,
    _timed.py:56, work.py:260): the request object and the arrays it reads/writes (``mine``, ``work``, the
    caller's array) are freed while the non-blocking collective is still active, so a late peer makes MPI write
    freed memory (and mpi4py frees an active non-blocking collective request, which MPI calls erroneous). Seen here
    as ``hpcdist.work._STRANDED`` not growing on the leader that timed out between the nodes.

    Nodes a = ranks 0, 1 and b = rank 2; rank 2 comes 8 s late to a 2 s timeout.
    """
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", timeout=timedelta(seconds=2))
x = np.ones(4096, np.float32)
dist.all_reduce(x)                                  # topology built, everyone in step
before = len(hpcdist.work._STRANDED)
t0 = time.monotonic()
if RANK == 2:
    time.sleep(8)
try:
    dist.all_reduce(x)
    say("RESULT ok")
except dist.DistError as e:
    say("RESULT", type(e).__name__, "stranded", len(hpcdist.work._STRANDED) - before, str(e)[:160])
leave_together(t0, 16)
"""
    )
    r = run_mpi(3, script, tmp_path, env=_node_env("a,a,b"), limit=90)
    assert not r.timed_out, r.output
    results = _lines(r.stdout, "RESULT")
    assert "DistTimeoutError" in results.get(0, ""), r.output
    assert "between nodes" in results[0], r.output  # rank 0 is node a's leader: it timed out in the leaders' step
    stranded = int(results[0].split("stranded ")[1].split()[0])
    assert stranded >= 1, "the timed-out request between the nodes was dropped, not kept: " + results[0]


@pytest.mark.parametrize("asynchronous", [False, True], ids=["blocking", "async"])
@pytest.mark.parametrize("laggard", [1, 2])
def test_a_rank_that_never_comes_gives_every_other_rank_a_timeout(tmp_path, laggard, asynchronous):
    """GUARD: poll mode, 2+1 nodes, one rank (a non-leader of node a, or node b's only rank) never makes a large
    hierarchical all_reduce, blocking or asynchronous (its steps on the engine's thread): each of the others
    raises DistTimeoutError naming the group's 2 s timeout."""
    call = "dist.all_reduce(x, async_op=True).wait()" if asynchronous else "dist.all_reduce(x)"
    script = (
        PRELUDE
        + """
dist.init_process_group("mpi", timeout=timedelta(seconds=2))
x = np.ones(1 << 18, np.float32)
dist.all_reduce(x)
"""
        + _ALL_BUT.format(laggard=laggard, call=call)
    )
    r = run_mpi(3, script, tmp_path, env=_node_env("a,a,b"), limit=90)
    assert not r.timed_out, r.output
    results = _lines(r.stdout, "RESULT")
    assert set(results) == {0, 1, 2} - {laggard}, r.output
    for rank, line in results.items():
        kind, limit = line.split()[:2]
        assert kind == "DistTimeoutError" and float(limit) == 2.0, (rank, line, r.output)  # the group's timeout


TORCH_ACROSS_NODES = """
import torch
import torch.distributed as td
import hpcdist.torch  # noqa: F401
td.init_process_group("hpcdist")
eng = td.distributed_c10d._get_default_group()._get_backend(torch.device("cpu")).hpcdist_group.engine("cpu")
went = []                                            # per call of the engine: whether it went hierarchical
use = eng._use
def spy(sync, nbytes):
    topo = use(sync, nbytes)
    went.append((sync, topo is not None))
    return topo
eng._use = spy
n, big, m = 3, 1 << 20, 1 << 18                      # 4 MiB, and 1 MiB blocks: the threshold is 1 MiB
def step(name, ok):
    say("STEP", name, any(h for _, h in went), any(h and not sync for sync, h in went), bool(ok))
    went.clear()
t = torch.full((big,), float(RANK + 1))
td.all_reduce(t)
step("all_reduce", torch.equal(t, torch.full((big,), 6.0)))
b = torch.full((big,), 7.0 if RANK == 1 else -1.0)
td.broadcast(b, src=1)
step("broadcast", torch.equal(b, torch.full((big,), 7.0)))
out = torch.empty(n * m)
td.all_gather_into_tensor(out, torch.full((m,), float(RANK)))
step("all_gather_into_tensor", torch.equal(out, torch.arange(n).float().repeat_interleave(m)))
x = torch.arange(n * m, dtype=torch.float64) + RANK
mine = torch.empty(m, dtype=torch.float64)
td.reduce_scatter_tensor(mine, x)
step("reduce_scatter_tensor", torch.equal(mine, 3 * torch.arange(RANK * m, (RANK + 1) * m, dtype=torch.float64) + 3))
t = torch.full((big,), float(RANK + 1))
td.all_reduce(t, async_op=True).wait()
step("async_all_reduce", torch.equal(t, torch.full((big,), 6.0)))
b = torch.full((big,), 7.0 if RANK == 1 else -1.0)
td.broadcast(b, src=1, async_op=True).wait()
step("async_broadcast", torch.equal(b, torch.full((big,), 7.0)))
t = torch.full((big,), float(RANK + 1))              # rank 0 asynchronous, the others blocking: they meet
w = td.all_reduce(t, async_op=RANK == 0)
if w is not None:
    w.get_future().wait()                            # through the progress thread
step("mixed_all_reduce", torch.equal(t, torch.full((big,), 6.0)))
s = torch.full((m // 2,), float(RANK + 1))          # 512 KiB: below the threshold
td.all_reduce(s)
step("small_all_reduce", torch.equal(s, torch.full((m // 2,), 6.0)))

# DDP: one 1 MiB+ gradient bucket per step, all-reduced on the engine's thread while backward goes on
def model():
    torch.manual_seed(0)
    return torch.nn.Linear(512, 512)
def data(r, i):
    g = torch.Generator().manual_seed(100 * r + i)
    return torch.randn(8, 512, generator=g)
ddp = torch.nn.parallel.DistributedDataParallel(model())
opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
ref = model()
ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
for i in range(3):
    opt.zero_grad()
    (ddp(data(RANK, i)) ** 2).mean().backward()
    opt.step()
    ref_opt.zero_grad()
    for r in range(n):                              # the mean of every rank's gradient, computed here alone
        ((ref(data(r, i)) ** 2).mean() / n).backward()
    ref_opt.step()
ok = all(torch.allclose(p, q, rtol=1e-5, atol=1e-6) for p, q in zip(ddp.module.parameters(), ref.parameters()))
step("ddp", ok)
td.destroy_process_group()
"""


def test_torch_front_door_calls_take_the_hierarchical_path(tmp_path):
    """GUARD: through the torch backend, all_reduce, broadcast, all_gather_into_tensor and reduce_scatter_tensor of
    a group spanning nodes take the hierarchical path from ``HPCDIST_HIER_MIN_BYTES``, blocking or asynchronous
    (on the engine's thread), so ranks mixing ``async_op`` meet, and DDP's gradient buckets go hierarchical and
    train as the mean of every rank's gradient computed on one rank; smaller calls keep the flat non-blocking MPI
    path. Every result against its known value.

    Found by the audit of 2026-11-27 (a DEFECT then: the backend started every collective non-blocking, and the
    hierarchical engine served blocking calls only, so no call through the backend ever built the topology).
    The engine's ``_use`` is wrapped to record its answer (the engine and MPI run unchanged).
    """
    pytest.importorskip("torch")
    env = _node_env("a,a,b", HPCDIST_WAIT="block", HPCDIST_HIER="auto", HPCDIST_HIER_MIN_BYTES=str(1 << 20))
    r = run_mpi(3, PRELUDE + TORCH_ACROSS_NODES, tmp_path, env=env, limit=180)
    assert not r.timed_out and r.returncode == 0, r.output
    flat = {"small_all_reduce"}
    for rank in range(3):
        steps = [line.split() for line in r.stdout.splitlines() if line.startswith(f"[{rank}] STEP ")]
        assert [s[2] for s in steps] == [
            "all_reduce",
            "broadcast",
            "all_gather_into_tensor",
            "reduce_scatter_tensor",
            "async_all_reduce",
            "async_broadcast",
            "mixed_all_reduce",
            "small_all_reduce",
            "ddp",
        ], r.output
        for _, _, name, went, went_async, ok in steps:
            assert ok == "True", f"rank {rank}: {name} gave a wrong result\n{r.output}"
            assert went == str(name not in flat), f"rank {rank}: {name} hierarchical={went}\n{r.output}"
            if name in ("async_all_reduce", "async_broadcast", "ddp") or (name == "mixed_all_reduce" and rank == 0):
                assert went_async == "True", f"rank {rank}: {name} not hierarchical on the engine's thread\n{r.output}"


def test_a_rank_pinned_to_fewer_cpus_does_not_hide_oversubscription(tmp_path):
    """DEFECT: a node's CPUs are the *sum* over its ranks' distinct affinity sets, not their union.

    hpcdist/topology.py:96-100 (``node_layout_and_cpus``) adds the sizes of the distinct sets; docs/performance.md
    promises "the union of their os.sched_getaffinity sets". Three ranks on this 2-CPU host, two unbound ({0, 1})
    and one pinned to CPU 1 ({1}): the node is counted as 3 CPUs, so it is not "oversubscribed" and the
    shared-memory engine keeps the table's windows (MPI's spinning path below them), while the same three ranks
    unpinned are oversubscribed. Pinning one rank to fewer CPUs cannot give the node more CPUs.
    """
    script = """
import os
import hpcdist as dist
from hpcdist._world import WORLD
from hpcdist.backends.shm.engine import oversubscribed_node
dist.init_process_group("mpi")
line = f"[{dist.get_rank()}] RESULT {WORLD.node_cpus[dist.get_rank()]} {oversubscribed_node()} {len(os.sched_getaffinity(0))}"
os.write(1, (line + chr(10)).encode())
dist.destroy_process_group()
"""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        pytest.skip("needs two CPUs")
    path = tmp_path / "aff.py"
    path.write_text(textwrap.dedent(script))
    n = len(cpus) + 1  # one more rank than CPUs: oversubscribed, however they are pinned
    cmd = [mpiexec(), "-n", str(n - 1), sys.executable, str(path), ":", "-n", "1"]
    cmd += ["taskset", "-c", str(cpus[-1]), sys.executable, str(path)]
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.pop("HPCDIST_TIMEOUT", None)
    env["HPCDIST_FLIGHT_DIR"] = str(tmp_path / "hpcdist-flight")
    r = run_limited(cmd, env, 120)
    assert not r.timed_out and r.returncode == 0, r.output
    results = _lines(r.stdout, "RESULT")
    assert len(results) == n, r.output
    for rank, line in results.items():
        node_cpus, over, _ = line.split()
        assert int(node_cpus) <= len(cpus), f"rank {rank}: the node counts {node_cpus} CPUs on a {len(cpus)}-CPU host"
        assert over == "True", f"rank {rank}: {n} ranks on {len(cpus)} CPUs not seen as oversubscribed"


# --------------------------------------------------------------------------------------------------------------------
# The simulated cluster
# --------------------------------------------------------------------------------------------------------------------

JOB = r"""
import hashlib, json, os, socket, sys, time
from datetime import timedelta
import numpy as np
from mpi4py import MPI
import hpcdist as dist
from hpcdist import ReduceOp

MODE = sys.argv[2]
dist.init_process_group("mpi", init_method=sys.argv[1], timeout=timedelta(seconds=float(os.environ["AUDIT_TIMEOUT"])))
rank, size = dist.get_rank(), dist.get_world_size()
rep = {"rank": rank, "host": socket.gethostname(), "local_rank": int(os.environ["LOCAL_RANK"]),
       "local_world_size": int(os.environ["LOCAL_WORLD_SIZE"]), "node_local_rank": dist.get_node_local_rank(),
       "engine": type(dist.group.WORLD.engine("cpu")).__name__, "bad": [], "digests": {},
       "steps_thread": getattr(dist.group.WORLD.engine("cpu"), "_steps_thread", None) is not None}


def data(r, n, dtype, salt):
    rng = np.random.default_rng(1000 * salt + r)
    if dtype == "int64":
        return rng.integers(-1000, 1000, n).astype(np.int64)
    return rng.standard_normal(n).astype(dtype)


def check(key, ok, arr):
    if not ok:
        rep["bad"].append(key)
    rep["digests"][key] = hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()[:16]


def close(got, want):
    if got.dtype.kind in "iub":
        return bool(np.array_equal(got, want))
    tol = 2e-2 if got.dtype == np.float16 else 1e-5
    return bool(np.allclose(got.astype(np.float64), want, rtol=tol, atol=tol))


def run_ops(g, tag):
    members = dist.get_process_group_ranks(g)
    gr, n = members.index(rank), len(members)
    for dtype in ("float32", "float16", "int64"):
        for m in (1, 7, 1000, 4099):
            for opname in ("SUM", "AVG", "MAX", "MIN", "PREMUL_SUM"):
                if dtype == "int64" and opname in ("AVG", "PREMUL_SUM"):
                    continue
                op = ReduceOp.PREMUL_SUM(0.5) if opname == "PREMUL_SUM" else getattr(ReduceOp, opname)
                x = data(gr, m, dtype, 1)
                st = np.stack([data(q, m, dtype, 1).astype(np.float64) for q in range(n)])
                want = {"SUM": st.sum(0), "AVG": st.mean(0), "MAX": st.max(0), "MIN": st.min(0),
                        "PREMUL_SUM": 0.5 * st.sum(0)}[opname]
                dist.all_reduce(x, op=op, group=g)
                check(f"{tag}/all_reduce/{dtype}/{m}/{opname}", close(x, want), x)
            for root in range(n):
                x = data(gr, m, dtype, 3 + root)
                dist.broadcast(x, group_src=root, group=g)
                check(f"{tag}/broadcast/{dtype}/{m}/{root}", bool(np.array_equal(x, data(root, m, dtype, 3 + root))), x)
            out = np.empty(n * m, dtype)
            dist.all_gather_into_tensor(out, data(gr, m, dtype, 10), group=g)
            want = want_ag = np.concatenate([data(q, m, dtype, 10) for q in range(n)])
            check(f"{tag}/all_gather_into_tensor/{dtype}/{m}", bool(np.array_equal(out, want)), out)
            out = np.empty(m, dtype)
            dist.reduce_scatter_tensor(out, data(gr, n * m, dtype, 11), group=g)
            want = sum(data(q, n * m, dtype, 11).astype(np.float64) for q in range(n))[gr * m:(gr + 1) * m]
            check(f"{tag}/reduce_scatter_tensor/{dtype}/{m}", close(out, want), out)
            # the four at once, even group ranks asynchronous (the engine's thread), odd ones blocking: they meet
            a, b, ag, rs = data(gr, m, dtype, 1), data(gr, m, dtype, 20), np.empty(n * m, dtype), np.empty(m, dtype)
            asy = gr % 2 == 0
            works = [dist.all_reduce(a, group=g, async_op=asy),
                     dist.broadcast(b, group_src=n - 1, group=g, async_op=asy),
                     dist.all_gather_into_tensor(ag, data(gr, m, dtype, 10), group=g, async_op=asy),
                     dist.reduce_scatter_tensor(rs, data(gr, n * m, dtype, 11), group=g, async_op=asy)]
            for w in reversed(works):
                if w is not None:
                    w.wait()
            st = np.stack([data(q, m, dtype, 1).astype(np.float64) for q in range(n)])
            check(f"{tag}/async/all_reduce/{dtype}/{m}", close(a, st.sum(0)), a)
            check(f"{tag}/async/broadcast/{dtype}/{m}", bool(np.array_equal(b, data(n - 1, m, dtype, 20))), b)
            check(f"{tag}/async/all_gather_into_tensor/{dtype}/{m}", bool(np.array_equal(ag, want_ag)), ag)
            check(f"{tag}/async/reduce_scatter_tensor/{dtype}/{m}", close(rs, want), rs)


if MODE == "ops":
    run_ops(dist.group.WORLD, "world")
    groups = json.loads(os.environ.get("AUDIT_GROUPS", "[]"))
    for i, (ranks, srt) in enumerate(groups):
        g = dist.new_group(ranks, sort_ranks=srt)
        if rank in ranks:
            rep.setdefault("group_engines", {})[str(i)] = type(g.engine("cpu")).__name__
            run_ops(g, f"group{i}")
            dist.destroy_process_group(g)
elif MODE == "die":
    x = np.ones(1 << 16, np.float32)
    dist.all_reduce(x)
    if rank == int(os.environ["AUDIT_VICTIM"]):
        os._exit(7)                    # dies on its node while the others enter the hierarchical all_reduce
    t0 = time.monotonic()
    try:
        dist.all_reduce(x)
        rep["after"] = "completed"
    except Exception as e:
        rep["after"] = f"{type(e).__name__} after {time.monotonic() - t0:.1f}s"
    print("REPORT " + json.dumps(rep), flush=True)
    os._exit(0)
elif MODE == "idle":
    print("READY", flush=True)
    time.sleep(3600)                   # only the liveness watcher can end this rank
topo = dist.group.WORLD.engine("cpu")._topo
rep["topo_sizes"] = None if topo is None else topo.sizes
dist.destroy_process_group()
print("REPORT " + json.dumps(rep), flush=True)
"""


@pytest.fixture(scope="module", params=[2, 3], ids=["2nodes", "3nodes"])
def cluster(request):
    """A running cluster of this session's own with 2 or 3 nodes; always removed afterwards."""
    nodes = request.param
    with simcluster.running(f"{NAME}n{nodes}", nodes) as name:
        yield name, nodes


def launch(
    cluster: str,
    placement: list[str],
    tmp_path: Path,
    mode: str = "ops",
    url_of: str = "env",
    extra: dict[str, str] | None = None,
    wrap: dict[int, list[str]] | None = None,
    allow_fail: bool = False,
) -> tuple[list[dict], list[str]]:
    """One rank per entry of ``placement`` on its node running JOB in ``mode``, joined through env:// or tcp:// to
    rank 0 on node1 (:func:`simcluster.launch`; ``wrap``: rank -> a command prefix run inside the node).

    Returns every rank's report and the failures; all ranks are killed after JOB_LIMIT.
    """
    job = tmp_path / "audit_job.py"
    job.write_text(textwrap.dedent(JOB))
    env = {
        "HPCDIST_HIER": "1",
        "MPIR_CVAR_ENABLE_HEAVY_YIELD": "1",
        "AUDIT_TIMEOUT": "60",
        "HPCDIST_FLIGHT_DIR": str(tmp_path / "hpcdist-flight"),  # dumps of failing jobs stay in tmp
        **(extra or {}),
    }
    reports, failures = simcluster.launch(
        cluster, placement, [str(job), mode], tmp_path, port=29611, url_of=url_of, extra=env, wrap=wrap, limit=JOB_LIMIT
    )
    if not allow_fail:
        assert not failures, "\n\n".join(failures)
    return reports, failures


def check_job(reports: list[dict], placement: list[str]) -> None:
    n = len(placement)
    assert [r["rank"] for r in reports] == list(range(n))
    for r in reports:
        same = [i for i, p in enumerate(placement) if p == placement[r["rank"]]]
        assert r["local_rank"] == same.index(r["rank"]) == r["node_local_rank"], r
        assert r["local_world_size"] == len(same), r
        assert r["engine"] == "HierarchicalEngine", r
        assert r["steps_thread"], r  # MPI_THREAD_MULTIPLE: asynchronous calls run hierarchically on the thread
        assert not r["bad"], f"rank {r['rank']}: differs from NumPy: {r['bad'][:10]}"
    for key, value in reports[0]["digests"].items():
        if key.startswith("world/") and "/reduce_scatter_tensor/" not in key:  # the same array on every rank
            seen = {r["rank"]: r["digests"][key] for r in reports}
            assert set(seen.values()) == {value}, f"{key} differs across ranks: {seen}"


PLACEMENTS = {
    2: [["node1", "node1", "node2"], ["node1", "node2", "node2"]],
    3: [["node1", "node1", "node2", "node2", "node3"], ["node1", "node2", "node3", "node1", "node2"]],
}


def test_uneven_nodes_every_op_against_numpy(cluster, tmp_path):
    """GUARD: uneven nodes (2+1, 1+2; 2+2+1 and interleaved on three nodes): LOCAL_RANK, the hierarchical engine,
    all_reduce (SUM AVG MAX MIN PREMUL_SUM), broadcast from every root, all_gather_into_tensor and
    reduce_scatter_tensor with sizes not divisible by the node count, against NumPy and bitwise across ranks; plus
    groups of some ranks (one node's ranks with one of another, an unsorted group)."""
    name, nodes = cluster
    for placement in PLACEMENTS[nodes]:
        n = len(placement)
        groups = [[[0, 1, n - 1], True], [list(range(n))[::-1], False]]
        reports, _ = launch(name, placement, tmp_path, extra={"AUDIT_GROUPS": json.dumps(groups)})
        check_job(reports, placement)


def test_a_rank_that_dies_mid_collective_ends_the_job(cluster, tmp_path):
    """GUARD: a rank killed (``os._exit``) on a node with a peer, as the others enter a hierarchical all_reduce: the
    launcher-free world's liveness ends every other rank promptly (non-zero exit), none hangs to the job limit."""
    name, nodes = cluster
    placement = PLACEMENTS[nodes][0]
    reports, failures = launch(
        name, placement, tmp_path, mode="die", extra={"AUDIT_VICTIM": "1", "AUDIT_TIMEOUT": "60"}, allow_fail=True
    )
    assert all("rc=None" not in f for f in failures), failures  # none was killed at the job limit
    assert any(f.startswith("rank 1 ") for f in failures), failures  # the victim
    for r in reports:  # a survivor that reported: the collective raised, it did not complete
        assert not r["after"].startswith("completed"), r
    assert len(failures) + len(reports) >= len(placement), (reports, failures)


def test_a_host_cut_off_from_the_network_ends_the_job(cluster, tmp_path):
    """GUARD: node2 cut off from the switch (its port down: no FIN, no RST reaches anyone) while the job idles after
    init: the kernel's keepalive probes on the liveness connections (``HPCDIST_KEEPALIVE=4``) end both ranks, rank
    0's message naming rank 1's silent host. Without the probes both idled until the job limit killed them."""
    name, nodes = cluster
    if nodes != 2:
        pytest.skip("two nodes are enough")
    out: list[tuple[list[dict], list[str]]] = []
    job = threading.Thread(
        target=lambda: out.append(
            launch(name, ["node1", "node2"], tmp_path, mode="idle", extra={"HPCDIST_KEEPALIVE": "4"}, allow_fail=True)
        )
    )
    port = ["ip", "-n", f"{name}-sw", "link", "set", "port2"]
    job.start()
    try:
        deadline = time.monotonic() + JOB_LIMIT
        while not all("READY" in _read(tmp_path / f"rank{r}.out") for r in (0, 1)):
            assert job.is_alive() and time.monotonic() < deadline, [_read(tmp_path / f"rank{r}.out") for r in (0, 1)]
            time.sleep(0.2)
        subprocess.run([*port, "down"], check=True, timeout=30)
        job.join(JOB_LIMIT + 30)
        assert not job.is_alive()
    finally:
        subprocess.run([*port, "up"], check=False, timeout=30)  # the other tests of the module share the cluster
        job.join(JOB_LIMIT + 30)
    _, failures = out[0]
    assert all("rc=None" not in f for f in failures), failures  # none idled until the job limit killed it
    rank0 = next(f for f in failures if f.startswith("rank 0 "))
    assert "rank 1 of this launcher-free world of 2 died (its host answered none of the keepalive probes" in rank0
    assert any(f.startswith("rank 1 ") for f in failures), failures


def _read(path: Path) -> str:
    return path.read_text() if path.exists() else ""


def test_equal_host_names_with_own_dev_shm_are_two_nodes(cluster, tmp_path):
    """GUARD: a rank on node2 whose host name is node1's (its own UTS namespace) but whose /dev/shm is node2's is
    another node: LOCAL_RANK counts it alone, and the collectives (node steps in each /dev/shm) are right."""
    name, nodes = cluster
    if nodes != 2:
        pytest.skip("two nodes are enough")
    placement = ["node1", "node1", "node2", "node2"]
    wrap = {r: ["unshare", "--uts", "sh", "-c", 'hostname node1 && exec "$@"', "sh"] for r in (2, 3)}
    reports, _ = launch(name, placement, tmp_path, wrap=wrap, url_of="tcp")
    assert {r["host"] for r in reports} == {"node1"}
    check_job(reports, placement)
