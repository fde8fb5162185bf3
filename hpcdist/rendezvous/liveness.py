"""Fail fast when a peer of a launcher-free world dies.

Under ``mpiexec``/``srun`` the launcher ends the job when a rank dies. A
world joined over MPI ports (``env://``, ``tcp://``, ``file://``,
``store=``) has no launcher: without help, the survivors would wait in their
next collective for the full timeout. torch's gloo notices the closed
connection within about a second; hpcdist does the same with one plain TCP
connection per rank to rank 0, set up at init through the rendezvous store:

* a rank that leaves properly (``destroy_process_group``, or a normal
  interpreter exit) first sends a goodbye byte;
* a connection that closes without one belongs to a rank that was killed or
  crashed: rank 0 tells every other rank which one, and each process prints
  ``hpcdist: rank K ... died`` and ends itself (``MPI_Abort``), as a launcher
  would end the job. When rank 0 itself dies, the others see their
  connection close and end likewise, naming rank 0;
* a host that dies, hangs or is cut off closes nothing: the kernel probes
  idle connections (TCP keepalive, ``HPCDIST_KEEPALIVE`` seconds, default
  120) and ends one whose peer answers none of the probes; that counts as
  the peer's death, named as such. (The probes also keep a firewall's or
  NAT's entry of the connection from expiring over a long job.)

Nothing but the kernel's probes is sent while everyone is alive; the cost is
one idle socket per rank and one daemon thread per process.
"""

from __future__ import annotations

import atexit
import errno
import selectors
import socket
import struct
import threading
from datetime import timedelta
from typing import Any

from hpcdist._descriptors import LISTEN_BACKLOG, accept, keepalive, limits_text
from hpcdist._ranklist import MESSAGE_LIMIT, ranks_text
from hpcdist.config import keepalive_seconds
from hpcdist.errors import DistNetworkError, DistTimeoutError

__all__ = ["Liveness"]

_BYE = b"B"  # the sender leaves properly
_DEAD = b"D"  # rank 0 -> others: followed by the dead rank (4 bytes)
_HELLO = struct.Struct("!i")


class Liveness:
    """This process's side of the liveness connections (see module docstring)."""

    def __init__(self, store: Any, rank: int, size: int, timeout: timedelta, host: str) -> None:
        self.rank, self.size = rank, size
        self._leaving = False
        self._lock = threading.Lock()
        self._peers: dict[socket.socket, int] = {}
        self._keepalive = keepalive_seconds()
        epoch = store.add(f"hpcdist/liveness/epoch/{rank}", 1)  # the n-th init of every rank meets the n-th key
        key = f"hpcdist/liveness/{epoch}"
        limit = timeout.total_seconds()
        if rank == 0:
            server = socket.create_server((host, 0), family=_family(host), backlog=LISTEN_BACKLOG)
            server.settimeout(limit)
            store.set(key, f"{host}:{server.getsockname()[1]}")
            try:
                for _ in range(size - 1):
                    conn = accept(server)[0]  # out of descriptors, it raises the soft limit first
                    keepalive(conn, self._keepalive)
                    conn.settimeout(limit)
                    (peer,) = _HELLO.unpack(_recv_exactly(conn, _HELLO.size))
                    conn.settimeout(None)
                    self._peers[conn] = peer
            except (OSError, struct.error) as exc:  # a socket timeout is an OSError too
                missing = sorted(set(range(1, size)) - set(self._peers.values()))
                self._close_all()
                if isinstance(exc, OSError) and exc.errno == errno.EMFILE:
                    raise DistNetworkError(
                        f"init_process_group: rank 0 ran out of file descriptors after accepting the liveness "
                        f"connections of {size - 1 - len(missing)} of {size - 1} ranks, at {limits_text()}"
                    ) from None
                raise DistTimeoutError(
                    f"init_process_group: rank(s) {ranks_text(missing, MESSAGE_LIMIT)} of this launcher-free world "
                    f"did not open their liveness connection to rank 0 within {limit:g} s "
                    f"({type(exc).__name__}: {exc}); they ended or hung right after joining: see their output"
                ) from None
            finally:
                server.close()
        else:
            store.wait([key], timeout)
            addr, port = store.get(key).decode().rsplit(":", 1)
            try:
                conn = socket.create_connection((addr, int(port)), timeout=limit)
                keepalive(conn, self._keepalive)
                conn.sendall(_HELLO.pack(rank))
            except OSError as exc:
                raise DistNetworkError(
                    f"init_process_group: rank {rank} could not open its liveness connection to rank 0 at "
                    f"{addr}:{port} ({type(exc).__name__}: {exc}); rank 0 ended or hung right after joining, "
                    "or a firewall between the hosts drops the connection"
                ) from None
            conn.settimeout(None)
            self._peers[conn] = 0
        atexit.register(self.leave)
        threading.Thread(target=self._watch, name="hpcdist-liveness", daemon=True).start()

    def _close_all(self) -> None:
        for conn in self._peers:
            conn.close()
        self._peers.clear()

    def leave(self) -> None:
        """Say goodbye on every connection and close them (destroy_process_group, interpreter exit)."""
        with self._lock:
            if self._leaving:
                return
            self._leaving = True
            for conn in list(self._peers):
                try:
                    conn.sendall(_BYE)
                    conn.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
        atexit.unregister(self.leave)

    def _watch(self) -> None:
        sel = selectors.DefaultSelector()
        for sock in self._peers:
            sel.register(sock, selectors.EVENT_READ)
        while self._peers:
            for key, _ in sel.select():
                conn: Any = key.fileobj
                peer = self._peers[conn]
                silent = False
                try:
                    data = conn.recv(1)
                except OSError as exc:
                    data, silent = b"", exc.errno == errno.ETIMEDOUT
                if data == _DEAD:
                    try:
                        dead = _HELLO.unpack(_recv_exactly(conn, _HELLO.size))[0]
                    except OSError:  # ConnectionError too: rank 0 ended while it sent the notice's 5 bytes
                        self._died(
                            peer,
                            f"its connection to rank {self.rank} closed in the middle of a death notice: it ended "
                            "while reporting the death of another rank",
                        )
                    else:
                        self._died(dead, f"rank 0 reports that rank {dead} closed its connection without leaving")
                elif data == _BYE or self._leaving:
                    sel.unregister(conn)
                    del self._peers[conn]
                    conn.close()
                elif silent:  # no FIN, and no answer to the keepalive probes
                    self._died(
                        peer,
                        f"its host answered none of the keepalive probes on its connection to rank {self.rank} for "
                        f"about {self._keepalive} s (HPCDIST_KEEPALIVE): the host is down, hung or cut off from the "
                        "network",
                    )
                else:  # EOF without a goodbye
                    self._died(
                        peer,
                        f"its connection to rank {self.rank} closed without a goodbye: killed, crashed or ended by "
                        "os._exit",
                    )

    def _died(self, dead: int, how: str) -> None:
        if self._leaving:
            return
        if self.rank == 0:
            for conn in list(self._peers):
                try:
                    conn.sendall(_DEAD + _HELLO.pack(dead))
                except OSError:
                    pass
        from hpcdist._watchdog import abort_job

        abort_job(
            f"hpcdist: rank {dead} of this launcher-free world of {self.size} died ({how}); ending rank "
            f"{self.rank} too, as a launcher would end the job\n",
            1,
        )


def _family(host: str) -> socket.AddressFamily:
    """The address family ``host`` resolves to first (as the TCP store binds it): IPv6 hosts such as ``::1`` too."""
    try:
        return socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]
    except OSError:
        return socket.AF_INET  # create_server then names the host in its error


def _recv_exactly(conn: socket.socket, n: int) -> bytes:
    out = b""
    while len(out) < n:
        chunk = conn.recv(n - len(out))
        if not chunk:
            raise ConnectionError("liveness: the peer closed the connection during the handshake")
        out += chunk
    return out
