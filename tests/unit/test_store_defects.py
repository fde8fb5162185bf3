"""Store defects found by adversarial testing, each pinned by a test that failed before its fix.

Real servers on loopback and real sockets; every test has a hard time limit.
"""

from __future__ import annotations

import socket
import threading
import time
from datetime import timedelta

import pytest

from hpcdist.errors import DistNetworkError, DistStoreError
from hpcdist.store import TCPStore
from hpcdist.store import _protocol as P
from hpcdist.store import tcp as tcpmod

HOST = "127.0.0.1"
T10 = timedelta(seconds=10)


@pytest.fixture(autouse=True)
def no_env_secret(monkeypatch):
    monkeypatch.delenv("HPCDIST_STORE_SECRET", raising=False)
    monkeypatch.delenv("HPCDIST_STORE_SECRET_FILE", raising=False)


def _bindable(port: int) -> bool:
    """Whether a new server could listen on ``port`` now (what a re-created master store does)."""
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((HOST, port))
        sock.listen()
        return True
    except OSError:
        return False
    finally:
        sock.close()


@pytest.mark.timeout(30)
def test_a_clone_does_not_keep_the_masters_server_alive():
    """torch: deleting the master store stops its server, clones or not; the port is free at once.

    Before the fix a clone held a reference on the server: destroy_process_group closed the
    master store while the flight recorder's clone was still open, the old server lived on, and
    init again at the same MASTER_PORT either failed to bind (address in use) or let other
    ranks join that stale server, which then went away under them.
    """
    master = TCPStore(HOST, 0, 1, True, T10, wait_for_workers=False)
    master.set("old", b"1")
    clone = master.clone(timedelta(seconds=1))
    port = master.port
    master.close()
    assert _bindable(port), "the master store closed, but its server still listens"
    with pytest.raises(DistNetworkError):
        clone.get("old")
    clone.close()
    again = TCPStore(HOST, port, 1, True, T10, wait_for_workers=False, multi_tenant=True)
    try:
        assert not again.check(["old"]), "a new master store shared the closed store's server and keys"
    finally:
        again.close()


@pytest.mark.timeout(30)
def test_a_client_joins_the_server_that_replaces_one_gone_after_the_handshake():
    """A server that closes between the handshake and the join (a master closing while the next
    one starts at that address) is retried like one that is not up yet, not reported as lost."""
    listener = socket.create_server((HOST, 0))
    port = listener.getsockname()[1]
    started: list[TCPStore] = []

    def old_server_then_new() -> None:
        conn, _ = listener.accept()
        conn.sendall(b"".join(P.encode(P.OP_HELLO, [P.MAGIC, b"\x00", b"n" * 32])))
        buf = b""
        while len(buf) < 4 or len(buf) < 4 + P.LEN.unpack_from(buf)[0]:
            buf += conn.recv(4096)  # the client's AUTH
        conn.sendall(b"".join(P.encode(P.ST_OK, [b""])))
        buf = b""
        while len(buf) < 4:
            buf += conn.recv(4096)  # the client's JOIN: this server goes away instead of answering
        conn.close()
        listener.close()
        time.sleep(0.2)
        started.append(TCPStore(HOST, port, 2, True, T10, wait_for_workers=False))

    thread = threading.Thread(target=old_server_then_new, daemon=True)
    thread.start()
    client = TCPStore(HOST, port, 2, False, T10)
    thread.join(10)
    try:
        client.set("k", b"v")
        assert started and started[0].get("k") == b"v"
    finally:
        client.close()
        for s in started:
            s.close()
    assert not tcpmod._ServerHandle._registry


@pytest.mark.timeout(30)
def test_a_foreign_service_that_speaks_first_is_named_at_once():
    """A port held by another service (here one that greets like SSH) is refused at once as not an
    hpcdist store server. Before the fix its greeting failed to frame, which was retried like a
    server still starting, until the store timeout (300 s by default)."""
    listener = socket.create_server((HOST, 0))
    port = listener.getsockname()[1]
    stop = threading.Event()

    def ssh_like() -> None:
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            conn.sendall(b"SSH-2.0-OpenSSH_9.6\r\n")
            conn.close()

    thread = threading.Thread(target=ssh_like, daemon=True)
    thread.start()
    start = time.monotonic()
    try:
        with pytest.raises(DistStoreError, match=rf"{HOST}:{port} did not greet like an hpcdist TCPStore server"):
            TCPStore(HOST, port, timeout=timedelta(seconds=5))
        assert time.monotonic() - start < 2.5
    finally:
        stop.set()
        thread.join(5)
        listener.close()


def test_a_master_collected_while_the_server_registry_is_locked_does_not_deadlock(tmp_path):
    """A master store in a reference cycle is closed by the garbage collector, which may run at any allocation,
    also inside _ServerHandle.open while this thread holds the registry's lock: the finalizer's release takes
    the same lock. With a plain Lock that thread waited for itself forever. Run in a process of its own."""
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent(
        """
        import gc
        from datetime import timedelta
        from hpcdist.store import TCPStore
        from hpcdist.store.tcp import _ServerHandle

        gc.disable()
        s = TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=5), wait_for_workers=False)
        s.cycle = s  # only the collector frees it
        del s
        with _ServerHandle._lock:  # as inside open(): the collection runs the finalizer here
            gc.collect()
        print("collected")
        """
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=20, cwd=tmp_path)
    assert res.returncode == 0 and "collected" in res.stdout, res.stdout + res.stderr
