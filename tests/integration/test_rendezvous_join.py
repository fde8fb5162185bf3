"""Processes started by multiprocessing join one MPI communicator in rank order.

Each test starts 2, 3 or 4 fresh (spawned) processes that rendezvous through
env://, tcp://, file:// or a given store, then check rank order and an MPI
allreduce on the joined communicator. Every test has a hard time limit and
kills its processes when done.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue
import time
from datetime import timedelta

import pytest

from hpcdist._launchenv import free_port as _free_port

CTX = mp.get_context("spawn")
LIMIT = 60  # seconds for one multi-process test, start-up included (2 shared cores)


def free_port() -> int:
    """A port for MASTER_PORT, below the ephemeral range (hpcdist._launchenv.free_port)."""
    return _free_port("127.0.0.1")


def _clean_launcher_env() -> None:
    for name in list(os.environ):
        if name.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_", "MV2_", "PALS_", "JSM_", "FLUX_", "HYDRA_")):
            del os.environ[name]
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        os.environ.pop(name, None)
    os.environ["HPCDIST_ABORT_ON_EXCEPTION"] = "0"


def _make_store(how: str, rank: int, n: int, where: str, timeout: timedelta):
    from hpcdist.store import FileStore, TCPStore

    if how == "store-file":
        return FileStore(where, n)
    return TCPStore("127.0.0.1", int(where), n, rank == 0, timeout, wait_for_workers=False)


def worker(rank: int, n: int, how: str, where: str, timeout_s: float, via: str, out, hold=None) -> None:
    """One process: join as ``how`` says, report what it sees on ``out``.

    With ``hold`` (an Event) stay alive after reporting until it is set, so that
    rank 0's store keeps serving late arrivals.
    """
    _clean_launcher_env()
    timeout = timedelta(seconds=timeout_s)
    init_method: str | None = None
    store = None
    if how == "env":
        os.environ.update(RANK=str(rank), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=where)
    elif how == "tcp":
        init_method = f"tcp://127.0.0.1:{where}?rank={rank}&world_size={n}"
    elif how == "srun-unwired":  # srun started us, but this MPI does not speak its PMI
        os.environ.update(SLURM_STEP_ID="0", SLURM_PROCID=str(rank), SLURM_NTASKS=str(n), SLURM_LOCALID=str(rank))
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=where)
    elif how == "srun-unwired-no-addr":
        os.environ.update(SLURM_STEP_ID="0", SLURM_PROCID=str(rank), SLURM_NTASKS=str(n))
    elif how == "file":
        init_method = f"file://{where}"
    t0 = time.monotonic()
    try:
        if how.startswith("store"):
            store = _make_store(how, rank, n, where, timeout)
        if via == "join":
            from hpcdist.rendezvous import join_world

            args = {"rank": rank, "world_size": n} if how in ("file", "store-file", "store-tcp") else {}
            joined = join_world(init_method, store=store, timeout=timeout, **{"rank": -1, "world_size": -1, **args})
            comm = joined.comm
            report = (
                comm.Get_rank(),
                comm.Get_size(),
                comm.allreduce(rank + 1),
                comm.allgather(rank),
                type(joined.store).__name__,
                joined.launcher,
            )
        else:
            import torch

            import hpcdist as dist

            kwargs = {"rank": rank, "world_size": n} if how in ("file", "store-file", "store-tcp") else {}
            dist.init_process_group("gloo", init_method=init_method, store=store, timeout=timeout, **kwargs)
            x = torch.tensor([float(rank + 1)])
            dist.all_reduce(x)
            gathered = [torch.zeros(1) for _ in range(n)]
            dist.all_gather(gathered, torch.tensor([float(rank)]))
            env = tuple(os.environ.get(k) for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"))
            report = (
                dist.get_rank(),
                dist.get_world_size(),
                int(x.item()),
                [int(g.item()) for g in gathered],
                env,
                None,
            )
            dist.destroy_process_group()
        out.put(("ok", rank, report, time.monotonic() - t0))
    except BaseException as exc:  # reported to the test, which asserts on it
        out.put(("error", rank, (type(exc).__name__, str(exc)), time.monotonic() - t0))
    if hold is not None:
        hold.wait(LIMIT)


def run_group(n: int, how: str, where: str, *, start: int | None = None, timeout_s: float = 40.0, via: str = "join"):
    """Start ``start`` (default ``n``) of ``n`` ranks; return their reports by rank."""
    out = CTX.Queue()
    procs = [
        CTX.Process(target=worker, args=(r, n, how, where, timeout_s, via, out), daemon=True)
        for r in range(start if start is not None else n)
    ]
    for p in procs:
        p.start()
    results = {}
    deadline = time.monotonic() + LIMIT
    try:
        while len(results) < len(procs):
            try:
                status, rank, payload, elapsed = out.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                pytest.fail(f"only {len(results)} of {len(procs)} processes reported within {LIMIT}s: {results}")
            results[rank] = (status, payload, elapsed)
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return results


def assert_joined(results, n: int, store_type: str | None = None) -> None:
    for rank in range(n):
        status, payload, _ = results[rank]
        assert status == "ok", f"rank {rank}: {payload}"
        comm_rank, size, total, ranks, stype, launcher = payload
        assert (comm_rank, size) == (rank, n)
        assert total == n * (n + 1) // 2
        assert ranks == list(range(n))
        if store_type is not None:
            assert stype == store_type
            assert launcher is None


@pytest.mark.timeout(LIMIT + 30)
@pytest.mark.parametrize("n", [2, 3, 4])
def test_env(n):
    assert_joined(run_group(n, "env", str(free_port())), n, "TCPStore")


@pytest.mark.timeout(LIMIT + 30)
def test_tcp():
    assert_joined(run_group(3, "tcp", str(free_port())), 3, "TCPStore")


@pytest.mark.timeout(LIMIT + 30)
def test_file(tmp_path):
    # file:///path with rank= and world_size= given as arguments
    assert_joined(run_group(3, "file", str(tmp_path / "rdzv")), 3, "FileStore")


@pytest.mark.timeout(LIMIT + 30)
def test_given_file_store(tmp_path):
    assert_joined(run_group(2, "store-file", str(tmp_path / "store")), 2, "FileStore")


@pytest.mark.timeout(LIMIT + 30)
def test_given_tcp_store():
    assert_joined(run_group(2, "store-tcp", str(free_port())), 2, "TCPStore")


@pytest.mark.timeout(LIMIT + 30)
def test_peer_never_arrives():
    """world_size=3, only 2 start: both fail within the timeout, saying 2 of 3 joined."""
    timeout_s = 4.0
    results = run_group(3, "env", str(free_port()), start=2, timeout_s=timeout_s)
    for rank in (0, 1):
        status, (kind, message), _elapsed = results[rank]
        assert status == "error" and kind == "DistTimeoutError", (rank, kind, message)
        assert "2 of 3" in message and "missing rank(s): 2" in message


@pytest.mark.timeout(LIMIT + 30)
def test_rank0_never_arrives():
    """A client whose server (rank 0) never starts gives a timeout naming rank 0's address."""
    out = CTX.Queue()
    port = str(free_port())
    p = CTX.Process(target=worker, args=(1, 2, "tcp", port, 3.0, "join", out), daemon=True)
    p.start()
    try:
        status, _rank, (kind, message), _elapsed = out.get(timeout=LIMIT)
    finally:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
    assert (status, kind) == ("error", "DistTimeoutError"), message
    assert f"127.0.0.1:{port}" in message and "rank 0" in message


@pytest.mark.timeout(LIMIT + 30)
@pytest.mark.parametrize("n", [2, 3])
def test_init_process_group_env(n):
    """Through the public API: hpcdist.init_process_group('gloo') with env://, torch tensors."""
    results = run_group(n, "env", str(free_port()), via="dist")
    for rank in range(n):
        status, payload, _ = results[rank]
        assert status == "ok", f"rank {rank}: {payload}"
        got_rank, size, total, gathered, env, _ = payload
        assert (got_rank, size, total, gathered) == (rank, n, n * (n + 1) // 2, list(range(n)))
        assert env == (str(rank), str(n), str(rank), str(n))


@pytest.mark.timeout(LIMIT + 30)
def test_init_process_group_file(tmp_path):
    n = 2
    results = run_group(n, "file", f"{tmp_path / 'rdzv'}", via="dist")
    for rank in range(n):
        status, payload, _ = results[rank]
        assert status == "ok", f"rank {rank}: {payload}"
        assert payload[:4] == (rank, n, 3, [0, 1])


@pytest.mark.timeout(LIMIT + 30)
def test_launcher_not_wired_to_mpi_joins_over_ports():
    """srun-like variables, MPI singletons, MASTER_ADDR/PORT set: join with the launcher's ranks."""
    assert_joined(run_group(2, "srun-unwired", str(free_port())), 2, "TCPStore")


@pytest.mark.timeout(LIMIT + 30)
def test_launcher_not_wired_to_mpi_without_rendezvous_explains():
    results = run_group(2, "srun-unwired-no-addr", "")
    for rank in (0, 1):
        status, (kind, message), _ = results[rank]
        assert (status, kind) == ("error", "DistBackendError")
        assert "MPI is not wired to srun" in message and "--mpi=" in message


def run_ranks(ranks: list[int], n: int, how: str, where: str, *, timeout_s: float):
    """Start one process per entry of ``ranks`` (duplicates allowed); return their reports in arrival order."""
    out, hold = CTX.Queue(), CTX.Event()
    procs = [
        CTX.Process(target=worker, args=(r, n, how, where, timeout_s, "join", out, hold), daemon=True) for r in ranks
    ]
    for p in procs:
        p.start()
    reports = []
    deadline = time.monotonic() + LIMIT
    try:
        while len(reports) < len(procs):
            try:
                reports.append(out.get(timeout=max(0.1, deadline - time.monotonic())))
            except queue.Empty:
                pytest.fail(f"only {len(reports)} of {len(procs)} processes reported within {LIMIT}s: {reports}")
    finally:
        hold.set()
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
    return reports


@pytest.mark.timeout(LIMIT + 30)
@pytest.mark.parametrize("how", ["env", "tcp"])
def test_duplicate_rank_is_refused_and_the_others_join(how):
    """world_size=2 started as ranks 0, 1, 1: the second rank 1 gets a clear ValueError at once,
    rank 0 and the first rank 1 join as usual."""
    reports = run_ranks([0, 1, 1], 2, how, str(free_port()), timeout_s=30.0)
    errors = [r for r in reports if r[0] == "error"]
    oks = sorted((r for r in reports if r[0] == "ok"), key=lambda r: r[1])
    assert len(errors) == 1 and len(oks) == 2, reports
    _, rank, (kind, message), _elapsed = errors[0]
    # a ValueError, not the DistTimeoutError a lost rank would get after 30 s
    assert (rank, kind) == (1, "ValueError"), message
    assert "rank 1 is claimed twice" in message and "distinct RANK 0..1" in message
    for want, (_, rank, payload, _) in enumerate(oks):
        assert rank == want and payload[:4] == (want, 2, 3, [0, 1])


@pytest.mark.timeout(LIMIT + 30)
def test_duplicate_rank_file_fails_fast():
    """file://, world_size=3 started as ranks 0, 1, 1: the duplicate fails at once naming the rank; the
    others time out saying who is missing (rank 2)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        timeout_s = 6.0
        reports = run_ranks([0, 1, 1], 3, "file", os.path.join(tmp, "rdzv"), timeout_s=timeout_s)
    kinds = sorted(r[2][0] for r in reports)
    assert kinds == ["DistTimeoutError", "DistTimeoutError", "ValueError"], reports
    for status, _rank, (kind, message), _elapsed in reports:
        assert status == "error"
        if kind == "ValueError":
            assert "rank 1 is claimed twice" in message, message
        else:
            assert "2 of 3" in message and "missing rank(s): 2" in message, message


@pytest.mark.timeout(LIMIT + 30)
def test_duplicate_rank0_env_names_the_cause():
    """Two processes given RANK=0: the one that cannot serve the store says rank 0 may be claimed twice."""
    reports = run_ranks([0, 0, 1], 2, "env", str(free_port()), timeout_s=30.0)
    errors = [r for r in reports if r[0] == "error"]
    assert len(errors) == 1 and sum(r[0] == "ok" for r in reports) == 2, reports
    _, rank, (kind, message), _ = errors[0]
    assert (rank, kind) == (0, "DistNetworkError"), message
    assert "rank 0 is claimed twice" in message and "MASTER_PORT" in message


@pytest.mark.timeout(LIMIT + 30)
def test_partner_dies_before_connect_does_not_hang_accept():
    """Rank 1 announces it is about to connect, then never calls MPI_Comm_connect (as if it died):
    rank 0, blocked in MPI_Comm_accept, is ended by the watchdog with a timeout message, not left hanging."""
    import subprocess
    import sys

    from hpcdist.rendezvous.arrival import Deadline, arrive
    from hpcdist.store import TCPStore

    port = free_port()
    timeout_s = 4.0
    code = (
        "from datetime import timedelta\n"
        "from hpcdist.rendezvous import join_world\n"
        f"join_world('tcp://127.0.0.1:{port}', store=None, rank=0, world_size=2, "
        f"timeout=timedelta(seconds={timeout_s}))\n"
        "print('JOINED', flush=True)\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_", "HYDRA_"))}
    for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    rank0 = subprocess.Popen(
        [sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        store = TCPStore("127.0.0.1", port, 2, False, timedelta(seconds=30))
        prefix = f"hpcdist/join/{store.add('hpcdist/join/generation/1', 1)}"
        arrive(store, prefix, 1, 2, Deadline(timedelta(seconds=30)))
        store.wait([f"{prefix}/port/0/0"], timedelta(seconds=30))
        store.set(f"{prefix}/ready/0/1", "1")  # ... and never connect
        out, err = rank0.communicate(timeout=timeout_s + 30)  # the hang guard
    finally:
        if rank0.poll() is None:
            rank0.kill()
            rank0.wait()
    assert "JOINED" not in out
    assert rank0.returncode != 0
    assert "DistTimeoutError" in err and "MPI_Comm_accept of merge round 0" in err, err[-2000:]
