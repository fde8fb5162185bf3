"""Rendezvous defects found by adversarial testing, each pinned by a test that failed before its fix.

Every test starts plain ``python`` processes (no MPI launcher) that join
through ``env://``, each under a hard time limit; leftovers are killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap

import pytest

import hpcdist
from hpcdist._launchenv import free_port

LIMIT = 90  # seconds for one multi-process test, start-up included (2 shared cores)
_SOURCE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(hpcdist.__file__)))


def _launch(n: int, script: str, env_of, limit: float = LIMIT) -> list[tuple[int, str]]:
    """Run ``script`` in ``n`` fresh processes (environment from ``env_of(rank)``); (returncode, output) each."""
    procs = []
    for rank in range(n):
        env = {
            k: v
            for k, v in os.environ.items()
            if not k.startswith(("PMI_", "PMIX_", "OMPI_", "SLURM_", "MV2_", "PALS_", "HYDRA_"))
            and k not in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "LOCAL_RANK", "LOCAL_WORLD_SIZE")
        }
        env.update(HPCDIST_ABORT_ON_EXCEPTION="0", PYTHONPATH=_SOURCE_ROOT, **env_of(rank))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-c", textwrap.dedent(script)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        )
    out = []
    try:
        for p in procs:
            text, _ = p.communicate(timeout=limit)
            out.append((p.returncode, text))
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.communicate()
    return out


_REINIT = """
import os, time
from datetime import timedelta
import numpy as np
import hpcdist as dist

rank = int(os.environ["RANK"])
for it in range(3):
    dist.init_process_group("mpi", timeout=timedelta(seconds=30))
    x = np.array([rank + 1.0])
    dist.all_reduce(x)
    print("iteration", it, "sum", int(x[0]), flush=True)
    if rank == 0:
        time.sleep(1.0)  # the others finish destroy first and reach this world's store server again
    dist.destroy_process_group()
print("done", flush=True)
"""


@pytest.mark.timeout(LIMIT + 30)
def test_init_again_after_destroy_while_rank0_is_still_in_the_old_world():
    """init / destroy / init at the same MASTER_PORT, rank 0 slower to destroy than the others.

    Before the fix the faster ranks joined rank 0's old store server, which went away when rank 0
    destroyed its world: they raised "the rendezvous store went away" while rank 0 timed out
    waiting for them (torch's env:// fails the same way). Now they start over on rank 0's new server.
    """
    port = str(free_port("127.0.0.1"))
    n = 3
    results = _launch(
        n, _REINIT, lambda r: {"RANK": str(r), "WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port}
    )
    for rank, (code, text) in enumerate(results):
        assert code == 0 and "done" in text, f"rank {rank} (exit {code}):\n{text[-3000:]}"
        assert [line for line in text.splitlines() if line.startswith("iteration")] == [
            f"iteration {i} sum {n * (n + 1) // 2}" for i in range(3)
        ]


def _ipv6_loopback() -> bool:
    import socket

    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as probe:
            probe.bind(("::1", 0))
        return True
    except OSError:
        return False


_IPV6 = """
import os
from datetime import timedelta
import numpy as np
import hpcdist as dist

rank = int(os.environ["R"])
url = f"tcp://[::1]:{os.environ['P']}?rank={rank}&world_size=2"
dist.init_process_group("mpi", init_method=url, timeout=timedelta(seconds=30))
x = np.array([rank + 1.0])
dist.all_reduce(x)
print("sum", int(x[0]), flush=True)
dist.destroy_process_group()
"""


@pytest.mark.timeout(LIMIT + 30)
@pytest.mark.skipif(not _ipv6_loopback(), reason="no IPv6 loopback here")
def test_tcp_url_with_an_ipv6_host():
    """tcp://[::1]:port, as torch accepts it. Before the fix the store and the MPI join worked, then
    rank 0 failed to listen for the liveness connections ("Address family for hostname not supported")."""
    port = str(free_port("127.0.0.1"))
    results = _launch(2, _IPV6, lambda r: {"R": str(r), "P": port})
    for rank, (code, text) in enumerate(results):
        assert code == 0 and "sum 3" in text, f"rank {rank} (exit {code}):\n{text[-3000:]}"
