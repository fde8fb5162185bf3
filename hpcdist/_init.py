"""``init_process_group`` / ``destroy_process_group`` and the world queries.

SPMD contract: every process of the job calls :func:`init_process_group`
once (again after :func:`destroy_process_group`), with compatible arguments.
Under ``mpiexec``/``srun`` rank and size come from MPI; processes started
otherwise join through the ``env://``, ``tcp://`` or ``file://`` rendezvous
(:mod:`hpcdist.rendezvous`). Either way the result is one MPI
intracommunicator, duplicated for hpcdist's own use.
"""

from __future__ import annotations

import secrets
import sys
import traceback
from datetime import timedelta
from typing import Any

from . import config, flight
from ._exit import exit_status, fail_at_exit
from ._timed import INIT_HINT, wait_or_raise
from ._watchdog import abort_job
from ._world import WORLD, not_initialized
from .backends import parse_backend
from .debug import set_debug_level_from_env
from .group import GroupMember, ProcessGroup, _check_timeout, destroy_group, resolve_group
from .rendezvous import export_torchrun_env, group_store, join_world, restore_env
from .rendezvous.fields import check_rank_world_types
from .topology import node_layout_and_cpus

__all__ = [
    "destroy_process_group",
    "get_backend",
    "get_rank",
    "get_world_size",
    "init_process_group",
    "is_initialized",
]


def init_process_group(
    backend: str | None = None,
    init_method: str | None = None,
    timeout: timedelta | None = None,
    world_size: int = -1,
    rank: int = -1,
    store: Any = None,
    group_name: str = "",
    pg_options: Any = None,
    device_id: Any = None,
) -> None:
    """Initialize the default process group (collective over all processes).

    SPMD: every process of the job calls it once (again only after
    :func:`destroy_process_group`), with compatible arguments. Under an MPI
    launcher rank and size come from MPI; otherwise the processes meet through
    ``init_method`` or ``store`` and are joined into one MPI communicator.

    Args:
        backend: ``"mpi"`` (default), ``"gloo"`` (accepted; runs on MPI), ``"nccl"`` (CUDA arrays
            through NCCL) or a device map such as ``"cpu:mpi,cuda:nccl"``.
        init_method: a rendezvous URL (``env://``, ``tcp://host:port``, ``file:///path``,
            ``mpi://``) for processes no MPI launcher started (default ``env://`` there); exclusive
            with ``store``.
        timeout: bounds every blocking operation of the default group (default 30 min,
            ``HPCDIST_TIMEOUT``).
        world_size: the number of processes; under an MPI launcher it may stay -1 (or the
            tutorial's 0), and a value that contradicts the launch raises ValueError.
        rank: this process's rank, with the same rules as ``world_size``.
        store: a key-value store all processes reach (instead of ``init_method``); it becomes the
            default group's store.
        group_name: the default group's name (default ``"default_pg"``).
        pg_options: accepted for torch compatibility and ignored (MPI takes no per-group options).
        device_id: the CUDA device this rank uses (an int, ``"cuda:N"`` or a ``torch.device``): CUDA
            collectives check that it is current, and :func:`hpcdist.device_for_local_rank` returns it.
    """
    if WORLD.default_pg is not None:
        raise ValueError("trying to initialize the default process group twice; call destroy_process_group() first")
    bmap = parse_backend(backend)
    bstr = "mpi" if backend is None else str(backend).lower()
    tmo = _check_timeout(timeout)
    check_rank_world_types(rank, world_size)
    if store is not None and init_method is not None:
        raise ValueError("init_method and store are mutually exclusive: pass one of them")
    if not isinstance(group_name, str):
        raise TypeError(f"group_name must be a str, got {type(group_name).__name__}")

    joined = join_world(init_method, store=store, rank=rank, world_size=world_size, timeout=tmo)
    comm = _timed_dup(joined.comm, tmo)
    n = comm.Get_size()
    WORLD.reset()
    WORLD.launcher = joined.launcher
    WORLD.device_id = device_id
    group_store = joined.store
    pg = ProcessGroup(
        comm,
        list(range(n)),
        timeout=tmo,
        backend=bmap,
        backend_str=bstr,
        group_name=group_name or "default_pg",
        group_desc="default_pg",
        store=group_store,
    )
    pg.bound_device_id = device_id
    WORLD.default_pg = pg
    WORLD.groups[pg.group_name] = pg
    if group_store is None:
        group_store = pg._store = _group_store(comm, tmo)
    WORLD.store = group_store
    WORLD.store_owned = store is None
    WORLD.joined_comm = joined.comm
    WORLD.node_of, WORLD.node_cpus = node_layout_and_cpus(comm, tmo.total_seconds())
    WORLD.run_id = _run_id(comm, tmo)
    WORLD.exported_env = export_torchrun_env(
        comm, comm.Get_rank(), n, store=group_store, timeout=tmo, node_of=WORLD.node_of
    )
    if joined.launcher is None and n > 1:  # no launcher ends the job when a rank dies: notice it ourselves
        WORLD.liveness = _liveness(group_store, comm.Get_rank(), n, tmo)
    set_debug_level_from_env()  # HPCDIST_DEBUG / TORCH_DISTRIBUTED_DEBUG, read once per init
    flight.install(group_store if n > 1 else None)  # dump directory, dump requests, SIGUSR2 (docs/debugging.md)
    if n > 1 and config.abort_on_exception():
        _install_abort_hook()


def _run_id(comm: Any, timeout: timedelta) -> str:
    """Rank 0's random 64-bit id of this init, on every rank (one 8-byte broadcast, bounded by ``timeout``).

    Flight recorder dumps carry it, so the analyzer tells the dumps of two runs of one job apart.
    """
    import numpy as np

    word = np.frombuffer(secrets.token_bytes(8), dtype=np.uint64).copy()
    if comm.Get_size() > 1:
        wait_or_raise(comm, [comm.Ibcast(word, 0)], timeout.total_seconds(), "init_process_group (run id)", INIT_HINT)
    return f"{int(word[0]):016x}"


def _timed_dup(comm: Any, timeout: timedelta) -> Any:
    """MPI_Comm_idup polled against the timeout: a rank that never comes can't hang init."""
    new, req = comm.Idup()
    wait_or_raise(comm, [req], timeout.total_seconds(), "init_process_group", INIT_HINT)
    return new


def _liveness(store: Any, rank: int, size: int, timeout: timedelta) -> Any:
    """The liveness connections of a launcher-free world (rank 0 listens where its store does)."""
    from .rendezvous.group_store import host_address
    from .rendezvous.liveness import Liveness

    return Liveness(store, rank, size, timeout, str(getattr(store, "host", "") or host_address()))


def _group_store(comm: Any, timeout: timedelta) -> Any:
    """The default group's store: a HashStore alone, else the TCP store rank 0 serves (collective)."""
    if comm.Get_size() == 1:
        from .store import HashStore

        return HashStore()
    return group_store(comm, timeout)


_HOOK_INSTALLED = False


def _install_abort_hook() -> None:
    """Make an unhandled exception, or ``sys.exit`` with a failing status, on one rank end the job (MPI_Abort)."""
    global _HOOK_INSTALLED
    if _HOOK_INSTALLED:
        return
    _HOOK_INSTALLED = True
    previous = sys.excepthook

    def hook(exc_type: Any, exc: Any, tb: Any) -> None:
        pg = WORLD.default_pg
        if pg is None or exc_type is KeyboardInterrupt or not config.abort_on_exception():
            previous(exc_type, exc, tb)
            return
        r = pg.rank()
        text = "".join(traceback.format_exception(exc_type, exc, tb))
        prefixed = "".join(f"[rank {r}] {line}\n" for line in text.rstrip("\n").split("\n"))
        abort_job(
            prefixed + f"[rank {r}] hpcdist: unhandled exception; aborting the MPI job so the other ranks do not "
            "hang (set HPCDIST_ABORT_ON_EXCEPTION=0 to turn this off)\n",
            1,
        )

    sys.excepthook = hook
    previous_exit = sys.exit

    def exit(status: Any = None) -> Any:  # it becomes sys.exit
        note_exit(status)
        return previous_exit(status)

    exit.__doc__ = previous_exit.__doc__
    sys.exit = exit


def note_exit(status: object) -> None:
    """A rank leaving through ``sys.exit(status)`` (or ``SystemExit`` under ``hpcdist run``).

    With a failing status while the process group is up (and
    ``HPCDIST_ABORT_ON_EXCEPTION`` on), the job ends with ``MPI_Abort(status)``
    once this process has run its ``finally`` blocks and ``atexit`` handlers:
    otherwise it would wait in ``MPI_Finalize`` for peers that wait for it in a
    collective, until their timeout.
    """
    code = exit_status(status)
    pg = WORLD.default_pg
    if code == 0 or pg is None or pg.size() < 2 or not config.abort_on_exception():
        return
    if fail_at_exit(code):
        sys.stderr.write(
            f"[rank {pg.rank()}] hpcdist: exiting with status {code} while the process group is up; the MPI job "
            "ends with it (MPI_Abort at exit) so the other ranks do not wait for this one (set "
            "HPCDIST_ABORT_ON_EXCEPTION=0 to turn this off)\n"
        )


def destroy_process_group(group: Any = None) -> None:
    """Destroy ``group``, or every group and the default one (None).

    Collective over the group's members. After destroying everything,
    :func:`init_process_group` may be called again.

    Args:
        group: the group to destroy (None: every group, then the default one, and the store
            hpcdist made). ``GroupMember.NON_GROUP_MEMBER`` (a group this rank is not in) is a
            no-op, as in torch.
    """
    if group is None or group is WORLD.default_pg:
        if WORLD.default_pg is None:
            raise not_initialized()
        owned = WORLD.store if WORLD.store_owned else None
        joined = WORLD.joined_comm
        flight.stop()  # its store connection, before the store closes
        if WORLD.liveness is not None:
            WORLD.liveness.leave()
        for pg in list(WORLD.groups.values()):
            destroy_group(pg)
        restore_env(WORLD.exported_env)  # the next init rendezvouses afresh, not at this world's MASTER_PORT
        WORLD.reset()
        _free_joined(joined)
        if owned is not None:  # a store hpcdist made (not the user's): its server thread and sockets
            close = getattr(owned, "close", None)
            if close is not None:
                try:
                    close()
                except Exception:  # pragma: no cover - teardown must go on
                    pass
        return
    if group is GroupMember.NON_GROUP_MEMBER:  # torch: nothing to do, no warning (a loop over all subgroups)
        if WORLD.default_pg is None:
            raise not_initialized()
        return
    pg = resolve_group(group, "destroy_process_group")
    if pg is not None:
        destroy_group(pg)


def _free_joined(comm: Any) -> None:
    """Free the communicator a port rendezvous built (never COMM_WORLD/COMM_SELF)."""
    if comm is None:
        return
    from mpi4py import MPI

    if comm in (MPI.COMM_WORLD, MPI.COMM_SELF) or comm == MPI.COMM_NULL or MPI.Is_finalized():
        return
    try:
        comm.Free()
    except Exception:  # pragma: no cover - teardown must go on
        pass


def is_initialized() -> bool:
    """Whether the default process group is initialized."""
    return WORLD.default_pg is not None


def _member_pg(group: Any, what: str) -> ProcessGroup | None:
    """``group`` (None: the world) or None when this rank is not a member; raises before init."""
    if WORLD.default_pg is None:
        raise not_initialized()
    if group is None:
        return WORLD.default_pg
    if group is GroupMember.NON_GROUP_MEMBER:  # torch: -1, no warning
        return None
    return resolve_group(group, what)


def get_rank(group: Any = None) -> int:
    """This process's rank in ``group`` (default: the world); -1 for a non-member.

    Args:
        group: the group (None: the default group).

    Returns:
        The rank in ``group``, or -1 when this process is not a member.
    """
    pg = _member_pg(group, "get_rank")
    return -1 if pg is None else pg._rank


def get_world_size(group: Any = None) -> int:
    """The number of ranks in ``group`` (default: the world); -1 for a non-member.

    Args:
        group: the group (None: the default group).

    Returns:
        The group's size, or -1 when this process is not a member.
    """
    pg = _member_pg(group, "get_world_size")
    return -1 if pg is None else pg._size


def get_backend(group: Any = None) -> str:
    """The backend name of ``group``: ``"mpi"``, ``"gloo"`` (which runs on MPI), ``"nccl"`` or a device map.

    Raises ValueError (no warning) on a rank that is not a member, as torch.

    Args:
        group: the group (None: the default group).

    Returns:
        The backend as given to :func:`init_process_group` or :func:`new_group`, in lower case.
    """
    return _queried_pg(group, "get_backend")._backend_str


def get_backend_config(group: Any = None) -> str:
    """The device map of ``group``'s backend, e.g. ``"cpu:mpi,cuda:mpi"``.

    Args:
        group: the group (None: the default group).

    Returns:
        ``device:backend`` pairs, comma-separated, in device order.
    """
    pg = _queried_pg(group, "get_backend_config")
    return ",".join(f"{d}:{b}" for d, b in sorted(pg._backend_map.items()))


def _queried_pg(group: Any, what: str) -> ProcessGroup:
    """The group a query is about; ValueError (torch's "Invalid process group specified") for a non-member."""
    pg = _member_pg(group, what)
    if pg is None:
        raise ValueError(f"Invalid process group specified: {what}() on a group this rank is not a member of")
    return pg


def get_pg_count() -> int:
    """How many process groups exist (the default one included)."""
    return len(WORLD.groups)
