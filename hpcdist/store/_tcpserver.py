"""The TCP store server: one background thread, one ``selectors`` loop, many clients.

Blocking requests (``get``, ``wait``, ``multi_get``, blocking ``queue_pop``,
the master's wait for workers) never block the loop: the request is *parked*
as a waiter, registered under the key it still misses, and answered when a
write supplies that key or when its deadline (carried in the request) passes.
While a connection has a parked request, its later frames stay buffered.

Robustness: a malformed, truncated or oversized frame, or a failed handshake,
drops that one connection; frames are capped at ``max_frame`` bytes (and at
:data:`~hpcdist.store._protocol.PREAUTH_MAX_FRAME` before authentication); a
connection that does not authenticate within ``auth_timeout`` seconds is
closed; a client that stops reading its replies stops being served until it
drains them. Nothing received is ever unpickled or evaluated.

Scale: one connection is one file descriptor, and a job's rank 0 serves every
rank. When ``accept`` fails for want of descriptors (``EMFILE``), the server
raises this process's soft limit towards the hard one
(:func:`hpcdist._descriptors.accept`); only where the hard limit is reached does it
pause accepting and say which limit to raise.
"""

from __future__ import annotations

import contextlib
import errno
import heapq
import hmac
import itertools
import logging
import selectors
import socket
import threading
import time
from collections import deque

from .._descriptors import accept, keepalive, limits_text
from . import _protocol as P
from ._auth import NONCE_BYTES, client_proof, new_nonce, server_proof
from ._state import KVState
from ._tcphandlers import RequestHandlers

__all__ = ["TCPServer"]

_log = logging.getLogger("hpcdist.store")

_RECV = 256 * 1024  # bytes asked of one recv()
_BIG = 1024 * 1024  # frames at least this big are received in place
_OUT_HIGH = 8 * 1024 * 1024  # stop serving a connection with this much unsent output
_ACCEPT_PAUSE = 0.1  # seconds without accepting after accept() failed (EMFILE)
_LISTEN = object()
_WAKE = object()


class _Conn:
    __slots__ = (
        "authed",
        "big",
        "big_fill",
        "buf",
        "closed",
        "closing",
        "events",
        "out",
        "out_bytes",
        "peer",
        "snonce",
        "sock",
        "stalled",
        "waiter",
    )

    def __init__(self, sock: socket.socket, peer: str) -> None:
        self.sock = sock
        self.peer = peer
        self.buf = bytearray()
        self.big: bytearray | None = None  # body of a large frame being received in place
        self.big_fill = 0
        self.out: deque[bytes | memoryview] = deque()
        self.out_bytes = 0
        self.authed = False
        self.closed = False
        self.closing = False  # close once the output is flushed
        self.stalled = False  # too much unsent output: stop reading frames
        self.waiter: _Waiter | None = None
        self.snonce = b""
        self.events = selectors.EVENT_READ


class _Waiter:
    __slots__ = ("conn", "done", "keys", "n", "op", "reg")

    def __init__(self, conn: _Conn, op: int, keys: list[bytes], n: int = 0) -> None:
        self.conn = conn
        self.op = op
        self.keys = keys
        self.n = n
        self.done = False
        self.reg: bytes | None = None  # the key it is registered under


class TCPServer(RequestHandlers):
    """Serve the store protocol on an already bound, listening socket.

    ``secret`` None means no authentication (the caller decides when that is
    acceptable); ``keepalive_s``: the keepalive of accepted connections
    (:func:`hpcdist._descriptors.keepalive`). :meth:`start` runs the loop in a
    daemon thread; :meth:`stop` ends it and closes every socket.
    """

    def __init__(
        self,
        listener: socket.socket,
        secret: bytes | None,
        max_frame: int = P.DEFAULT_MAX_FRAME,
        auth_timeout: float = 30.0,
        keepalive_s: int = 0,
    ) -> None:
        self._listener = listener
        self._keepalive_s = keepalive_s
        self._secret = secret
        self._max_frame = max_frame
        self._auth_timeout = auth_timeout
        self._state: KVState[bytes] = KVState()
        self._joined = 0
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = socket.socketpair()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self._timers: list[tuple[float, int, object]] = []
        self._seq = itertools.count()
        self._kwait: dict[bytes, list[_Waiter]] = {}
        self._qwait: dict[bytes, deque[_Waiter]] = {}
        self._jwait: list[_Waiter] = []
        self._resume: deque[_Conn] = deque()
        self._dirty: dict[_Conn, None] = {}
        self._conns: set[_Conn] = set()
        self._accept_warned = -1e9
        self._handlers = self.handler_table()

    # --- lifecycle ------------------------------------------------------------------
    @property
    def address(self) -> tuple[str, int]:
        """(host, port) the server listens on."""
        name = self._listener.getsockname()
        return name[0], name[1]

    def start(self) -> None:
        self._listener.setblocking(False)
        self._wake_r.setblocking(False)
        self._sel.register(self._listener, selectors.EVENT_READ, _LISTEN)
        self._sel.register(self._wake_r, selectors.EVENT_READ, _WAKE)
        host, port = self.address
        self._thread = threading.Thread(target=self._run, name=f"hpcdist-store-server-{host}:{port}", daemon=True)
        self._thread.start()

    def stop(self, join_timeout: float = 5.0) -> None:
        """Stop serving; close the listener and every connection."""
        self._stopping = True
        with contextlib.suppress(OSError):
            self._wake_w.send(b"x")
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(join_timeout)

    def _run(self) -> None:
        try:
            while not self._stopping:
                self._step()
        except Exception:  # pragma: no cover - a bug; keep the process alive, log it
            _log.exception("hpcdist store server crashed")
        finally:
            for conn in list(self._conns):
                self._drop(conn, None)
            self._sel.close()
            for s in (self._listener, self._wake_r, self._wake_w):
                with contextlib.suppress(OSError):
                    s.close()

    def _step(self) -> None:
        if self._resume:
            timeout: float | None = 0.0
        elif self._timers:
            # bounded: epoll refuses timeouts above INT_MAX milliseconds
            timeout = min(max(0.0, self._timers[0][0] - time.monotonic()), 60.0)
        else:
            timeout = None
        for key, mask in self._sel.select(timeout):
            data = key.data
            if data is _LISTEN:
                self._accept()
            elif data is _WAKE:
                with contextlib.suppress(OSError):
                    self._wake_r.recv(4096)
            else:
                conn: _Conn = data
                if mask & selectors.EVENT_WRITE:
                    self._flush(conn)
                if mask & selectors.EVENT_READ and not conn.closed:
                    self._on_read(conn)
        if self._timers:
            self._fire_timers()
        while self._resume:
            conn = self._resume.popleft()
            if not conn.closed:
                self._process(conn)
        if self._dirty:
            dirty = list(self._dirty)
            self._dirty.clear()
            for conn in dirty:
                self._flush(conn)

    # --- connections ----------------------------------------------------------------
    def _accept(self) -> None:
        while True:
            try:
                sock, addr = accept(self._listener)  # out of descriptors, it raises the soft limit first
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:  # e.g. EMFILE at the hard limit: keep serving the connections we have
                # The pending connection stays queued, so the listener stays readable: stop
                # watching it for a moment instead of spinning on failed accepts.
                now = time.monotonic()
                if now - self._accept_warned > 60.0:  # once a minute, not ten times a second
                    self._accept_warned = now
                    hint = ""
                    if exc.errno == errno.EMFILE:
                        hint = f"; this process serves {len(self._conns)} clients and is at {limits_text()}"
                    _log.warning("hpcdist store server: accept failed: %s%s; pausing accepts briefly", exc, hint)
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self._sel.unregister(self._listener)
                self._push_timer(time.monotonic() + _ACCEPT_PAUSE, _LISTEN)
                return
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                keepalive(sock, self._keepalive_s)  # a client's host gone silent: its connection ends, its waits too
            conn = _Conn(sock, f"{addr[0]}:{addr[1]}" if isinstance(addr, tuple) else str(addr))
            self._conns.add(conn)
            self._sel.register(sock, selectors.EVENT_READ, conn)
            conn.snonce = new_nonce()
            flags = bytes([P.FLAG_AUTH if self._secret is not None else 0])
            self._reply(conn, P.OP_HELLO, [P.MAGIC, flags, conn.snonce])
            self._push_timer(time.monotonic() + self._auth_timeout, conn)

    def _drop(self, conn: _Conn, why: str | None) -> None:
        if conn.closed:
            return
        conn.closed = True
        if why:
            _log.info("hpcdist store server: dropping connection from %s: %s", conn.peer, why)
        self._conns.discard(conn)
        with contextlib.suppress(KeyError, ValueError, OSError):
            self._sel.unregister(conn.sock)
        with contextlib.suppress(OSError):
            conn.sock.close()
        w = conn.waiter
        if w is not None:
            self._cancel(w)
        conn.buf = bytearray()
        conn.big = None
        conn.out.clear()
        self._dirty.pop(conn, None)

    def _on_read(self, conn: _Conn) -> None:
        try:
            if conn.big is not None:
                view = memoryview(conn.big)
                n = conn.sock.recv_into(view[conn.big_fill :])
                view.release()
                if n == 0:
                    self._drop(conn, "peer closed the connection in the middle of a frame")
                    return
                conn.big_fill += n
                if conn.big_fill < len(conn.big):
                    return
                body = conn.big
                conn.big = None
                self._frame(conn, body)
                self._process(conn)
                return
            data = conn.sock.recv(_RECV)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._drop(conn, f"receive failed: {exc}")
            return
        if not data:
            self._drop(conn, None)
            return
        conn.buf += data
        limit = self._max_frame + 64 if conn.authed else 4 * P.PREAUTH_MAX_FRAME
        if len(conn.buf) > limit:
            self._drop(conn, "too much unprocessed input")
            return
        self._process(conn)

    def _process(self, conn: _Conn) -> None:
        """Handle the complete frames buffered on ``conn`` (until it parks or stalls)."""
        buf = conn.buf
        pos = 0
        unpack = P.LEN.unpack_from
        while not (conn.waiter or conn.closed or conn.closing or conn.big is not None):
            if conn.out_bytes > _OUT_HIGH:
                conn.stalled = True
                break
            avail = len(buf) - pos
            if avail < 4:
                break
            (n,) = unpack(buf, pos)
            cap = self._max_frame if conn.authed else P.PREAUTH_MAX_FRAME
            if n < 1 or n > cap:
                self._drop(conn, f"frame of {n} bytes outside 1..{cap}")
                return
            if avail < 4 + n:
                if n >= _BIG:  # receive the rest in place instead of through the buffer
                    big = bytearray(n)
                    have = avail - 4
                    big[:have] = buf[pos + 4 :]
                    conn.big = big
                    conn.big_fill = have
                    pos = len(buf)
                break
            body = buf[pos + 4 : pos + 4 + n]
            pos += 4 + n
            self._frame(conn, body)
        if conn.closed:
            return
        if pos:
            del buf[:pos]

    def _frame(self, conn: _Conn, body: bytearray) -> None:
        op = body[0]
        try:
            with memoryview(body) as mv:
                args = P.split_args(mv)
            if not conn.authed:
                self._auth(conn, op, args)
                return
            handler = self._handlers.get(op)
            if handler is None:
                raise P.ProtocolError(f"unknown opcode {op}")
            handler(conn, args)
        except (P.ProtocolError, ValueError, IndexError) as exc:
            self._drop(conn, f"malformed request: {exc}")
        except Exception:  # a bug must cost one connection, never the server
            _log.exception("hpcdist store server: error serving %s; dropping the connection", conn.peer)
            self._drop(conn, None)

    def _auth(self, conn: _Conn, op: int, args: list[bytes]) -> None:
        if op != P.OP_AUTH or len(args) != 2 or len(args[0]) != NONCE_BYTES:
            raise P.ProtocolError("expected an AUTH frame")
        cnonce, mac = args
        if self._secret is None:
            proof = b""
        else:
            expected = client_proof(self._secret, conn.snonce, cnonce)
            if not hmac.compare_digest(mac, expected):
                _log.warning(
                    "hpcdist store server: refused %s: authentication failed (wrong or missing secret)", conn.peer
                )
                self._reply(conn, P.ST_AUTH_FAILED, [b"authentication failed: wrong or missing store secret"])
                conn.closing = True
                return
            proof = server_proof(self._secret, conn.snonce, cnonce)
        conn.authed = True
        self._reply(conn, P.ST_OK, [proof])

    # --- output ---------------------------------------------------------------------
    def _reply(self, conn: _Conn, status: int, parts: list[bytes]) -> None:
        if conn.closed:
            return
        for piece in P.encode(status, parts):
            conn.out.append(piece)
            conn.out_bytes += len(piece)
        self._dirty[conn] = None

    def _flush(self, conn: _Conn) -> None:
        if conn.closed:
            return
        out = conn.out
        sock = conn.sock
        try:
            while out:
                first = out[0]
                sent = sock.send(first)
                conn.out_bytes -= sent
                if sent == len(first):
                    out.popleft()
                else:
                    out[0] = memoryview(first)[sent:]
                    break
        except (BlockingIOError, InterruptedError):
            pass
        except OSError as exc:
            self._drop(conn, f"send failed: {exc}")
            return
        if not out and conn.closing:
            self._drop(conn, None)
            return
        want = selectors.EVENT_READ | (selectors.EVENT_WRITE if out else 0)
        if want != conn.events:
            conn.events = want
            self._sel.modify(sock, want, conn)
        if conn.stalled and conn.out_bytes <= _OUT_HIGH:
            conn.stalled = False
            self._resume.append(conn)

    # --- timers and waiters -----------------------------------------------------------
    def _push_timer(self, deadline: float, obj: object) -> None:
        heapq.heappush(self._timers, (deadline, next(self._seq), obj))

    def _fire_timers(self) -> None:
        now = time.monotonic()
        timers = self._timers
        while timers and timers[0][0] <= now:
            _, _, obj = heapq.heappop(timers)
            if isinstance(obj, _Waiter):
                if not obj.done:
                    self._cancel(obj)
                    if obj.op == P.OP_WAIT_JOINED:
                        missing = [str(self._joined).encode()]
                    else:
                        missing = self._state.missing(obj.keys) if obj.op != P.OP_QUEUE_POP else obj.keys
                    self._finish(obj, P.ST_TIMEOUT, missing)
            elif isinstance(obj, _Conn) and not obj.authed and not obj.closed:
                self._drop(obj, "did not authenticate in time")
            elif obj is _LISTEN:
                with contextlib.suppress(KeyError, ValueError, OSError):
                    self._sel.register(self._listener, selectors.EVENT_READ, _LISTEN)

    def _park(self, conn: _Conn, op: int, keys: list[bytes], timeout: float, n: int = 0) -> None:
        w = _Waiter(conn, op, keys, n)
        conn.waiter = w
        self._push_timer(time.monotonic() + timeout, w)
        if op == P.OP_QUEUE_POP:
            self._qwait.setdefault(keys[0], deque()).append(w)
        elif op == P.OP_WAIT_JOINED:
            self._jwait.append(w)
        else:
            self._register(w)

    def _register(self, w: _Waiter) -> None:
        """Register ``w`` under the first key it misses; False when it misses none."""
        data = self._state.data
        for k in w.keys:
            if k not in data:
                w.reg = k
                self._kwait.setdefault(k, []).append(w)
                return
        w.reg = None
        self._complete(w)

    def _complete(self, w: _Waiter) -> None:
        data = self._state.data
        if w.op == P.OP_GET:
            self._finish(w, P.ST_OK, [data[w.keys[0]]])
        elif w.op == P.OP_MULTI_GET:
            self._reply_values(w.conn, [data[k] for k in w.keys], w)
        else:
            self._finish(w, P.ST_OK, [])

    def _cancel(self, w: _Waiter) -> None:
        w.done = True
        if w.reg is not None:
            lst = self._kwait.get(w.reg)
            if lst is not None:
                with contextlib.suppress(ValueError):
                    lst.remove(w)
                if not lst:
                    del self._kwait[w.reg]
            w.reg = None
        elif w.op == P.OP_QUEUE_POP:
            dq = self._qwait.get(w.keys[0])
            if dq is not None:
                with contextlib.suppress(ValueError):
                    dq.remove(w)
                if not dq:
                    del self._qwait[w.keys[0]]
        elif w.op == P.OP_WAIT_JOINED:
            with contextlib.suppress(ValueError):
                self._jwait.remove(w)

    def _finish(self, w: _Waiter, status: int, parts: list[bytes]) -> None:
        w.done = True
        conn = w.conn
        conn.waiter = None
        self._reply(conn, status, parts)
        self._resume.append(conn)

    def _notify(self, key: bytes) -> None:
        lst = self._kwait.pop(key, None)
        if lst:
            for w in lst:
                if not w.done:
                    self._register(w)

    def _notify_queue(self, key: bytes) -> None:
        dq = self._qwait.get(key)
        if not dq:
            return
        state = self._state
        while dq and state.queue_len(key):
            w = dq.popleft()
            if not w.done:
                value = state.queue_pop(key)
                assert value is not None
                self._finish(w, P.ST_OK, [value])
        if not dq:
            del self._qwait[key]
