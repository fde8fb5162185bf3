"""Sockets of the servers that rank 0 runs for every rank (the TCP store, liveness): descriptors, accept queue,
keepalive.

A job's rank 0 holds a connection from each rank to its store server (two:
the rank's store and its flight-recorder watcher) and, in a launcher-free
world, one liveness connection each: about three descriptors per rank. The
soft ``RLIMIT_NOFILE`` many systems start processes with is 1024, so a job
of a few hundred ranks ran rank 0 out of descriptors. Those servers accept
with :func:`accept`: where ``accept`` fails with ``EMFILE`` it raises the
soft limit (:func:`more_descriptors`) and tries again, as Go's runtime raises
its soft limit to the hard one at start; only where the hard limit is reached
does the error reach the server, which reports it with :func:`limits_text`.

Every rank connects to those servers at about the same moment, so they listen
with a deep accept queue (:data:`LISTEN_BACKLOG`): with the usual 128, the
connections past the 129th saw their SYN dropped and retried it one, three,
seven seconds later.

Those connections live as long as the job, idle for hours or days, so they
have the kernel probe an idle peer (:func:`keepalive`, ``HPCDIST_KEEPALIVE``):
a host that died or was cut off sends no FIN, and without probes its
connections looked open for good; and stateful firewalls and NAT tables
(conntrack keeps an idle connection 5 days by default, cloud NATs minutes)
drop the entry of a connection idle past their limit.

``resource`` is imported with this module, not when descriptors run out: by
then importing it (opening its extension module) fails with ``EMFILE`` too.
"""

from __future__ import annotations

import errno
import logging
import socket
from typing import Any

try:
    import resource
except ImportError:  # pragma: no cover - not POSIX
    resource = None  # type: ignore[assignment]

__all__ = [
    "LISTEN_BACKLOG",
    "UNLIMITED",
    "accept",
    "at_least",
    "keepalive",
    "limits",
    "limits_text",
    "more_descriptors",
]

#: what :func:`limits` gives for no limit (``resource.RLIM_INFINITY``)
UNLIMITED: int = -1 if resource is None else resource.RLIM_INFINITY

#: the accept queue of rank 0's servers (the kernel caps it at ``net.core.somaxconn``, 4096 by default since Linux 5.4)
LISTEN_BACKLOG = 4096

_CAP = 1 << 20  # the kernel's default fs.nr_open: a soft limit above it is refused
_log = logging.getLogger("hpcdist")


def limits() -> tuple[int, int] | None:
    """This process's (soft, hard) ``RLIMIT_NOFILE`` (:data:`UNLIMITED` for no limit); None off POSIX."""
    return None if resource is None else resource.getrlimit(resource.RLIMIT_NOFILE)


def more_descriptors() -> tuple[int, int] | None:
    """Double this process's soft ``RLIMIT_NOFILE``, up to its hard limit.

    Returns ``(old, new)``, or None where the soft limit is already at the hard
    one (or the platform has no such limit, or the kernel refuses).
    """
    now = limits()
    if now is None or now[0] == UNLIMITED:  # no limit to raise (or not POSIX)
        return None
    return at_least(max(2 * now[0], now[0] + 64))


def at_least(need: int) -> tuple[int, int] | None:
    """Raise this process's soft ``RLIMIT_NOFILE`` to ``need`` where it is lower, up to its hard limit (never
    lowering it). Returns ``(old, new)``, or None where nothing changed (already enough, at the hard limit, no
    such limit, or the kernel refuses). Child processes inherit the new limit."""
    now = limits()
    if now is None:  # pragma: no cover - not POSIX
        return None
    soft, hard = now
    cap = _CAP if hard == UNLIMITED else min(hard, _CAP)
    new = min(cap, need)
    if soft == UNLIMITED or soft >= new:
        return None
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    except (ValueError, OSError):
        return None
    _log.info("hpcdist: raised the soft RLIMIT_NOFILE from %d to %d (hard limit %d)", soft, new, hard)
    return soft, new


def accept(listener: socket.socket) -> tuple[socket.socket, Any]:
    """``listener.accept()``. Where it fails for want of descriptors (``EMFILE``), the soft limit is raised
    (:func:`more_descriptors`) and it is tried again; at the hard limit, as for any other error, the error is
    raised."""
    while True:
        try:
            return listener.accept()
        except OSError as exc:
            if exc.errno != errno.EMFILE or more_descriptors() is None:
                raise


def limits_text() -> str:
    """The open-file limits of this process, and what to do about them, for an error message."""
    now = limits()
    if now is None:  # pragma: no cover - not POSIX
        return "its open-file limit"
    soft, hard = now
    return (
        f"its open-file limit (RLIMIT_NOFILE soft {soft}, hard {hard}): raise the hard limit where the job starts "
        "(`ulimit -n` in the job script, `LimitNOFILE` of the service, or limits.conf)"
    )


def keepalive(sock: socket.socket, seconds: int) -> None:
    """Have the kernel probe ``sock``'s peer after ``seconds / 2`` idle, and end the connection when three probes in
    the other half go unanswered (the next call on it fails with ``ETIMEDOUT``); ``seconds`` 0: the OS's default,
    no probes (``HPCDIST_KEEPALIVE``). OSError if the socket is closed."""
    if seconds <= 0:
        return
    idle = max(1, seconds // 2)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", idle), ("TCP_KEEPINTVL", max(1, (seconds - idle) // 3)), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):  # Linux; macOS names the first TCP_KEEPALIVE
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)
