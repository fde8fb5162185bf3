"""The simulated cluster of the integration tests: bring it up and down, start one job's ranks on its nodes.

``scripts/cluster-up N`` makes N "nodes" on this host (network, UTS and
mount namespaces: own host names node1..nodeN, own ``/dev/shm``, addresses
10.77.0.1.. on a private switch); ``scripts/cluster-exec NODE CMD...`` runs
a command on one. Shared by ``test_cluster.py`` and ``test_cluster_audit.py``.

Where namespaces cannot be made (not root, no unshare/ip, a container without
the privilege) :func:`running` skips with the reason, except in CI as root,
where it fails, so the tests really run there.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from mpirun import ROOT

SCRIPTS = ROOT / "scripts"
MASTER = "10.77.0.1"  # node1's address: rank 0 serves the store there


def must_run() -> bool:
    """CI as root: the cluster tests must run, not skip."""
    return os.environ.get("CI", "").lower() in ("1", "true", "yes") and os.geteuid() == 0


def _script(name: str, cluster: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HPCDIST_CLUSTER=cluster)
    return subprocess.run(
        [str(SCRIPTS / name), *args], env=env, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL
    )


@contextmanager
def running(cluster: str, nodes: int) -> Iterator[str]:
    """A cluster named ``cluster`` of ``nodes`` nodes for the block; removed afterwards, whatever happens."""
    try:
        try:
            proc = _script("cluster-up", cluster, str(nodes))
            reason = (
                (proc.stderr.strip() or proc.stdout.strip() or "no message").splitlines()[-1] if proc.returncode else ""
            )
        except subprocess.TimeoutExpired:
            reason = "scripts/cluster-up took longer than 60 s"
        if reason:
            msg = f"no simulated cluster: {reason}"
            if must_run():
                pytest.fail(msg + " (CI as root must run the cluster tests)")
            pytest.skip(msg)
        yield cluster
    finally:
        _script("cluster-down", cluster)


def launch(
    cluster: str,
    placement: list[str],
    argv: list[str],
    tmp_path: Path,
    *,
    port: int,
    url_of: str = "env",
    extra: dict[str, str] | None = None,
    wrap: dict[int, list[str]] | None = None,
    limit: float = 240.0,
) -> tuple[list[dict], list[str]]:
    """Start one rank per entry of ``placement`` (a node name) on its node, running ``python argv... URL``; wait.

    ``url_of``: ``"env"`` (MASTER_ADDR/MASTER_PORT) or ``"tcp"`` (a tcp://
    URL with the rank in its query), to rank 0 on node1. MPI runs over TCP
    (``UCX_TLS=tcp,self``: MPICH's default UCX transports cannot connect
    across namespaces); the store is authenticated (it is reachable off
    loopback). ``extra``: more environment; ``wrap``: rank -> a command
    prefix run inside the node (e.g. ``unshare --uts ...``).

    Returns the last ``REPORT {json}`` line of each rank that printed one
    (by rank), and the failures (``rank R on NODE: rc=...`` and the output's
    tail) of ranks that exited non-zero or printed none. Every rank is
    killed once the job outlives ``limit`` seconds, all ranks together.
    """
    n = len(placement)
    procs = []
    t0 = time.monotonic()
    for rank, node in enumerate(placement):
        env = dict(os.environ)
        for var in ("HPCDIST_TIMEOUT", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            env.pop(var, None)
        env.update(
            HPCDIST_CLUSTER=cluster,
            PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
            PYTHONUNBUFFERED="1",
            RANK=str(rank),
            WORLD_SIZE=str(n),
            MASTER_ADDR=MASTER,
            MASTER_PORT=str(port),
            UCX_TLS="tcp,self",
            HPCDIST_STORE_SECRET=f"cluster-test-{cluster}",
        )
        env.update(extra or {})
        url = "env://" if url_of == "env" else f"tcp://{MASTER}:{port}?rank={rank}&world_size={n}"
        cmd = [
            str(SCRIPTS / "cluster-exec"),
            node,
            *(wrap or {}).get(rank, []),
            sys.executable,
            argv[0],
            url,
            *argv[1:],
        ]
        out = open(tmp_path / f"rank{rank}.out", "w+")  # noqa: SIM115 (closed below)
        procs.append(
            (subprocess.Popen(cmd, env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True), out)
        )
    reports, failures = [], []
    try:
        for rank, (proc, out) in enumerate(procs):
            try:
                rc = proc.wait(timeout=max(1.0, limit - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                rc = None
            out.seek(0)
            text = out.read()
            lines = [ln for ln in text.splitlines() if ln.startswith("REPORT ")]
            if rc != 0 or not lines:
                failures.append(f"rank {rank} on {placement[rank]}: rc={rc}\n{text[-3000:]}")
            if lines:
                reports.append(json.loads(lines[-1][len("REPORT ") :]))
    finally:
        for proc, out in procs:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
            out.close()
    return sorted(reports, key=lambda r: r["rank"]), failures
