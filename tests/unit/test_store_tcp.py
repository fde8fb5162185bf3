"""TCPStore: the server, the wire protocol, authentication, failure handling.

Real servers on loopback and real sockets; servers that must die run in a
subprocess that the test kills.
"""

from __future__ import annotations

import contextlib
import os
import random
import socket
import subprocess
import sys
import threading
import time
import warnings
from datetime import timedelta

import pytest

from hpcdist.errors import DistNetworkError, DistStoreError, DistTimeoutError
from hpcdist.store import TCPStore, new_secret
from hpcdist.store import _protocol as P
from hpcdist.store import tcp as tcpmod
from hpcdist.store._auth import client_proof, new_nonce

HOST = "127.0.0.1"
T30 = timedelta(seconds=30)
HANG_GUARD = 20.0


@pytest.fixture
def no_env_secret(monkeypatch):
    monkeypatch.delenv("HPCDIST_STORE_SECRET", raising=False)
    monkeypatch.delenv("HPCDIST_STORE_SECRET_FILE", raising=False)


@pytest.fixture
def master(no_env_secret):
    s = TCPStore(HOST, 0, None, True, T30)
    yield s
    s.close()


@pytest.fixture
def secret_master(no_env_secret):
    secret = new_secret()
    s = TCPStore(HOST, 0, None, True, T30, secret=secret)
    yield s, secret
    s.close()


def _server_address(store: TCPStore) -> tuple[str, int]:
    handle = store._link.handle
    assert handle is not None
    return handle.server.address


def _spawn_server(extra_env: dict[str, str] | None = None) -> tuple[subprocess.Popen, int]:
    code = (
        "import sys, time\n"
        "from datetime import timedelta\n"
        "from hpcdist.store import TCPStore\n"
        "s = TCPStore('127.0.0.1', 0, None, True, timedelta(seconds=60))\n"
        "print(s.port, flush=True)\n"
        "time.sleep(120)\n"
    )
    env = dict(os.environ)
    env.pop("HPCDIST_STORE_SECRET", None)
    env.pop("HPCDIST_STORE_SECRET_FILE", None)
    env.update(extra_env or {})
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.kill()
        raise RuntimeError("server subprocess did not start")
    return proc, int(line)


def _good_client_works(port: int, secret: str | None = None) -> None:
    c = TCPStore(HOST, port, timeout=timedelta(seconds=10), secret=secret)
    try:
        c.set("health", b"ok")
        assert c.get("health") == b"ok"
        assert c.add("health-count", 1) >= 1
    finally:
        c.close()


# --- binding -------------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_port_zero_picks_a_free_port_and_binds_exactly_the_host(master):
    assert master.port > 0
    assert master.host == HOST
    assert _server_address(master) == (HOST, master.port)
    assert master.libuvBackend is False


@pytest.mark.timeout(30)
def test_busy_port_raises_dist_network_error_naming_host_and_port(no_env_secret):
    with socket.socket() as blocker:
        blocker.bind((HOST, 0))
        blocker.listen()
        port = blocker.getsockname()[1]
        with pytest.raises(DistNetworkError, match=rf"{HOST}:{port}.*already in use"):
            TCPStore(HOST, port, None, True, T30)


@pytest.mark.timeout(30)
def test_second_master_on_same_port_without_multi_tenant_is_refused(master):
    with pytest.raises(DistNetworkError, match=str(master.port)):
        TCPStore(HOST, master.port, None, True, T30)


@pytest.mark.timeout(30)
def test_multi_tenant_masters_share_one_server(no_env_secret):
    a = TCPStore(HOST, 0, None, True, T30, multi_tenant=True)
    b = TCPStore(HOST, a.port, None, True, T30, multi_tenant=True)
    try:
        assert a._link.handle is b._link.handle
        a.set("k", b"from-a")
        assert b.get("k") == b"from-a"
    finally:
        a.close()
    b.set("still", b"serving")  # the server lives while one tenant does
    assert b.get("still") == b"serving"
    port = b.port
    b.close()
    with socket.socket() as probe:  # the last tenant stopped the server: the port is free again
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        deadline = time.monotonic() + HANG_GUARD
        while True:
            try:
                probe.bind((HOST, port))
                break
            except OSError:
                assert time.monotonic() < deadline, "server did not release its port"
                time.sleep(0.05)


@pytest.mark.timeout(30)
def test_master_listen_fd(no_env_secret):
    lsock = socket.socket()
    lsock.bind((HOST, 0))
    lsock.listen()
    port = lsock.getsockname()[1]
    s = TCPStore(HOST, port, None, True, T30, master_listen_fd=lsock.detach())
    try:
        assert s.port == port
        _good_client_works(port)
    finally:
        s.close()


@pytest.mark.timeout(30)
def test_constructor_argument_errors(no_env_secret):
    with pytest.raises(ValueError, match=r"port must be in 0\.\.65535, got 70000"):
        TCPStore(HOST, 70000)
    with pytest.raises(TypeError, match=r"port must be an int, got str"):
        TCPStore(HOST, "29500")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"host_name must be a non-empty str"):
        TCPStore("", 1234)
    with pytest.raises(ValueError, match=r"port=0 picks a free port on the master only"):
        TCPStore(HOST, 0)
    with pytest.raises(ValueError, match=r"world_size must be None, -1 or >= 1, got 0"):
        TCPStore(HOST, 0, 0, True)
    with pytest.raises(TypeError, match=r"timeout must be a datetime\.timedelta, got int"):
        TCPStore(HOST, 0, 1, True, 30)  # type: ignore[arg-type]


# --- clients, workers, timeouts ------------------------------------------------------------
@pytest.mark.timeout(30)
def test_wait_for_workers_counts_joins_and_times_out_saying_how_many(no_env_secret):
    with pytest.raises(DistTimeoutError, match=r"only 1 of 3 workers joined"):
        TCPStore(HOST, 0, 3, True, timedelta(seconds=0.3))
    # with the workers present it returns
    result: list[TCPStore] = []
    port_box: list[int] = []
    ready = threading.Event()

    def make_master() -> None:
        lsock = socket.socket()
        lsock.bind((HOST, 0))
        lsock.listen()
        port_box.append(lsock.getsockname()[1])
        ready.set()
        result.append(TCPStore(HOST, port_box[0], 3, True, T30, master_listen_fd=lsock.detach()))

    t = threading.Thread(target=make_master)
    t.start()
    ready.wait(HANG_GUARD)
    workers = [TCPStore(HOST, port_box[0], 3, False, T30) for _ in range(2)]
    t.join(HANG_GUARD)
    assert len(result) == 1
    for s in [*workers, *result]:
        s.close()


@pytest.mark.timeout(30)
def test_client_retries_until_the_server_starts(no_env_secret):
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port = probe.getsockname()[1]
    got: list[object] = []

    def client() -> None:
        try:
            c = TCPStore(HOST, port, timeout=timedelta(seconds=15))
            got.append(c.get("hello"))
            c.close()
        except BaseException as exc:
            got.append(exc)

    t = threading.Thread(target=client)
    t.start()
    time.sleep(0.3)
    m = TCPStore(HOST, port, None, True, T30)
    m.set("hello", b"late server")
    t.join(HANG_GUARD)
    m.close()
    assert got == [b"late server"]


@pytest.mark.timeout(30)
def test_connect_gives_up_after_timeout_naming_the_address(no_env_secret):
    with socket.socket() as probe:
        probe.bind((HOST, 0))
        port = probe.getsockname()[1]
    start = time.monotonic()
    with pytest.raises(DistNetworkError, match=rf"{HOST}:{port} within 0\.3 s"):
        TCPStore(HOST, port, timeout=timedelta(seconds=0.3))
    assert time.monotonic() - start >= 0.3


@pytest.mark.timeout(30)
def test_wait_times_out_on_time_server_keeps_serving_and_client_stays_usable(master):
    c = TCPStore(HOST, master.port, timeout=T30)
    start = time.monotonic()
    with pytest.raises(DistTimeoutError, match="'missing'"):
        c.wait(["missing"], timedelta(seconds=0.5))
    elapsed = time.monotonic() - start
    assert elapsed >= 0.5  # waited the timeout; the test's own time limit guards a hang
    c.set("k", b"v")
    assert c.get("k") == b"v"
    # a key set after a timed-out waiter gave up does not confuse the connection
    master.set("missing", b"now")
    assert c.get("missing") == b"now"
    c.close()


@pytest.mark.timeout(30)
def test_many_parked_waiters_are_all_woken(master):
    clients = [master.clone() for _ in range(20)]
    got: list[bytes] = []
    lock = threading.Lock()

    def waiter(c: TCPStore) -> None:
        v = c.get("go")
        with lock:
            got.append(v)

    threads = [threading.Thread(target=waiter, args=(c,)) for c in clients]
    for t in threads:
        t.start()
    time.sleep(0.2)
    master.set("go", b"1")
    for t in threads:
        t.join(HANG_GUARD)
    assert got == [b"1"] * 20
    for c in clients:
        c.close()


@pytest.mark.timeout(60)
def test_server_dying_during_wait_raises_network_error_promptly(no_env_secret):
    proc, port = _spawn_server()
    try:
        c = TCPStore(HOST, port, timeout=timedelta(seconds=60))
        outcome: list[BaseException] = []

        def waiting() -> None:
            try:
                c.wait(["never"])
            except BaseException as exc:
                outcome.append(exc)

        t = threading.Thread(target=waiting)
        t.start()
        time.sleep(0.3)
        proc.kill()
        t.join(HANG_GUARD)
        assert not t.is_alive(), "wait did not notice that the server died"
        assert len(outcome) == 1 and isinstance(outcome[0], DistNetworkError), outcome
        assert f"{HOST}:{port}" in str(outcome[0])
    finally:
        proc.kill()
        proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


@pytest.mark.timeout(30)
def test_value_above_frame_cap_is_refused_client_side(no_env_secret):
    s = TCPStore(HOST, 0, None, True, T30, max_frame_bytes=4096)
    try:
        with pytest.raises(ValueError, match=r"exceeds max_frame_bytes=4096"):
            s.set("k", b"x" * 5000)
        s.set("k", b"x" * 1000)
        assert s.get("k") == b"x" * 1000
        with pytest.raises(ValueError, match="max_frame_bytes"):
            for _ in range(10):
                s.append("k", b"y" * 1000)
    finally:
        s.close()


@pytest.mark.timeout(60)
def test_64_mib_values_round_trip(master):
    value = bytes(range(256)) * (256 * 1024)
    assert len(value) == 64 * 1024 * 1024
    c = TCPStore(HOST, master.port, timeout=T30)
    c.set("big", value)
    assert master.get("big") == value
    master.queue_push("bigq", value)
    assert c.queue_pop("bigq") == value
    assert c.multi_get(["big"]) == [value]
    c.close()


# --- authentication --------------------------------------------------------------------------
@pytest.mark.timeout(30)
def test_secret_from_argument_authenticates(secret_master):
    s, secret = secret_master
    _good_client_works(s.port, secret)


@pytest.mark.timeout(30)
def test_wrong_secret_is_refused_and_server_serves_others(secret_master):
    s, secret = secret_master
    with pytest.raises(DistStoreError, match="authentication failed"):
        TCPStore(HOST, s.port, timeout=T30, secret="wrong")
    with pytest.raises(DistStoreError, match="requires authentication but no secret is configured"):
        TCPStore(HOST, s.port, timeout=T30)
    _good_client_works(s.port, secret)


@pytest.mark.timeout(30)
def test_client_with_secret_refuses_an_unauthenticated_server(master):
    with pytest.raises(DistStoreError, match="does not authenticate"):
        TCPStore(HOST, master.port, timeout=T30, secret=new_secret())


@pytest.mark.timeout(30)
def test_secret_from_environment(no_env_secret, monkeypatch):
    monkeypatch.setenv("HPCDIST_STORE_SECRET", "env-secret")
    s = TCPStore(HOST, 0, None, True, T30)
    try:
        _good_client_works(s.port)  # same env
        with pytest.raises(DistStoreError, match="authentication failed"):
            TCPStore(HOST, s.port, timeout=T30, secret="other")
    finally:
        s.close()


@pytest.mark.timeout(30)
def test_secret_file_must_be_private(no_env_secret, monkeypatch, tmp_path):
    path = tmp_path / "secret"
    path.write_text(new_secret() + "\n")
    os.chmod(path, 0o644)
    monkeypatch.setenv("HPCDIST_STORE_SECRET_FILE", str(path))
    with pytest.raises(DistStoreError, match=r"mode 0644.*chmod 600"):
        TCPStore(HOST, 0, None, True, T30)
    os.chmod(path, 0o600)
    s = TCPStore(HOST, 0, None, True, T30)
    try:
        _good_client_works(s.port)
        with pytest.raises(DistStoreError, match="authentication failed"):
            TCPStore(HOST, s.port, timeout=T30, secret="not-the-file-secret")
    finally:
        s.close()
    monkeypatch.setenv("HPCDIST_STORE_SECRET_FILE", str(tmp_path / "absent"))
    with pytest.raises(DistStoreError, match="cannot open the store secret file"):
        TCPStore(HOST, 0, None, True, T30)


@pytest.mark.timeout(30)
def test_unauthenticated_non_loopback_bind_warns_once(no_env_secret, monkeypatch):
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))
            addr = probe.getsockname()[0]
    except OSError:
        pytest.skip("no non-loopback IPv4 address")
    if addr.startswith("127."):
        pytest.skip("no non-loopback IPv4 address")
    monkeypatch.setattr(tcpmod, "_warned_unauthenticated", False)
    with pytest.warns(RuntimeWarning, match="WITHOUT authentication"):
        s = TCPStore(addr, 0, None, True, T30)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        s2 = TCPStore(addr, 0, None, True, T30)  # only once per process
    try:
        assert _server_address(s)[0] == addr
    finally:
        s.close()
        s2.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        TCPStore(HOST, 0, None, True, T30).close()  # loopback: silent


# --- robustness: fuzzing the server ----------------------------------------------------------
def _raw(port: int) -> socket.socket:
    s = socket.create_connection((HOST, port), timeout=5)
    s.settimeout(5)
    return s


def _read_frame(sock: socket.socket) -> tuple[int, list[bytes]]:
    buf = b""
    while len(buf) < 4:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    (n,) = P.LEN.unpack_from(buf, 0)
    while len(buf) < 4 + n:
        chunk = sock.recv(65536)
        if not chunk:
            raise ConnectionError("closed")
        buf += chunk
    body = buf[4 : 4 + n]
    return body[0], P.split_args(body)


def _authenticated_raw(port: int, secret: bytes) -> socket.socket:
    sock = _raw(port)
    code, (magic, _flags, snonce) = _read_frame(sock)
    assert code == P.OP_HELLO and magic == P.MAGIC
    cnonce = new_nonce()
    sock.sendall(b"".join(P.encode(P.OP_AUTH, [cnonce, client_proof(secret, snonce, cnonce)])))
    code, _ = _read_frame(sock)
    assert code == P.ST_OK
    return sock


def _closed_by_server(sock: socket.socket) -> bool:
    """True when the server closes ``sock`` (EOF or reset) within a few seconds."""
    sock.settimeout(5)
    try:
        while True:
            if not sock.recv(65536):
                return True
    except (ConnectionResetError, BrokenPipeError):
        return True
    except TimeoutError:
        return False


@pytest.mark.timeout(120)
def test_fuzzed_frames_drop_only_the_offending_connection(secret_master):
    store, secret_str = secret_master
    port, secret = store.port, secret_str.encode()
    rng = random.Random(1234)
    good = TCPStore(HOST, port, timeout=T30, secret=secret_str)
    idle = _authenticated_raw(port, secret)  # a well-behaved peer holding its connection open

    def garbage() -> bytes:
        return rng.randbytes(rng.randint(1, 300))

    def frame_preauth() -> bytes:
        kind = rng.randrange(6)
        if kind == 0:  # random bytes
            return garbage()
        if kind == 1:  # oversized length prefix
            return P.LEN.pack(rng.randint(P.PREAUTH_MAX_FRAME + 1, 2**32 - 1)) + garbage()
        if kind == 2:  # zero length
            return P.LEN.pack(0)
        if kind == 3:  # AUTH with a wrong MAC
            return b"".join(P.encode(P.OP_AUTH, [new_nonce(), rng.randbytes(32)]))
        if kind == 4:  # a command before authenticating
            return b"".join(P.encode(P.OP_SET, [b"pwned", b"1"]))
        return b"".join(P.encode(P.OP_AUTH, [b"short", b""]))  # malformed AUTH

    def frame_authed() -> bytes:
        kind = rng.randrange(5)
        if kind == 0:  # oversized length prefix
            return P.LEN.pack(P.DEFAULT_MAX_FRAME + rng.randint(1, 1000)) + garbage()
        if kind == 1:  # unknown opcode
            return b"".join(P.encode(rng.choice([0, 3, 9, 99, 200, 255]), [b"x"]))
        if kind == 2:  # argument overrunning the frame
            return P.HEADER.pack(9, P.OP_SET) + P.LEN.pack(1000) + b"abcd"
        if kind == 3:  # wrong argument count
            return b"".join(P.encode(P.OP_GET, [b"k"]))
        return b"".join(P.encode(P.OP_ADD, [b"k", b"not-a-number"]))

    for i in range(120):
        authed = i % 2 == 1
        sock = _authenticated_raw(port, secret) if authed else _raw(port)
        payload = frame_authed() if authed else frame_preauth()
        if rng.random() < 0.3:  # truncated: send part of it and hang up
            sock.sendall(payload[: rng.randint(0, max(0, len(payload) - 1))])
            sock.close()
        else:
            with contextlib.suppress(OSError):
                sock.sendall(payload)
            if not authed and payload[4:5] == bytes([P.OP_AUTH]) and len(payload) > 40:
                # a wrong MAC: the server says so, then closes
                with contextlib.suppress(OSError):
                    _read_frame(sock)  # HELLO
            assert _closed_by_server(sock) or len(payload) < 4, f"connection kept after {payload[:16]!r}"
            sock.close()
        if i % 10 == 0:
            good.set(f"k{i}", str(i))
            assert good.get(f"k{i}") == str(i).encode()
    # nothing sent before authentication reached the store
    assert not good.check(["pwned"])
    # a half-sent frame that stays open does not stall anyone
    staller = _authenticated_raw(port, secret)
    staller.sendall(P.HEADER.pack(100, P.OP_SET) + b"abc")
    _good_client_works(port, secret_str)
    idle.sendall(b"".join(P.encode(P.OP_PING, [])))
    assert _read_frame(idle)[0] == P.ST_OK
    for s in (staller, idle):
        s.close()
    good.close()


@pytest.mark.timeout(30)
def test_peer_that_never_authenticates_is_dropped(no_env_secret):
    s = TCPStore(HOST, 0, None, True, T30, secret="x")
    try:
        s._link.handle.server._auth_timeout = 0.2  # type: ignore[union-attr]
        sock = _raw(s.port)
        assert _closed_by_server(sock)
        sock.close()
        _good_client_works(s.port, "x")
    finally:
        s.close()


@pytest.mark.timeout(30)
def test_clone_and_close(master):
    c = master.clone()
    c.set("x", b"1")
    assert master.get("x") == b"1"
    c.close()
    c.close()  # idempotent
    with pytest.raises(DistStoreError, match="closed"):
        c.get("x")
    with TCPStore(HOST, master.port, timeout=T30) as ctx:
        assert ctx.get("x") == b"1"


@pytest.mark.timeout(60)
def test_clone_with_its_own_timeout(no_env_secret):
    store = TCPStore(HOST, 0, 1, True, T30, wait_for_workers=False)
    worker = TCPStore(HOST, store.port, timeout=T30)
    quick = worker.clone(timedelta(seconds=1))
    assert quick.timeout == timedelta(seconds=1) and worker.clone().timeout == T30
    quick.close()
    store.close()  # the server is gone: a clone gives up after its own timeout, not the store's 30 s
    with pytest.raises(DistNetworkError, match=r"could not connect .* within 1 s"):
        worker.clone(timedelta(seconds=1))
    worker.close()


@pytest.mark.timeout(30)
def test_very_long_timeouts_do_not_overflow_the_event_loop(no_env_secret):
    # a server whose only deadlines are far away: epoll would refuse them unbounded
    from hpcdist.store._tcpserver import TCPServer

    lsock = socket.socket()
    lsock.bind((HOST, 0))
    lsock.listen()
    server = TCPServer(lsock, None, auth_timeout=1e9)
    server.start()
    port = server.address[1]
    try:
        long = timedelta(days=1000)
        a = TCPStore(HOST, port, timeout=long)
        b = TCPStore(HOST, port, timeout=long)
        done: list[object] = []
        t = threading.Thread(target=lambda: done.append(a.wait(["late"], long)))
        t.start()
        time.sleep(0.3)
        b.set("late", b"1")
        t.join(HANG_GUARD)
        assert done == [None]
        assert a.get("late") == b"1"
        a.close()
        b.close()
    finally:
        server.stop()


_FD_EXHAUSTION = r"""
import resource, socket, time
from datetime import timedelta
from hpcdist.store import TCPStore

import os
used = len(os.listdir("/proc/self/fd"))
resource.setrlimit(resource.RLIMIT_NOFILE, (used + 24, resource.getrlimit(resource.RLIMIT_NOFILE)[1]))
master = TCPStore("127.0.0.1", 0, None, True, timedelta(seconds=20), wait_for_workers=False)
extra = []
try:
    while True:  # connections the server cannot accept: it runs out of descriptors first
        s = socket.socket()
        extra.append(s)
        s.connect(("127.0.0.1", master.port))
except OSError:
    pass
time.sleep(0.3)
cpu0 = time.process_time()
time.sleep(1.0)
cpu = time.process_time() - cpu0
for s in extra:
    s.close()
time.sleep(0.3)
client = TCPStore("127.0.0.1", master.port, None, False, timedelta(seconds=10))
client.set("k", b"v")
print("CPU", round(cpu, 3), "GOT", master.get("k").decode(), "CONNS", len(extra))
"""


@pytest.mark.timeout(60)
def test_server_out_of_descriptors_does_not_spin_and_recovers(no_env_secret):
    """accept() failing with EMFILE must not turn the server loop into a busy spin; once
    descriptors are free again new clients are served."""
    proc = subprocess.run([sys.executable, "-c", _FD_EXHAUSTION], capture_output=True, text=True, timeout=50)
    assert proc.returncode == 0, proc.stderr[-2000:]
    fields = proc.stdout.split()
    assert fields[0] == "CPU" and fields[2:4] == ["GOT", "v"], proc.stdout
    assert int(fields[5]) > 1
    assert float(fields[1]) < 0.5, f"server loop used {fields[1]} s of CPU in 1 s while out of descriptors"
