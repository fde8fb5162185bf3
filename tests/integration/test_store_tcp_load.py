"""TCPStore under load and across processes: 256 clients x 1000 adds, a multi-process job.

Client processes are started with ``subprocess``; each runs many threads, each
thread with its own TCPStore connection. Speed is never asserted; the time
limits only catch hangs.
"""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
from datetime import timedelta

import pytest

from hpcdist.errors import DistNetworkError
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


# A master started with a soft open-file limit of `soft` (hard limit `hard`), as rank 0 of a job of thousands of
# ranks under the common soft limit of 1024. It prints its port, serves until a client sets "done", then prints
# its soft limit (from /proc: the script imports nothing the store would not).
_LIMITED_MASTER = """
import sys
from datetime import timedelta
from hpcdist.store import TCPStore
master = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=100), secret=sys.argv[1])
print(master.port, flush=True)
master.wait(["done"])
try:
    with open("/proc/self/limits") as f:
        print(next(ln for ln in f if ln.startswith("Max open files")).split()[3], flush=True)
except OSError:  # still out of descriptors
    print("?", flush=True)
"""


def _limited_master(soft: int, hard: int, secret: str) -> tuple[subprocess.Popen[str], int]:
    def limit() -> None:  # in the child, before exec: the interpreter starts under the limit
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    proc = subprocess.Popen(
        [sys.executable, "-c", _LIMITED_MASTER, secret],
        env=_env(secret),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=limit,
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


@pytest.mark.timeout(120)
def test_master_under_a_low_open_file_limit_serves_more_clients_than_the_limit():
    secret, soft, clients = new_secret(), 64, 200
    proc, port = _limited_master(soft, 4096, secret)
    stores: list[TCPStore] = []
    try:
        for i in range(clients):  # each connection is a descriptor of the master: about 3x its soft limit
            stores.append(TCPStore(HOST, port, None, False, timedelta(seconds=20), secret=secret))
            stores[-1].set(f"k{i}", str(i))
        assert stores[0].multi_get([f"k{i}" for i in range(clients)]) == [str(i).encode() for i in range(clients)]
        stores[-1].set("done", "1")
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert clients < int(out) <= 4096  # the master raised its soft limit, within the hard one
        assert "accept failed" not in err
    finally:
        for s in stores:
            s.close()
        proc.kill()


@pytest.mark.timeout(120)
def test_master_at_its_hard_open_file_limit_says_which_limit_and_clients_time_out_saying_why():
    secret, limit = new_secret(), 48
    proc, port = _limited_master(limit, limit, secret)
    stores: list[TCPStore] = []
    try:
        with pytest.raises(DistNetworkError) as info:
            for _ in range(limit + 1):  # the master's own descriptors make it fail before this many
                stores.append(TCPStore(HOST, port, None, False, timedelta(seconds=2), secret=secret))
        assert "never greeted" in str(info.value) and "ulimit -n" in str(info.value)
        assert 1 < len(stores) < limit
        stores[0].set("done", "1")
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert f"RLIMIT_NOFILE soft {limit}, hard {limit}" in err and "ulimit -n" in err
        assert f"serves {len(stores) + 1} clients" in err  # and the master's own connection
    finally:
        for s in stores:
            s.close()
        proc.kill()
