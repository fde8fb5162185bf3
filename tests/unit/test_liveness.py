"""The liveness connections of a launcher-free world (hpcdist/rendezvous/liveness.py): errors at setup.

Real sockets on the loopback and hpcdist's HashStore; no MPI. A peer that never connects must give a
DistTimeoutError naming it within the timeout (it was a bare ``TimeoutError: timed out``), and a rank
that cannot reach rank 0 a DistNetworkError naming the address.
"""

from __future__ import annotations

import re
import resource
import socket
import struct
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from datetime import timedelta

import pytest

from hpcdist.errors import DistNetworkError, DistTimeoutError
from hpcdist.rendezvous.liveness import Liveness
from hpcdist.store import HashStore

pytestmark = pytest.mark.timeout(60)


def _connect_as(store: HashStore, rank: int) -> socket.socket:
    store.wait(["hpcdist/liveness/1"], timedelta(seconds=10))
    host, port = store.get("hpcdist/liveness/1").decode().rsplit(":", 1)
    conn = socket.create_connection((host, int(port)), timeout=10)
    conn.sendall(struct.pack("!i", rank))
    return conn


@pytest.mark.parametrize(("present", "named"), [([], "1-3"), ([2], "1, 3")])
def test_rank0_names_the_ranks_that_never_connect(present, named):
    store = HashStore()
    conns: list[socket.socket] = []
    threads = [threading.Thread(target=lambda r=r: conns.append(_connect_as(store, r))) for r in present]
    for t in threads:
        t.start()
    t0 = time.monotonic()
    with pytest.raises(DistTimeoutError, match=re.escape(f"rank(s) {named} of this launcher-free world did not open")):
        Liveness(store, 0, 4, timedelta(seconds=0.5), "127.0.0.1")
    assert time.monotonic() - t0 < 5
    for t in threads:
        t.join(10)
    for c in conns:
        c.close()


def test_a_rank_that_cannot_reach_rank0_names_the_address():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed again below: nobody listens there
    store = HashStore()
    store.add("hpcdist/liveness/epoch/0", 1)
    store.set("hpcdist/liveness/1", f"127.0.0.1:{port}")
    with pytest.raises(
        DistNetworkError, match=rf"rank 1 could not open its liveness connection to rank 0 at 127.0.0.1:{port}"
    ):
        Liveness(store, 1, 2, timedelta(seconds=1), "127.0.0.1")


# Rank 0 of a world of N+1 ranks in a process started with a soft open-file limit of `soft` (hard limit 4096, or
# the same), as a job's processes are: it prints the address its liveness server listens on, accepts, then prints
# its soft limit (from /proc: the script imports nothing hpcdist would not) or the error. The N connections come
# from the test process, whose limit is not lowered.
_RANK0 = """
import sys
from datetime import timedelta
from hpcdist.rendezvous.liveness import Liveness
from hpcdist.store import HashStore
class Store(HashStore):
    def set(self, key, value):
        super().set(key, value)
        print(value, flush=True)
try:
    live = Liveness(Store(), 0, int(sys.argv[1]) + 1, timedelta(seconds=20), "127.0.0.1")
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}", flush=True)
else:
    with open("/proc/self/limits") as f:
        print(next(ln for ln in f if ln.startswith("Max open files")).split()[3], flush=True)
    live.leave()
"""


def _limited(soft: int, hard: int) -> Callable[[], None]:
    def apply() -> None:  # in the child, before exec: the interpreter starts under the limit
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))

    return apply


def _rank0_with_few_descriptors(n: int, soft: int, same: bool) -> str:
    proc = subprocess.Popen(
        [sys.executable, "-c", _RANK0, str(n)],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=_limited(soft, soft if same else 4096),
    )
    conns: list[socket.socket] = []
    try:
        assert proc.stdout is not None
        host, port = proc.stdout.readline().strip().rsplit(":", 1)
        for rank in range(1, n + 1):
            try:
                conns.append(socket.create_connection((host, int(port)), timeout=10))
                conns[-1].sendall(struct.pack("!i", rank))
            except OSError:  # rank 0 gave up and closed its server
                break
        out, _ = proc.communicate(timeout=40)
        assert proc.returncode == 0
        return out.strip()
    finally:
        for c in conns:
            c.close()
        proc.kill()


def test_rank0_accepts_more_ranks_than_its_soft_open_file_limit_allows():
    # 100 connections under a limit of 32: it used to fail with "did not open their liveness connection"
    assert int(_rank0_with_few_descriptors(100, 32, same=False)) > 100


def test_rank0_at_its_hard_open_file_limit_says_so():
    out = _rank0_with_few_descriptors(100, 32, same=True)
    assert out.startswith("DistNetworkError: init_process_group: rank 0 ran out of file descriptors"), out
    assert "of 100 ranks" in out and "hard" in out and "ulimit -n" in out


class _ConnectingStore(HashStore):
    """A HashStore whose rank 0, on posting its liveness address, has every other rank connect before it returns:
    the connections wait in the accept queue, as when a whole job connects at once while rank 0 is busy."""

    def __init__(self, ranks: int) -> None:
        super().__init__()
        self.ranks, self.conns = ranks, []

    def set(self, key, value):
        super().set(key, value)
        if key == "hpcdist/liveness/1":
            host, port = value.rsplit(":", 1)
            for rank in range(1, self.ranks):
                # the handshake completes only with room in the queue; a SYN past it is dropped until rank 0 accepts
                conn = socket.create_connection((host, int(port)), timeout=5)
                conn.sendall(struct.pack("!i", rank))
                self.conns.append(conn)


def test_rank0_queues_every_rank_that_connects_before_it_accepts():
    # the listen backlog was Python's default 128: rank 129 onwards waited for SYN retries (1, 3, 7 s ...)
    ranks = 300
    store = _ConnectingStore(ranks)
    try:
        live = Liveness(store, 0, ranks, timedelta(seconds=20), "127.0.0.1")
        assert sorted(live._peers.values()) == list(range(1, ranks))
        live.leave()
    finally:
        for c in store.conns:
            c.close()


def _keepalive_of(sock: socket.socket) -> tuple[int, int, int, int]:
    return (
        sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL),
        sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT),
    )


@pytest.mark.skipif(not hasattr(socket, "TCP_KEEPIDLE"), reason="TCP_KEEPIDLE is Linux's")
@pytest.mark.parametrize(("knob", "want"), [(None, (1, 60, 20, 3)), ("9", (1, 4, 1, 3)), ("0", None)])
def test_liveness_and_store_connections_probe_an_idle_peer(monkeypatch, knob, want):
    """Both ends of a liveness connection and of store connections (a clone's too) have the kernel probe the peer (a
    host that died sends no FIN); HPCDIST_KEEPALIVE=0 leaves the OS default (no probes)."""
    from hpcdist.store import TCPStore

    if knob is None:
        monkeypatch.delenv("HPCDIST_KEEPALIVE", raising=False)
    else:
        monkeypatch.setenv("HPCDIST_KEEPALIVE", knob)
    off = socket.socket()
    default = _keepalive_of(off)  # what the OS gives a new socket
    off.close()
    store = HashStore()
    peers: list[Liveness] = []
    t = threading.Thread(target=lambda: peers.append(Liveness(store, 1, 2, timedelta(seconds=10), "127.0.0.1")))
    t.start()
    rank0 = Liveness(store, 0, 2, timedelta(seconds=10), "127.0.0.1")
    t.join(10)
    master = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    clone = master.clone()  # the flight recorder's watcher connects so
    try:
        socks = [*rank0._peers, *peers[0]._peers, master._link.chan.sock, clone._link.chan.sock]
        socks += [c.sock for c in master._link.handle.server._conns]  # the server's ends
        assert len(socks) == 6
        for sock in socks:
            assert _keepalive_of(sock) == (want or default), sock
    finally:
        clone.close()
        master.close()
        rank0.leave()
        peers[0].leave()


_RANK1 = """
import sys, time
from datetime import timedelta
from hpcdist.rendezvous.liveness import Liveness
from hpcdist.store import HashStore
store = HashStore()
store.set("hpcdist/liveness/1", sys.argv[1])
Liveness(store, 1, 3, timedelta(seconds=10), "127.0.0.1")
time.sleep(60)  # the watcher must end the process long before
"""


@pytest.mark.parametrize("sent", [b"D", b"D\0\0"], ids=["one-byte", "three-bytes"])
def test_a_rank0_that_ends_in_the_middle_of_a_death_notice_ends_the_job(sent):
    """Rank 0 sends a death notice as 5 bytes: 'D' and the dead rank. If it ends after part of them, the others'
    watcher must end them naming rank 0; it used to die of a ConnectionError and leave the rank running."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.settimeout(30)
        proc = subprocess.Popen(
            [sys.executable, "-c", _RANK1, f"127.0.0.1:{server.getsockname()[1]}"],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        try:
            conn, _ = server.accept()
            with conn:
                assert struct.unpack("!i", conn.recv(4)) == (1,)
                conn.sendall(sent)
            out, _ = proc.communicate(timeout=30)
        finally:
            proc.kill()
    assert proc.returncode != 0, out
    assert (
        "hpcdist: rank 0 of this launcher-free world of 3 died (its connection to rank 1 closed in the middle " in out
    )
    assert "Exception in thread" not in out, out
