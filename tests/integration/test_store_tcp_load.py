"""TCPStore under load and across processes: 256 clients x 1000 adds, a multi-process job.

Client processes are started with ``subprocess``; each runs many threads, each
thread with its own TCPStore connection. Speed is never asserted; the time
limits only catch hangs.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import timedelta

import pytest

from hpcdist.store import PrefixStore, TCPStore, new_secret

HOST = "127.0.0.1"

_CLIENTS = """
import sys, threading
from datetime import timedelta
from hpcdist.store import TCPStore
port, nthreads, nadds = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
stores = [TCPStore("127.0.0.1", port, timeout=timedelta(seconds=120)) for _ in range(nthreads)]
errors = []
def work(s):
    try:
        for _ in range(nadds):
            s.add("counter", 1)
    except BaseException as exc:
        errors.append(exc)
threads = [threading.Thread(target=work, args=(s,)) for s in stores]
stores[0].barrier("start", int(sys.argv[4]))  # every process connected: start together
for t in threads: t.start()
for t in threads: t.join()
for s in stores: s.close()
if errors:
    raise SystemExit(f"{len(errors)} threads failed: {errors[0]!r}")
"""


def _env(secret: str) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("HPCDIST_STORE_SECRET_FILE", None)
    env["HPCDIST_STORE_SECRET"] = secret
    return env


@pytest.mark.timeout(240)
def test_256_concurrent_clients_times_1000_adds_give_exactly_256000(monkeypatch):
    secret = new_secret()
    monkeypatch.setenv("HPCDIST_STORE_SECRET", secret)
    monkeypatch.delenv("HPCDIST_STORE_SECRET_FILE", raising=False)
    nprocs, nthreads, nadds = 4, 64, 1000
    master = TCPStore(HOST, 0, None, True, timedelta(seconds=120))
    try:
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", _CLIENTS, str(master.port), str(nthreads), str(nadds), str(nprocs)],
                env=_env(secret),
            )
            for _ in range(nprocs)
        ]
        for p in procs:
            assert p.wait(timeout=220) == 0
        assert master.get("counter") == str(nprocs * nthreads * nadds).encode() == b"256000"
    finally:
        master.close()


_RANK = """
import os, sys
from datetime import timedelta
from hpcdist.store import PrefixStore, TCPStore
port, rank, n = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
s = TCPStore("127.0.0.1", port, n, False, timedelta(seconds=60))
s.set(f"addr/{rank}", f"host{rank}")
peers = s.multi_get([f"addr/{r}" for r in range(n)])
assert peers == [f"host{r}".encode() for r in range(n)], peers
group = PrefixStore("group0", s)
group.add("arrived", 1)
group.barrier("b", n)
assert group.get("arrived") == str(n).encode()
print(rank, flush=True)
"""


@pytest.mark.timeout(120)
def test_master_waits_for_worker_processes_then_they_rendezvous():
    secret = new_secret()
    n = 4
    # workers start first: they retry until the master listens
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port = probe.getsockname()[1]
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", _RANK, str(port), str(r), str(n)],
            env=_env(secret),
            stdout=subprocess.PIPE,
            text=True,
        )
        for r in range(1, n)
    ]
    master = TCPStore(HOST, port, n, True, timedelta(seconds=60), secret=secret)  # waits for 3 workers
    try:
        master.set("addr/0", "host0")
        group = PrefixStore("group0", master)
        group.add("arrived", 1)
        group.barrier("b", n)
        outs = []
        for p in procs:
            out, _ = p.communicate(timeout=100)
            assert p.returncode == 0
            outs.append(int(out))
        assert sorted(outs) == [1, 2, 3]
    finally:
        for p in procs:
            p.kill()
        master.close()
