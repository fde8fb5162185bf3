"""A TCP store for a group that MPI already connects, with no port picked by hand.

Rank 0 serves a :class:`~hpcdist.store.TCPStore` on a free port (port 0),
bound to loopback when every rank shares its node, else to its host's
address; it creates a per-job secret and broadcasts host, port and secret
over the communicator. The other ranks connect as authenticated clients.
The secret never leaves the MPI job.
"""

from __future__ import annotations

import ipaddress
import os
import secrets
import socket
from datetime import timedelta
from typing import TYPE_CHECKING

from hpcdist._timed import INIT_HINT, timed_bcast_json
from hpcdist.errors import DistStoreError

if TYPE_CHECKING:
    from mpi4py import MPI

    from hpcdist.store import Store

__all__ = ["all_on_one_node", "group_store", "host_address"]

LOOPBACK = "127.0.0.1"


def all_on_one_node(comm: MPI.Intracomm, timeout: timedelta) -> bool:
    """True when every rank of ``comm`` shares one node (collective over ``comm``, bounded by ``timeout``).

    By :func:`hpcdist.topology.node_identity`, not ``Split_type`` alone: in a
    world joined without a launcher MPI may call two hosts one node, and a
    store bound to loopback would be out of the other host's reach.
    """
    from hpcdist.topology import node_layout

    return len(set(node_layout(comm, timeout.total_seconds()))) == 1


def host_address() -> str:
    """An address of this host that other nodes can reach.

    ``MASTER_ADDR`` when set; else the host name's first non-loopback address;
    else the address of the interface that routes off the host; else the
    host name itself.
    """
    given = os.environ.get("MASTER_ADDR", "").strip()
    if given:
        return given
    name = socket.gethostname()
    try:
        for *_, sockaddr in socket.getaddrinfo(name, None, type=socket.SOCK_STREAM):
            addr = str(sockaddr[0])
            if not ipaddress.ip_address(addr.split("%")[0]).is_loopback:
                return addr
    except (OSError, ValueError):
        pass
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent for a UDP connect
            addr = str(probe.getsockname()[0])
            if not ipaddress.ip_address(addr).is_loopback:
                return addr
    except OSError:
        pass
    return name


def group_store(comm: MPI.Intracomm, timeout: timedelta) -> Store:
    """A TCP store shared by the ranks of ``comm``.

    SPMD: collective over ``comm``; every rank must call it (a rank that does
    not makes the others raise DistTimeoutError after ``timeout``). Rank 0 serves the store
    for as long as its store object lives. Raises DistStoreError on every
    rank when rank 0 could not start the server.
    """
    from hpcdist.store import TCPStore

    rank, size = comm.Get_rank(), comm.Get_size()
    local = all_on_one_node(comm, timeout)
    server: Store | None = None
    if rank == 0:
        try:
            host = LOOPBACK if local else host_address()
            secret = secrets.token_hex(32)
            server = TCPStore(host, 0, size, True, timeout, wait_for_workers=False, secret=secret)
            payload: tuple[str, str, int, str] = ("ok", host, int(server.port), secret)
        except Exception as exc:  # handed to every rank, re-raised below
            payload = ("error", f"{type(exc).__name__}: {exc}", 0, "")
    else:
        payload = ("", "", 0, "")
    what = "init_process_group (group store)"
    status, host, port, secret = timed_bcast_json(comm, payload, 0, timeout.total_seconds(), what, INIT_HINT)
    if status != "ok":
        raise DistStoreError(f"group store: rank 0 could not start the TCP store server: {host}")
    if server is not None:
        return server
    return TCPStore(host, port, size, False, timeout, secret=secret)
