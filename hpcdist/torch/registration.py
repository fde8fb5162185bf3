"""Registering "hpcdist" with torch.distributed, and the ``mpi://`` rendezvous.

:func:`register` (run by ``import hpcdist.torch``, which torch itself imports at
``import torch`` through the ``torch.backends`` entry point
:mod:`hpcdist._torch_autoload` when hpcdist is installed) does three things, none of which talks to MPI:

1. ``Backend.register_backend("hpcdist", create, extended_api=True,
   devices=["cpu", "cuda"])``: torch calls :func:`create` for every group
   it makes with backend "hpcdist".
2. Registers the rendezvous scheme ``mpi://``: rank and world size from
   ``MPI_COMM_WORLD``, and a torch ``TCPStore`` served by rank 0 on a free
   port whose address is broadcast over MPI (loopback when all ranks share a
   node), so no ``MASTER_ADDR``/``MASTER_PORT`` is needed.
3. Lets ``env://`` (torch's default ``init_method``) fall back to ``mpi://``
   when ``MASTER_ADDR`` is unset and an MPI launcher (mpiexec, srun, ...)
   started the process; with ``MASTER_ADDR`` set, or outside a launcher,
   torch's own handler runs unchanged. So ``init_process_group("hpcdist")``
   just works under ``mpiexec``.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from datetime import timedelta
from typing import Any
from urllib.parse import parse_qsl, urlparse

__all__ = ["create", "mpi_rendezvous_handler", "register"]

_DONE: list[bool] = []


def register() -> None:
    """Register the backend and the rendezvous schemes with torch (idempotent, no MPI call)."""
    if _DONE:
        return
    import importlib

    import torch.distributed as dist

    rdzv = importlib.import_module("torch.distributed.rendezvous")  # the module (the package exports a function)

    from .backend import BACKEND_NAME, DEVICES

    if BACKEND_NAME.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND_NAME, create, extended_api=True, devices=list(DEVICES))
    handlers = rdzv._rendezvous_handlers
    if "mpi" not in handlers:
        rdzv.register_rendezvous_handler("mpi", mpi_rendezvous_handler)
    env = handlers.get("env")
    if env is not None and not getattr(env, "_hpcdist", False):
        handlers["env"] = _env_or_mpi(env)
    _DONE.append(True)


def create(opts: Any, pg_options: Any = None) -> Any:
    """torch's creator for a group with backend "hpcdist" (``extended_api=True``).

    ``opts`` is torch's ``_DistributedBackendOptions``: the group's store,
    rank, size, timeout, name and the members' global ranks (empty for the
    default group). Collective over the group's members.
    """
    from .backend import BACKEND_NAME, DEVICES, HpcdistProcessGroup
    from .devicemap import RoutedProcessGroup, device_map, make_delegates
    from .groups import attach

    timeout = opts.timeout
    if not isinstance(timeout, timedelta):
        timeout = timedelta(milliseconds=float(timeout))
    rank, size, name = opts.group_rank, opts.group_size, str(opts.group_id)
    ranks = list(opts.global_ranks_in_group)
    dmap = device_map(2)  # torch's map for this group, read from the caller
    devices = tuple(dmap) or DEVICES  # what the group serves: the map's devices (torch's default map: both)
    att = attach(opts.store, rank, size, timeout, ranks)
    if all(b == BACKEND_NAME for b in dmap.values()):
        return HpcdistProcessGroup(att, rank, size, timeout, name, devices)
    delegates = make_delegates(dmap, opts.store, rank, size, timeout, ranks, name)
    return RoutedProcessGroup(att, rank, size, timeout, name, devices, delegates=delegates)


# ------------------------------------------------------------------ rendezvous


def _under_mpi_launcher() -> bool:
    from ..rendezvous.detect import detect_launcher

    return detect_launcher() is not None


def _contradicts_launch(url: str) -> str | None:
    """Why ``RANK``/``WORLD_SIZE`` (or the URL's rank/world_size) cannot be this process's place, or None.

    Under a multi-process MPI launch (mpiexec, srun) every process of the
    launch reads the same inherited variables: torchrun's variables left by a
    parent process (one that ran ``init_process_group`` exports them) make every
    rank claim one place, and torch's env:// rendezvous then waits forever or
    fails on a busy port. torchrun's own children (``TORCHELASTIC_RUN_ID``) and
    one-process launches keep torch's behaviour: the variables rule.
    """
    if os.environ.get("TORCHELASTIC_RUN_ID"):
        return None
    from ..rendezvous.detect import detect_launcher, launcher_rank_size
    from ..rendezvous.join import stated_places

    truth = launcher_rank_size()
    if truth is None or truth[1] < 2:
        return None
    want = {"rank": truth[0], "world_size": truth[1]}
    for field, source, value in stated_places(url, -1, -1):  # torch puts rank=/world_size= in the URL query
        if value != want[field]:
            return (
                f"{field} {value} from {source} contradicts the MPI launch ({detect_launcher()}), where this "
                f"process is rank {truth[0]} of {truth[1]}; variables inherited from a parent process (one that "
                "ran init_process_group exports RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT) would make every "
                "rank claim the same place: unset them and the launcher decides, or make them match"
            )
    return None


def _env_or_mpi(torch_env: Any) -> Any:
    def handler(url: str, timeout: Any = None, **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
        if not os.environ.get("MASTER_ADDR") and _under_mpi_launcher():
            return mpi_rendezvous_handler(url, timeout=timeout, **kwargs)
        why = _contradicts_launch(url)
        if why is not None:
            raise ValueError(why)
        if timeout is None:
            return torch_env(url, **kwargs)
        return torch_env(url, timeout=timeout, **kwargs)

    handler._hpcdist = True  # type: ignore[attr-defined]
    handler.__doc__ = "torch's env:// handler, falling back to mpi:// under an MPI launcher without MASTER_ADDR."
    return handler


def mpi_rendezvous_handler(url: str, timeout: Any = None, **kwargs: Any) -> Iterator[tuple[Any, int, int]]:
    """``mpi://``: rank and world size from ``MPI_COMM_WORLD``, a TCPStore whose address travels over MPI.

    Collective over ``COMM_WORLD``. A ``rank``/``world_size`` in the URL
    query (torch puts the arguments there) must agree with MPI's.
    """
    from ..rendezvous.detect import launcher_rank_size
    from ..rendezvous.init_guard import bounded_mpi_init

    tmo = timeout if isinstance(timeout, timedelta) else timedelta(minutes=30)
    stated = launcher_rank_size()  # (rank, size) as the launcher's variables state them, or None
    with bounded_mpi_init(tmo.total_seconds(), stated):
        from mpi4py import MPI  # MPI_Init: it waits for every rank of the launch (bounded by the timeout)

    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    query = dict(parse_qsl(urlparse(url).query))
    for field, truth in (("rank", rank), ("world_size", size)):
        given = query.get(field)
        if given is not None and int(given) not in (-1, truth):
            raise ValueError(
                f"init_method {url!r}: {field}={given} contradicts the MPI launch, where this process is rank "
                f"{rank} of {size}; drop the {field} argument (the launcher decides it) or make it match"
            )
    declared = None if stated is None else stated[1]
    if size == 1 and declared not in (None, 1):
        raise ValueError(
            f"the launcher started {declared} processes but MPI's COMM_WORLD has size 1 in each: this MPI is not "
            "wired to the launcher (e.g. srun without --mpi=pmi2/pmix); use the MPI's own mpiexec, the matching "
            "srun --mpi= plugin, or torchrun-style MASTER_ADDR/MASTER_PORT/RANK/WORLD_SIZE"
        )
    store = _mpi_store(comm, tmo)
    yield (store, rank, size)
    raise RuntimeError("Unable to perform re-rendezvous using mpi:// method")


def _mpi_store(comm: Any, timeout: timedelta) -> Any:
    """A torch TCPStore served by rank 0 on a free port; host and port broadcast over ``comm`` (collective)."""
    from torch.distributed import TCPStore

    from ..rendezvous.group_store import LOOPBACK, all_on_one_node, host_address

    rank, size = comm.Get_rank(), comm.Get_size()
    local = size == 1 or all_on_one_node(comm, timeout)
    server = None
    if rank == 0:
        try:
            host = LOOPBACK if local else host_address()
            server = TCPStore(host, 0, size, True, timeout, wait_for_workers=False)
            payload: tuple[str, str, int] = ("ok", host, int(server.port))
        except Exception as exc:  # handed to every rank, raised below
            payload = ("error", f"{type(exc).__name__}: {exc}", 0)
    else:
        payload = ("", "", 0)
    status, host, port = comm.bcast(payload, root=0) if size > 1 else payload
    if status != "ok":
        from ..errors import DistStoreError

        raise DistStoreError(f"mpi:// rendezvous: rank 0 could not start the TCP store: {host}")
    if server is not None:
        return server
    return TCPStore(host, port, size, False, timeout)
