"""``join_world``: the one entry point ``init_process_group`` calls.

Two ways in, decided by how the processes were started:

* **Under an MPI launcher** (``COMM_WORLD`` has more than one rank, or a
  launcher's variables are set): ``COMM_WORLD`` is the world. ``init_method``
  ``None``, ``mpi://``, ``env://``, ``tcp://`` and ``file://`` are all
  accepted; whatever rank and world size the user gave (arguments, the URL
  query, ``RANK``/``WORLD_SIZE``) must agree with MPI's, checked on every
  rank and agreed over ``COMM_WORLD`` so that all ranks raise together.
  ``rank=0, world_size=0`` (or -1), the torch tutorial's call for the MPI
  backend, means "take them from MPI".
* **Without a launcher** (MPI singletons): the rendezvous named by
  ``init_method`` (default ``env://``, as torch) or the given ``store=``
  brings the processes together and :mod:`hpcdist.rendezvous.ports` builds
  one intracommunicator in rank order. A world of one needs no store.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING
from urllib.parse import urlparse

from hpcdist._timed import INIT_HINT, timed_allgather_json
from hpcdist.config import check_timeout
from hpcdist.errors import DistBackendError
from hpcdist.rendezvous import mpi_env
from hpcdist.rendezvous.detect import detect_launcher, launcher_rank_size
from hpcdist.rendezvous.fields import check_rank_world, check_rank_world_types, env_int, parse_int, query_to_dict
from hpcdist.rendezvous.init_guard import bounded_mpi_init
from hpcdist.rendezvous.ports import join_over_ports
from hpcdist.rendezvous.registry import registered_schemes, rendezvous, scheme_of

if TYPE_CHECKING:
    from mpi4py import MPI

    from hpcdist.store import Store

__all__ = ["Joined", "join_world", "stated_places"]

#: Schemes that, under an MPI launcher, are accepted for compatibility only:
#: COMM_WORLD is the world and no store is made from the URL.
_COMPAT_SCHEMES = frozenset({"mpi", "env", "tcp", "file"})


@dataclass
class Joined:
    """What :func:`join_world` hands to the core."""

    comm: MPI.Intracomm  #: in rank order; the core Dup()s it and never frees it
    store: Store | None  #: the rendezvous store if there was one, else None
    rank: int
    world_size: int
    launcher: str | None  #: e.g. "mpiexec", "srun"; None: joined via ports (or a lone process)


def join_world(
    init_method: str | None, *, store: Store | None, rank: int, world_size: int, timeout: timedelta
) -> Joined:
    """Bring this process into the world; return its communicator and store.

    SPMD: every process of the job calls it once, with the same
    ``init_method`` (or store) and its own rank. Under an MPI launcher it is
    collective over ``COMM_WORLD``. Without one it blocks until all
    ``world_size`` processes arrived or ``timeout`` passed
    (DistTimeoutError saying how many of how many joined).

    Raises ValueError naming the field for a missing or malformed rank,
    world size, host, port or URL, and for a rank/world size that
    contradicts the MPI launch; DistBackendError when the MPI cannot join
    independent processes (MPICH 5.0.x).
    """
    _check_types(init_method, rank, world_size, timeout)
    launcher = detect_launcher()
    if launcher is None:  # hpcdist starts MPI here: with its settings for launcher-free worlds
        mpi_env.apply()
    declared = None if launcher is None else launcher_rank_size()
    with bounded_mpi_init(timeout.total_seconds(), declared):
        from mpi4py import MPI  # MPI_Init: under a launcher it waits for every rank of the launch

    size = MPI.COMM_WORLD.Get_size()
    if size > 1:
        return _join_launched(init_method, store, rank, world_size, launcher or "mpi", timeout)
    if launcher is not None:
        if declared is None or declared[1] == 1:
            return _join_launched(init_method, store, rank, world_size, launcher, timeout)
        return _join_unwired(init_method, store, rank, world_size, launcher, declared, timeout)
    return _join_ports(init_method, store, rank, world_size, timeout, launcher=None)


def _check_types(init_method: object, rank: object, world_size: object, timeout: object) -> None:
    if init_method is not None and not isinstance(init_method, str):
        raise TypeError(f"init_method must be a URL string such as 'env://' or None, got {type(init_method).__name__}")
    check_rank_world_types(rank, world_size)
    check_timeout(timeout)


# --- under an MPI launcher --------------------------------------------------------------


def stated_places(init_method: str | None, rank: int, world_size: int) -> list[tuple[str, str, int]]:
    """``(field, source, value)`` for every rank/world size the user stated: arguments, ``RANK``/``WORLD_SIZE``,
    the URL query (the torch backend's env:// checks them against the launch too)."""
    out: list[tuple[str, str, int]] = []
    take_from_mpi = world_size in (0, -1) and rank in (0, -1)
    if not take_from_mpi:
        if rank >= 0:
            out.append(("rank", "the rank= argument", rank))
        if world_size >= 0:
            out.append(("world_size", "the world_size= argument", world_size))
    for field, env in (("rank", "RANK"), ("world_size", "WORLD_SIZE")):
        value = env_int(env)
        if value is not None:
            out.append((field, f"environment variable {env}", value))
    if init_method:
        query = query_to_dict(urlparse(init_method).query, scheme=scheme_of(init_method))
        for field in ("rank", "world_size"):
            if field in query:
                out.append(
                    (
                        field,
                        f"the init_method URL query {field}=",
                        parse_int(query[field], field=field, where=init_method),
                    )
                )
    return out


def _contradictions(init_method: str | None, rank: int, world_size: int, comm: MPI.Intracomm) -> str | None:
    try:
        truth = {"rank": comm.Get_rank(), "world_size": comm.Get_size()}
        for field, source, value in stated_places(init_method, rank, world_size):
            if value != truth[field]:
                return (
                    f"{field} {value} from {source} contradicts the MPI launch, where this process has "
                    f"{field} {truth[field]} (rank {truth['rank']} of {truth['world_size']}); the launcher decides "
                    f"rank and world size: drop the {field} setting or make it match"
                )
        if init_method is not None:
            scheme = scheme_of(init_method)
            if scheme not in registered_schemes():
                return f"init_method {init_method!r}: no rendezvous handler for {scheme}://"
    except ValueError as exc:
        return str(exc)
    return None


def _join_launched(
    init_method: str | None, store: Store | None, rank: int, world_size: int, launcher: str, timeout: timedelta
) -> Joined:
    """COMM_WORLD is the world; agree over it that the user's settings match."""
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    mine = _contradictions(init_method, rank, world_size, comm)
    everyone = [mine]
    if comm.Get_size() > 1:  # the first step that waits for the others: bounded by the timeout
        everyone = timed_allgather_json(comm, mine, timeout.total_seconds(), "init_process_group", INIT_HINT)
    if mine is not None:
        raise ValueError(mine)
    first = next(((r, m) for r, m in enumerate(everyone) if m is not None), None)
    if first is not None:
        raise ValueError(f"rank {first[0]} refused to join: {first[1]}")
    joined_store = store
    if store is None and init_method is not None and scheme_of(init_method) not in _COMPAT_SCHEMES:
        joined_store = _custom_store(init_method, comm.Get_rank(), comm.Get_size(), timeout)
    return Joined(comm, joined_store, comm.Get_rank(), comm.Get_size(), launcher)


def _custom_store(init_method: str, rank: int, size: int, timeout: timedelta) -> Store:
    """A third-party scheme under a launcher: its store, its rank/size checked against MPI's."""
    query = query_to_dict(urlparse(init_method).query, scheme=scheme_of(init_method))
    given_rank = -1 if "rank" in query else rank
    given_size = -1 if "world_size" in query else size
    got_store, got_rank, got_size = next(rendezvous(init_method, given_rank, given_size, timeout=timeout))
    if (got_rank, got_size) != (rank, size):
        raise ValueError(
            f"init_method {init_method!r} gave rank {got_rank} of {got_size}, but the MPI launch says "
            f"rank {rank} of {size}"
        )
    return got_store


def _join_unwired(
    init_method: str | None,
    store: Store | None,
    rank: int,
    world_size: int,
    launcher: str,
    declared: tuple[int, int],
    timeout: timedelta,
) -> Joined:
    """A launcher started N processes but MPI sees singletons (its PMI is not the MPI's).

    With a rendezvous to go by (``store=``, or an init_method other than
    ``mpi://``, or none but MASTER_ADDR/MASTER_PORT set: ``env://``) the
    processes join over ports, rank and size defaulting to the launcher's;
    otherwise nothing can bring them together.
    """
    if store is None and init_method is None and os.environ.get("MASTER_ADDR") and os.environ.get("MASTER_PORT"):
        init_method = "env://"
    if store is None and (init_method is None or scheme_of(init_method) == "mpi"):
        raise DistBackendError(
            f"launcher {launcher} started {declared[1]} processes, but MPI's COMM_WORLD has size 1 in each: "
            f"this MPI is not wired to {launcher} (e.g. srun without --mpi=pmi2/pmix for this MPI). Use the "
            f"MPI's own mpiexec, the matching srun --mpi= plugin, or init_method='env://' with MASTER_ADDR/"
            f"MASTER_PORT so the processes join over MPI ports"
        )
    if rank < 0 and env_int("RANK") is None:
        rank = declared[0]
    if world_size <= 0 and env_int("WORLD_SIZE") is None:
        world_size = declared[1]
    return _join_ports(init_method, store, rank, world_size, timeout, launcher=None)


# --- without a launcher -----------------------------------------------------------------


def _env_or(name: str, default: int) -> int:
    value = env_int(name)
    return default if value is None else value


def _lone_process(init_method: str | None, rank: int, world_size: int) -> bool:
    """No launcher, no rendezvous asked for, world of one (or unstated): a singleton."""
    if init_method is not None and scheme_of(init_method) != "mpi":
        return False
    size = world_size if world_size > 0 else env_int("WORLD_SIZE")
    me = rank if rank >= 0 else env_int("RANK")
    if init_method is not None and size not in (None, 1):
        raise ValueError(
            f"init_method {init_method!r} takes rank and size from an MPI launcher, but this process was not "
            f"started by one (COMM_WORLD has size 1) while world_size is {size}: start it with "
            f"'mpiexec -n {size} ...', or use init_method='env://' with MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE"
        )
    return size in (None, 1) and me in (None, 0)


def _join_ports(
    init_method: str | None,
    store: Store | None,
    rank: int,
    world_size: int,
    timeout: timedelta,
    *,
    launcher: str | None,
) -> Joined:
    from mpi4py import MPI

    if store is not None:
        rank = rank if rank >= 0 else _env_or("RANK", -1)
        world_size = world_size if world_size > 0 else _env_or("WORLD_SIZE", world_size)
        if rank < 0:
            raise ValueError("store= given without rank: pass rank= (or set RANK) for this process, 0..world_size-1")
        if world_size == -1:
            raise ValueError("store= given without world_size: pass world_size= (or set WORLD_SIZE)")
        check_rank_world(rank, world_size, scheme="store=")
        the_store = store
    elif _lone_process(init_method, rank, world_size):
        return Joined(MPI.COMM_WORLD, None, 0, 1, launcher)
    else:
        url = init_method or "env://"
        the_store, rank, world_size = next(rendezvous(url, rank, world_size, timeout=timeout))
        check_rank_world(rank, world_size, scheme=scheme_of(url))
    if world_size == 1:
        return Joined(MPI.COMM_WORLD, the_store, 0, 1, launcher)
    comm = join_over_ports(the_store, rank, world_size, timeout)
    return Joined(comm, the_store, rank, world_size, launcher)
