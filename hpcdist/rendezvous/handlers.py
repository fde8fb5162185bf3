"""The built-in rendezvous handlers: ``env://``, ``tcp://``, ``file://``, ``mpi://``.

Each is a generator function ``handler(url, timeout=...)`` yielding
``(store, rank, world_size)`` once, as torch's. Every field is parsed and
checked (ValueError naming it) before a store is created, so a typo fails
at once instead of after the timeout.

SPMD contract of ``env://`` and ``tcp://``: every process of the job calls
with the same host and port; rank 0 serves the TCP store there, the others
connect to it (they retry until ``timeout`` while rank 0 is starting up).
``file://``: every process names the same file on a file system they all
see. ``mpi://``: every rank of an MPI launch calls (collective over
``COMM_WORLD``).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlparse

from hpcdist.errors import DistNetworkError, DistTimeoutError
from hpcdist.rendezvous.fields import (
    check_port,
    check_rank_world,
    parse_int,
    query_to_dict,
    resolve_host,
)
from hpcdist.rendezvous.registry import register_rendezvous_handler

if TYPE_CHECKING:
    from hpcdist.store import Store

__all__ = ["DEFAULT_RENDEZVOUS_TIMEOUT", "make_tcp_store"]

#: torch's default process-group timeout, used when a handler gets none.
DEFAULT_RENDEZVOUS_TIMEOUT = timedelta(minutes=30)

_Yield = Iterator[tuple["Store", int, int]]


def _required(query: dict[str, str], name: str, *, scheme: str, hint: str) -> int:
    if name not in query or not query[name].strip():
        raise ValueError(f"{scheme}:// rendezvous: {name} parameter missing; {hint}")
    return parse_int(query[name], field=name, where=f"the {scheme}:// URL query")


def make_tcp_store(
    host: str, port: int, rank: int, world_size: int, timeout: timedelta, *, scheme: str, secret: str | None = None
) -> Store:
    """Rank 0 serves a TCP store on ``host:port``; the others connect to it.

    The server does not wait for the clients here (the port rendezvous counts
    who arrived and says so on timeout). A client that cannot reach the
    server within ``timeout`` raises DistTimeoutError saying to check rank 0.
    """
    from hpcdist.store import TCPStore

    try:
        return TCPStore(
            host,
            port,
            world_size,
            rank == 0,
            timeout,
            wait_for_workers=False,
            multi_tenant=True,
            secret=secret,
        )
    except (DistTimeoutError, DistNetworkError, TimeoutError, ConnectionError) as exc:
        if rank == 0:
            if isinstance(exc, DistNetworkError) and "already in use" in str(exc):
                raise DistNetworkError(
                    f"{scheme}:// rendezvous: rank 0 cannot serve the store at {host}:{port}: the port is already in "
                    f"use. Either another process of this job was also given rank 0 (rank 0 is claimed twice: "
                    f"give every process a distinct RANK 0..{world_size - 1}), or another program holds the port "
                    f"(choose another MASTER_PORT)"
                ) from exc
            raise
        raise DistTimeoutError(
            f"{scheme}:// rendezvous: rank {rank} could not reach the store of rank 0 at {host}:{port} "
            f"within {timeout.total_seconds():g} s ({exc}); check that rank 0 runs and that "
            f"MASTER_ADDR/MASTER_PORT (or the tcp:// URL) name its host and a port it can listen on"
        ) from exc


def _env_handler(url: str, timeout: timedelta = DEFAULT_RENDEZVOUS_TIMEOUT, **kwargs: object) -> _Yield:
    """``env://``: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE (URL query wins for rank/world_size)."""

    def from_env(name: str) -> str:
        value = os.environ.get(name, "").strip()
        if not value:
            raise ValueError(f"env:// rendezvous: environment variable {name} expected, but not set; {hints[name]}")
        return value

    hints = {
        "RANK": "export RANK=<this process's rank, 0..WORLD_SIZE-1> or pass rank=",
        "WORLD_SIZE": "export WORLD_SIZE=<number of processes> or pass world_size=",
        "MASTER_ADDR": "export MASTER_ADDR=<host name or IP of rank 0>, e.g. 127.0.0.1 on one machine",
        "MASTER_PORT": "export MASTER_PORT=<a free TCP port on rank 0's host>, e.g. 29500",
    }
    query = query_to_dict(urlparse(url).query, scheme="env")
    rank = _from_query_or_env(query, "rank", "RANK", from_env)
    world_size = _from_query_or_env(query, "world_size", "WORLD_SIZE", from_env)
    check_rank_world(rank, world_size, scheme="env")
    addr = resolve_host(from_env("MASTER_ADDR"), field="MASTER_ADDR", scheme="env")
    port = parse_int(from_env("MASTER_PORT"), field="MASTER_PORT", where="environment variable MASTER_PORT")
    check_port(port, field="MASTER_PORT", scheme="env")
    yield make_tcp_store(addr, port, rank, world_size, timeout, scheme="env"), rank, world_size
    raise RuntimeError("Unable to perform re-rendezvous using env:// method")


def _from_query_or_env(query: dict[str, str], name: str, env: str, from_env) -> int:  # type: ignore[no-untyped-def]
    if name in query:
        return parse_int(query[name], field=name, where="the env:// URL query")
    return parse_int(from_env(env), field=env, where=f"environment variable {env}")


def _tcp_handler(url: str, timeout: timedelta = DEFAULT_RENDEZVOUS_TIMEOUT, **kwargs: object) -> _Yield:
    """``tcp://host:port?rank=R&world_size=N``."""
    result = urlparse(url)
    try:
        port_value = result.port
    except ValueError:
        raise ValueError(
            f"tcp:// rendezvous: port in {url!r} is not a number in 0..65535; write tcp://host:port"
        ) from None
    if port_value is None:
        raise ValueError(
            f"tcp:// rendezvous: port number missing in {url!r}; write tcp://host:port, e.g. tcp://127.0.0.1:29500"
        )
    if not result.hostname:
        raise ValueError(
            f"tcp:// rendezvous: host missing in {url!r}; write tcp://host:port, e.g. tcp://127.0.0.1:29500"
        )
    query = query_to_dict(result.query, scheme="tcp")
    rank = _required(query, "rank", scheme="tcp", hint="add ?rank=R to the URL or pass rank=")
    world_size = _required(query, "world_size", scheme="tcp", hint="add &world_size=N to the URL or pass world_size=")
    check_rank_world(rank, world_size, scheme="tcp")
    host = resolve_host(result.hostname, field="host", scheme="tcp")
    check_port(port_value, field="port", scheme="tcp")
    yield make_tcp_store(host, port_value, rank, world_size, timeout, scheme="tcp"), rank, world_size
    raise RuntimeError("Unable to perform re-rendezvous using tcp:// method")


def _file_handler(url: str, **kwargs: object) -> _Yield:
    """``file:///path/to/file?rank=R&world_size=N``: a FileStore every process can reach."""
    from hpcdist.store import FileStore

    result = urlparse(url)
    path = unquote(result.netloc + result.path) if result.netloc not in ("", "localhost") else unquote(result.path)
    if not path:
        raise ValueError(f"file:// rendezvous: path missing in {url!r}; write file:///absolute/path/to/file")
    query = query_to_dict(result.query, scheme="file")
    rank = _required(query, "rank", scheme="file", hint="add ?rank=R to the URL or pass rank=")
    world_size = _required(query, "world_size", scheme="file", hint="add &world_size=N to the URL or pass world_size=")
    check_rank_world(rank, world_size, scheme="file")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise ValueError(f"file:// rendezvous: directory {parent!r} of path {path!r} does not exist; create it first")
    yield FileStore(path, world_size), rank, world_size
    raise RuntimeError("Unable to perform re-rendezvous using file:// method")


def _mpi_handler(url: str, timeout: timedelta = DEFAULT_RENDEZVOUS_TIMEOUT, **kwargs: object) -> _Yield:
    """``mpi://``: rank and size of ``COMM_WORLD``; the store is the group store over it.

    Collective over ``COMM_WORLD``: every rank must call it.
    """
    from mpi4py import MPI

    from hpcdist.rendezvous.group_store import group_store

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    query = query_to_dict(urlparse(url).query, scheme="mpi")
    given = {
        k: parse_int(query[k], field=k, where="the mpi:// URL query") for k in ("rank", "world_size") if k in query
    }
    if given.get("world_size", -1) in (0, -1) and given.get("rank", 0) in (0, -1):
        given = {}  # the tutorial's rank=0, world_size=0: "take them from MPI"
    for name, truth in (("rank", rank), ("world_size", size)):
        if name in given and given[name] != truth:
            raise ValueError(f"mpi:// rendezvous: {name}={given[name]} contradicts MPI's COMM_WORLD {name} {truth}")
    yield group_store(comm, timeout), rank, size
    raise RuntimeError("Unable to perform re-rendezvous using mpi:// method")


register_rendezvous_handler("env", _env_handler)
register_rendezvous_handler("tcp", _tcp_handler)
register_rendezvous_handler("file", _file_handler)
register_rendezvous_handler("mpi", _mpi_handler)
