"""TCPStore: the client, and the master's start-up of the server (torch's ``TCPStore``).

The master process (``is_master=True``) binds a listening socket exactly at
``host_name:port`` and serves it from a background thread
(:mod:`hpcdist.store._tcpserver`); every TCPStore object, the master's
included, is a client holding one authenticated TCP connection.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import ipaddress
import socket
import threading
import time
import warnings
import weakref
from datetime import timedelta

from .._descriptors import LISTEN_BACKLOG, keepalive
from ..config import keepalive_seconds
from ..errors import DistNetworkError, DistStoreError, DistStoreTimeoutError, DistTimeoutError, QueueEmptyError
from . import _protocol as P
from ._auth import ENV_SECRET, ENV_SECRET_FILE, client_proof, new_nonce, resolve_secret, server_proof
from ._tcpserver import TCPServer
from .base import DEFAULT_STORE_TIMEOUT, Store, check_bool, check_int, timeout_error

__all__ = ["TCPStore"]

_BIG = 1024 * 1024
_GUARD_EXTRA = 10.0  # seconds a client waits past a server-side deadline before giving up on the reply
_warned_unauthenticated = False
_warn_lock = threading.Lock()


# --- the server side: binding and sharing ---------------------------------------------------
def _is_loopback(host: str) -> bool:
    try:
        ip = ipaddress.ip_address(host.split("%", 1)[0])
    except ValueError:
        return False
    mapped = getattr(ip, "ipv4_mapped", None)
    return bool(ip.is_loopback or (mapped is not None and mapped.is_loopback))


def _bind(host: str, port: int) -> socket.socket:
    """A listening socket bound exactly at ``host:port``; DistNetworkError naming them otherwise."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise DistNetworkError(f"cannot start the TCPStore server: host {host!r} does not resolve ({exc})") from exc
    family, kind, proto, _, addr = infos[0]
    sock = socket.socket(family, kind, proto)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(LISTEN_BACKLOG)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise DistNetworkError(
                f"cannot start the TCPStore server on {host}:{port}: the address is already in use "
                "(another process or store holds that port); choose another port, pass port=0 to get a free one, "
                "or multi_tenant=True to share one server between stores of this process"
            ) from exc
        raise DistNetworkError(f"cannot start the TCPStore server on {host}:{port}: {exc}") from exc
    return sock


class _ServerHandle:
    """A TCPServer shared (multi-tenant) by the master stores of this process, reference-counted.

    Only master stores hold a reference; clones do not (as in torch), so closing the
    last master store stops the server at once, whatever clones other threads still hold.
    """

    _registry: dict[tuple[str, int], _ServerHandle] = {}
    #: re-entrant: a store's finalizer (release) may run from the garbage collector while this thread holds it
    _lock = threading.RLock()

    def __init__(self, server: TCPServer, key: tuple[str, int] | None, secret: bytes | None) -> None:
        self.server = server
        self.key = key
        self.secret = secret
        self.refs = 1

    @classmethod
    def open(
        cls,
        host: str,
        port: int,
        multi_tenant: bool,
        listen_fd: int | None,
        secret: bytes | None,
        max_frame: int,
        keepalive_s: int,
    ) -> _ServerHandle:
        with cls._lock:
            if multi_tenant and port != 0:
                found = cls._registry.get((host, port))
                if found is not None:
                    same = (found.secret is None and secret is None) or (
                        found.secret is not None and secret is not None and hmac.compare_digest(found.secret, secret)
                    )
                    if not same:
                        raise ValueError(
                            f"multi_tenant TCPStore on {host}:{port}: the secret differs from the one the running server uses"
                        )
                    found.refs += 1
                    return found
            if listen_fd is not None:
                sock = socket.socket(fileno=listen_fd)
                if not sock.getsockopt(socket.SOL_SOCKET, socket.SO_ACCEPTCONN):
                    raise ValueError(f"master_listen_fd must be a listening socket, got fd {listen_fd}")
            else:
                sock = _bind(host, port)
            bound = sock.getsockname()
            if secret is None and not _is_loopback(bound[0]):
                _warn_unauthenticated(host, bound[1])
            server = TCPServer(sock, secret, max_frame, keepalive_s=keepalive_s)
            server.start()
            key = (host, bound[1]) if multi_tenant else None
            handle = cls(server, key, secret)
            if key is not None:
                cls._registry[key] = handle
            return handle

    def release(self) -> None:
        with self._lock:
            self.refs -= 1
            if self.refs > 0:
                return
            if self.key is not None and self._registry.get(self.key) is self:
                del self._registry[self.key]
        self.server.stop()


def _warn_unauthenticated(host: str, port: int) -> None:
    global _warned_unauthenticated
    with _warn_lock:
        if _warned_unauthenticated:
            return
        _warned_unauthenticated = True
    warnings.warn(
        f"TCPStore server on {host}:{port} is reachable beyond this machine and runs WITHOUT authentication: "
        f"anyone who can reach the port can read and change the store. Set ${ENV_SECRET} (or ${ENV_SECRET_FILE}, "
        "or pass secret=) to the same per-job secret in every process; see hpcdist.store.new_secret().",
        RuntimeWarning,
        stacklevel=4,
    )


# --- the client side: one connection ------------------------------------------------
class _Channel:
    """One authenticated connection: send frames, receive whole reply frames."""

    def __init__(self, sock: socket.socket, max_frame: int) -> None:
        self.sock = sock
        self.max_frame = max_frame
        self.buf = bytearray()
        self._timeout: float | None = -1.0

    def settimeout(self, seconds: float) -> None:
        seconds = min(seconds, 1e7)  # ~116 days; larger values overflow the C timeout
        if seconds != self._timeout:
            self.sock.settimeout(seconds)
            self._timeout = seconds

    def send(self, pieces: list[bytes]) -> None:
        for piece in pieces:
            self.sock.sendall(piece)

    def _fill(self) -> None:
        data = self.sock.recv(262144)
        if not data:
            raise ConnectionResetError("the server closed the connection")
        self.buf += data

    def recv(self) -> tuple[int, list[bytes]]:
        buf = self.buf
        while len(buf) < 4:
            self._fill()
        (n,) = P.LEN.unpack_from(buf, 0)
        if n < 1 or n > self.max_frame:
            raise P.ProtocolError(f"reply frame of {n} bytes outside 1..{self.max_frame}")
        end = 4 + n
        if len(buf) < end and n >= _BIG:
            body = bytearray(n)
            have = len(buf) - 4
            body[:have] = buf[4:]
            buf.clear()
            with memoryview(body) as view:
                while have < n:
                    got = self.sock.recv_into(view[have:])
                    if not got:
                        raise ConnectionResetError("the server closed the connection in the middle of a reply")
                    have += got
        else:
            while len(buf) < end:
                self._fill()
            body = buf[4:end]
            del buf[:end]
        with memoryview(body) as view:
            return body[0], P.split_args(view)

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


class _Link:
    """What a TCPStore's finalizer needs: the connection and the server reference."""

    __slots__ = ("chan", "handle")

    def __init__(self, handle: _ServerHandle | None) -> None:
        self.chan: _Channel | None = None
        self.handle = handle

    def close(self) -> None:
        chan, self.chan = self.chan, None
        if chan is not None:
            chan.close()
        handle, self.handle = self.handle, None
        if handle is not None:
            handle.release()


def _ms(seconds: float) -> bytes:
    return str(max(1, int(seconds * 1000))).encode()


class TCPStore(Store):
    """A key-value store served over TCP by the master process (torch's ``TCPStore``).

    Args:
        host_name: where the master's server listens and where clients connect.
            The server binds exactly this address (``"127.0.0.1"`` keeps it on
            this machine; ``"0.0.0.0"`` exposes every interface, only if you ask).
        port: the server's port; ``0`` (master only) picks a free port, read it
            back from :attr:`port`.
        world_size: the number of store users, master included; with
            ``wait_for_workers`` the master's constructor waits for them all.
        is_master: start the server in this process (a background thread); a
            bool, as in torch (``wait_for_workers``, ``multi_tenant`` and
            ``use_libuv`` also take None or a number, never a str).
        timeout: the default timeout of blocking calls, of connecting, and of
            the wait for workers.
        wait_for_workers: see ``world_size``.
        multi_tenant: several ``is_master=True`` stores of this process with the
            same ``host_name`` and ``port`` share one server (and its keys).
        master_listen_fd: serve an already bound, listening socket (its fd).
        use_libuv: accepted for torch compatibility and ignored.
        secret: the per-job shared secret (``str``/``bytes``); defaults to
            ``$HPCDIST_STORE_SECRET``, else the file named by
            ``$HPCDIST_STORE_SECRET_FILE``. Without any secret the store runs
            unauthenticated, which is meant for loopback only (a server bound
            elsewhere warns once).
        max_frame_bytes: the largest frame accepted (default 256 MiB: values up
            to a little under that size).

    Clients retry connecting until ``timeout`` (the server may start later).
    SPMD contract: every one of ``world_size`` processes constructs one
    TCPStore (the master first or concurrently); if fewer do, the master raises
    DistTimeoutError after ``timeout``, saying how many joined.
    """

    def __init__(
        self,
        host_name: str,
        port: int,
        world_size: int | None = None,
        is_master: bool = False,
        timeout: timedelta = DEFAULT_STORE_TIMEOUT,
        wait_for_workers: bool = True,
        multi_tenant: bool = False,
        master_listen_fd: int | None = None,
        use_libuv: bool = True,
        *,
        secret: str | bytes | None = None,
        max_frame_bytes: int = P.DEFAULT_MAX_FRAME,
    ) -> None:
        super().__init__(timeout)
        if not isinstance(host_name, str):
            raise TypeError(f"host_name must be a str (an address or host name), got {type(host_name).__name__}")
        if not host_name:
            raise ValueError(f"host_name must be a non-empty str (an address or host name), got {host_name!r}")
        is_master = check_bool(is_master, "is_master")
        wait_for_workers = check_bool(wait_for_workers, "wait_for_workers", convert=True)
        multi_tenant = check_bool(multi_tenant, "multi_tenant", convert=True)
        check_bool(use_libuv, "use_libuv", convert=True)
        port = check_int(port, "port")
        if not 0 <= port <= 65535:
            raise ValueError(f"port must be in 0..65535, got {port}")
        if port == 0 and not is_master and master_listen_fd is None:
            raise ValueError("port=0 picks a free port on the master only; a client needs the master's port")
        if world_size is not None:
            world_size = check_int(world_size, "world_size")
            if world_size == -1:
                world_size = None
            elif world_size < 1:
                raise ValueError(f"world_size must be None, -1 or >= 1, got {world_size}")
        mf = check_int(max_frame_bytes, "max_frame_bytes")
        if not 4096 <= mf <= P.MAX_FRAME_LIMIT:
            raise ValueError(f"max_frame_bytes must be in 4096..{P.MAX_FRAME_LIMIT}, got {mf}")
        if master_listen_fd is not None:
            master_listen_fd = check_int(master_listen_fd, "master_listen_fd")
        self._keepalive = keepalive_seconds()  # a bad HPCDIST_KEEPALIVE is a ValueError naming it, before connecting
        self._host = host_name
        self._port = port
        self._is_master = bool(is_master)
        self._max_frame = mf
        self._secret = resolve_secret(secret)
        self._lock = threading.Lock()
        handle = None
        if is_master:
            handle = _ServerHandle.open(
                host_name, port, bool(multi_tenant), master_listen_fd, self._secret, mf, self._keepalive
            )
            self._port = handle.server.address[1]
        self._link = _Link(handle)
        self._finalizer = weakref.finalize(self, _Link.close, self._link)
        try:
            self._join_server()
            if is_master and wait_for_workers and world_size is not None:
                self._wait_for_workers(world_size)
        except BaseException:
            self.close()
            raise

    # --- attributes ----------------------------------------------------------------
    @property
    def host(self) -> str:
        """The host name the store connects to (and the master binds)."""
        return self._host

    @property
    def port(self) -> int:
        """The server's port (the one picked when created with ``port=0``)."""
        return self._port

    @property
    def libuvBackend(self) -> bool:
        """False: hpcdist's server is a Python ``selectors`` loop, not libuv."""
        return False

    def close(self) -> None:
        """Close the connection; the master's server stops when no master store of this process uses it."""
        self._finalizer()

    def __enter__(self) -> TCPStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def clone(self, timeout: timedelta | None = None) -> TCPStore:
        """A new connection to the same server (no new join), for another thread.

        A clone is a client, also when cloned from the master: as in torch, it does not keep
        the master's server alive. Once the master store closes, the clone's calls raise
        DistNetworkError.

        ``timeout``: the new handle's timeout, connecting included (default: this store's).
        """
        other = TCPStore.__new__(TCPStore)
        Store.__init__(other, self.timeout if timeout is None else timeout)
        other._host, other._port, other._is_master = self._host, self._port, False
        other._max_frame, other._secret, other._keepalive = self._max_frame, self._secret, self._keepalive
        other._lock = threading.Lock()
        other._link = _Link(None)
        other._finalizer = weakref.finalize(other, _Link.close, other._link)
        try:
            other._link.chan = other._open()
        except BaseException:
            other.close()
            raise
        return other

    # --- connection -----------------------------------------------------------------
    def _where(self) -> str:
        return f"{self._host}:{self._port}"

    def _open(self, deadline: float | None = None) -> _Channel:
        """Connect and authenticate, retrying until ``deadline`` (default: the store timeout from now)."""
        seconds = self.timeout.total_seconds()
        if deadline is None:
            deadline = time.monotonic() + seconds
        # a client usually starts a few ms before rank 0's server listens (they start together): retry
        # after 1 ms, then back off (x1.5) to 0.5 s, so joining does not wait tens of ms for a server that is up
        delay = 0.001
        last: BaseException | None = None
        mute = False  # a connection was made and the server never greeted on it
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                hint = "check that the master runs and the host and port are reachable"
                if mute:
                    hint = (
                        "the server's host took the connection but the server never greeted on it: a server out "
                        "of file descriptors does that (its log says so; raise `ulimit -n` where the master runs), "
                        "as does one too busy to serve"
                    )
                raise DistNetworkError(
                    f"could not connect to the TCPStore server at {self._where()} within {seconds:g} s "
                    f"(last error: {last}); {hint}"
                )
            try:
                sock = socket.create_connection((self._host, self._port), timeout=min(left, 10.0))
            except OSError as exc:
                last = exc
                time.sleep(min(delay, max(0.0, deadline - time.monotonic())))
                delay = min(delay * 1.5, 0.5)
                continue
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                keepalive(sock, self._keepalive)
                chan = _Channel(sock, self._max_frame)
                chan.settimeout(max(0.05, min(deadline - time.monotonic(), 30.0)))
                self._handshake(chan)
                return chan
            except (OSError, P.ProtocolError) as exc:  # the server went away mid-handshake: retry
                sock.close()
                last = exc
                mute = mute or isinstance(exc, TimeoutError)
            except BaseException:
                sock.close()
                raise

    def _join_server(self) -> None:
        """Connect and join, until the store timeout.

        A server that goes away between the handshake and the join (a master
        closing while another starts at this address: init again after
        destroy) is retried like a server that is not up yet.
        """
        deadline = time.monotonic() + self.timeout.total_seconds()
        while True:
            self._link.chan = self._open(deadline)
            try:
                self._ok(P.OP_JOIN, [])
                return
            except DistNetworkError:
                if time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)  # not a busy loop against a server that keeps dropping the join

    def _handshake(self, chan: _Channel) -> None:
        try:
            code, args = chan.recv()
        except P.ProtocolError:  # the first bytes do not even frame: not worth retrying until the timeout
            code, args = -1, []
        if code != P.OP_HELLO or len(args) != 3 or args[0] != P.MAGIC or len(args[1]) != 1:
            raise DistStoreError(
                f"{self._where()} did not greet like an hpcdist TCPStore server (another service on that port?)"
            )
        needs_auth = bool(args[1][0] & P.FLAG_AUTH)
        snonce = args[2]
        secret = self._secret
        if needs_auth and secret is None:
            raise DistStoreError(
                f"the TCPStore server at {self._where()} requires authentication but no secret is configured in this "
                f"process; set ${ENV_SECRET} or ${ENV_SECRET_FILE} (or pass secret=) to the job's secret"
            )
        if not needs_auth and secret is not None:
            raise DistStoreError(
                f"the TCPStore server at {self._where()} does not authenticate, but this process has a store secret; "
                "refusing to talk to a server that cannot prove it knows the secret (give the master the same secret)"
            )
        cnonce = new_nonce()
        mac = client_proof(secret, snonce, cnonce) if secret is not None else b""
        chan.send(P.encode(P.OP_AUTH, [cnonce, mac]))
        code, args = chan.recv()
        if code == P.ST_AUTH_FAILED:
            raise DistStoreError(
                f"the TCPStore server at {self._where()} refused this client: authentication failed; every process "
                f"must use the same secret (${ENV_SECRET}, ${ENV_SECRET_FILE} or secret=)"
            )
        if code != P.ST_OK or len(args) != 1:
            raise P.ProtocolError("unexpected reply to AUTH")
        if secret is not None and not hmac.compare_digest(args[0], server_proof(secret, snonce, cnonce)):
            raise DistStoreError(
                f"the TCPStore server at {self._where()} failed to prove it knows the secret; refusing it"
            )

    def _encode(self, op: int, parts: list[bytes]) -> list[bytes]:
        pieces = P.encode(op, parts)
        size = sum(len(p) for p in pieces) - 4
        if size > self._max_frame:
            raise ValueError(
                f"{P.OP_NAMES.get(op, op)}: request of {size} bytes exceeds max_frame_bytes={self._max_frame}; "
                "store smaller values or raise max_frame_bytes on every process"
            )
        return pieces

    def _call(self, op: int, parts: list[bytes], guard: float, reply: bool = True) -> tuple[int, list[bytes]]:
        """Send one request and return the reply (status, args); ``guard`` caps the wait for it.

        With ``reply=False`` (``set``) only send, and return ``(ST_OK, [])``.
        """
        pieces = self._encode(op, parts)
        with self._lock:
            link = self._link
            if link.chan is None:
                if not self._finalizer.alive:
                    raise DistStoreError(f"this TCPStore ({self._where()}) is closed")
                link.chan = self._open()
            chan = link.chan
            try:
                chan.settimeout(guard)
                chan.send(pieces)
                return chan.recv() if reply else (P.ST_OK, [])
            except TimeoutError:
                link.chan = None
                chan.close()
                raise DistTimeoutError(
                    f"TCPStore {P.OP_NAMES.get(op, op)}: no reply from the server at {self._where()} within {guard:g} s "
                    "(the connection was reset; the next call reconnects)"
                ) from None
            except (OSError, P.ProtocolError) as exc:
                link.chan = None
                chan.close()
                raise DistNetworkError(
                    f"TCPStore {P.OP_NAMES.get(op, op)}: lost the connection to the server at {self._where()}: {exc}"
                ) from exc

    def _ok(self, op: int, parts: list[bytes], wait: float | None = None, keys: list[str] | None = None) -> list[bytes]:
        """Run a request; raise the error its status says. ``wait``: its server-side timeout."""
        guard = self.timeout.total_seconds() if wait is None else wait + _GUARD_EXTRA + 0.1 * wait
        status, args = self._call(op, parts, guard)
        if status == P.ST_OK:
            return args
        name = P.OP_NAMES.get(op, str(op))
        if status == P.ST_TIMEOUT:
            missing = [a.decode("utf-8", "replace") for a in args] or keys or []
            raise timeout_error(name, missing, wait or 0.0)
        if status == P.ST_EMPTY:
            raise QueueEmptyError(f"queue_pop: queue {keys[0] if keys else '?'!r} is empty (block=False)")
        if status == P.ST_ERROR and len(args) == 2:
            msg = args[1].decode("utf-8", "replace")
            raise ValueError(msg) if args[0] == b"value" else DistStoreError(f"{name}: {msg}")
        raise DistStoreError(f"{name}: unexpected reply status {status} from {self._where()}")

    def _wait_for_workers(self, world_size: int) -> None:
        seconds = self.timeout.total_seconds()
        status, args = self._call(P.OP_WAIT_JOINED, [_ms(seconds), str(world_size).encode()], seconds + _GUARD_EXTRA)
        if status == P.ST_TIMEOUT:
            joined = args[0].decode() if args else "?"
            raise DistStoreTimeoutError(
                f"TCPStore master at {self._where()}: only {joined} of {world_size} workers joined within {seconds:g} s "
                "(world_size counts the master); check that every rank starts and can reach this address"
            )
        if status != P.ST_OK:
            raise DistStoreError(f"wait_for_workers: unexpected reply status {status}")

    # --- primitives -------------------------------------------------------------------
    def _set(self, key: str, value: bytes) -> None:
        # Like torch, set is not acknowledged: later requests of this store object
        # see it (one connection is served in order); other clients see it once the
        # server has read it, so synchronise them with get/wait, never with check.
        self._call(P.OP_SET, [key.encode(), value], self.timeout.total_seconds(), reply=False)

    def _get(self, key: str, timeout: float) -> bytes:
        return self._ok(P.OP_GET, [_ms(timeout), key.encode()], timeout, [key])[0]

    def _add(self, key: str, amount: int) -> int:
        return int(self._ok(P.OP_ADD, [key.encode(), str(amount).encode()])[0])

    def _compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        return self._ok(P.OP_COMPARE_SET, [key.encode(), expected, desired])[0]

    def _wait(self, keys: list[str], timeout: float) -> None:
        self._ok(P.OP_WAIT, [_ms(timeout), *(k.encode() for k in keys)], timeout, keys)

    def _check(self, keys: list[str]) -> bool:
        return self._ok(P.OP_CHECK, [k.encode() for k in keys])[0] == b"1"

    def _delete_key(self, key: str) -> bool:
        return self._ok(P.OP_DELETE, [key.encode()])[0] == b"1"

    def _num_keys(self) -> int:
        return int(self._ok(P.OP_NUM_KEYS, [])[0])

    def _list_keys(self) -> list[str]:
        return [k.decode("utf-8", "replace") for k in self._ok(P.OP_LIST_KEYS, [])]

    def _multi_get(self, keys: list[str], timeout: float) -> list[bytes]:
        return self._ok(P.OP_MULTI_GET, [_ms(timeout), *(k.encode() for k in keys)], timeout, keys)

    def _multi_set(self, keys: list[str], values: list[bytes]) -> None:
        parts: list[bytes] = []
        for k, v in zip(keys, values):
            parts.append(k.encode())
            parts.append(v)
        self._ok(P.OP_MULTI_SET, parts)

    def _append(self, key: str, value: bytes) -> None:
        self._ok(P.OP_APPEND, [key.encode(), value])

    def _queue_push(self, key: str, value: bytes) -> None:
        self._ok(P.OP_QUEUE_PUSH, [key.encode(), value])

    def _queue_pop(self, key: str, block: bool, timeout: float) -> bytes:
        if block:
            return self._ok(P.OP_QUEUE_POP, [_ms(timeout), key.encode()], timeout, [key])[0]
        return self._ok(P.OP_QUEUE_POP, [b"", key.encode()], None, [key])[0]

    def _queue_len(self, key: str) -> int:
        return int(self._ok(P.OP_QUEUE_LEN, [key.encode()])[0])
