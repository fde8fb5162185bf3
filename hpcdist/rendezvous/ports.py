"""Join independent processes into one MPI intracommunicator through MPI ports.

Processes that no MPI launcher started are MPI singletons (``COMM_WORLD`` has
size 1). Given a store they all reach, :func:`join_over_ports` makes one
intracommunicator of ``world_size`` processes in rank order:

1. **Arrival.** Each process announces itself in the store and waits until
   all ``world_size`` have; on timeout it says how many of how many arrived
   and which ranks are missing. Nobody calls a blocking MPI function before
   every peer is known to be alive.
2. **Doubling merge.** In round ``r`` the processes form blocks of ``2**r``
   consecutive ranks, each already one intracommunicator. An even block
   accepts (collectively, root = its lowest rank, which opened an MPI port
   and publishes its name in the store under a key of this round, so no
   connector of a later round can reach an earlier Accept) and the odd block after it
   connects; ``Intercomm_merge`` with the lower block first keeps rank
   order. ``ceil(log2(world_size))`` rounds; a block without a partner
   waits for the next round. Before calling ``Accept`` every process of the
   lower block waits in the store until the upper block announced that it
   is about to connect, so ``Accept`` (which has no timeout) only runs when
   its peer is there; ``Connect`` is given MPICH's ``timeout`` info key.
   A peer can still die between announcing itself and connecting: both
   calls run under hpcdist's watchdog, which ends this process with
   ``MPI_Abort`` and a DistTimeoutError message 5 s past the rendezvous
   deadline (a blocking MPI call cannot be interrupted).

Store keys live under ``hpcdist/join/<generation>/``; the generation is a
per-rank counter, so joining again over the same store (a second
``init_process_group``) uses fresh keys.

**Rank claims.** Before anything else a process claims its rank with
``compare_set`` on ``hpcdist/join/holder/<rank>`` (value: host name and
pid). A second process asking for a rank another process holds gets a
ValueError naming both at once, instead of waiting alone for peers that
never come. The claim is kept after a successful join (so a late duplicate
is caught too; the same process may join again) and released when the join
fails (so a retry, by any process, may take the rank). Not in torch, whose
rendezvous does not detect duplicate ranks. A process that died holding a
rank keeps it claimed in that store: start the job again with a fresh store
(new ``MASTER_PORT`` or file).

Known: MPICH 5.0.x fails connect/accept between singletons ("Local and
remote groups in MPI_Intercomm_create must not overlap"); it is refused up
front with :class:`~hpcdist.errors.DistBackendError`.
"""

from __future__ import annotations

import contextlib
import os
import re
import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import TYPE_CHECKING

from hpcdist.errors import DistBackendError, DistTimeoutError
from hpcdist.rendezvous.arrival import Deadline, StoreLostError, arrive, is_lost_server

if TYPE_CHECKING:
    from mpi4py import MPI

    from hpcdist.store import Store

__all__ = ["broken_mpi_reason", "check_mpi_supports_ports", "connect_failure", "join_over_ports"]

_KEY_ROOT = "hpcdist/join"
#: how long giving up a rank claim may take when the store went away
_RELEASE_TIMEOUT = timedelta(seconds=0.5)
#: how long a rank whose store server went away before everyone arrived waits for a new server there
_REJOIN_GRACE_S = 3.0
#: how long past the rendezvous deadline a connect/accept may take before the watchdog ends the process
_MPI_GRACE_S = 5.0
_FIX = (
    "install an MPI whose MPI_Comm_connect/accept works between singleton processes "
    "(pip install 'mpich>=4.3,<4.4' for the embedded MPI), or start the processes with an MPI launcher "
    "(mpiexec -n N / srun) and use init_method='mpi://'"
)
_BROKEN = re.compile(r"MPICH Version:\s*5\.0(\.|\b)")


def broken_mpi_reason(library_version: str) -> str | None:
    """Why the MPI named by ``MPI_Get_library_version`` cannot join singletons, or None."""
    if _BROKEN.search(library_version):
        first = library_version.strip().splitlines()[0]
        return (
            f"{first}: MPICH 5.0.x cannot join processes started without an MPI launcher "
            f"(its MPI_Comm_connect/accept between singletons fails with 'Local and remote groups in "
            f"MPI_Intercomm_create must not overlap'); {_FIX}"
        )
    return None


#: What to try when the MPI's transport cannot reach a peer (seen: the embedded MPICH's UCX between network
#: namespaces, "Invalid port"): the TCP transports of its two network modules.
_TRANSPORT_FIX = (
    "the MPI's network transport could not reach the peer (the embedded MPICH uses UCX by default, which can "
    "fail between hosts, containers or network namespaces). Try its TCP transports: UCX_TLS=tcp,self, or "
    "MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp (set on every process); check that the hosts can reach each other "
    "on the ports MPI picks (firewalls), or start the processes with an MPI launcher (mpiexec -n N / srun)"
)


def connect_failure(rank: int, error_string: str, library_version: str) -> str:
    """The error text of a failed MPI_Comm_connect/accept: what failed, with what, and what to try."""
    lib = library_version.strip().splitlines()[0]
    fix = broken_mpi_reason(library_version) or _TRANSPORT_FIX
    return f"rendezvous: MPI could not connect rank {rank} to its peers ({error_string.strip()}) with {lib}; {fix}"


def check_mpi_supports_ports() -> None:
    """Refuse, with DistBackendError, an MPI known to break connect/accept between singletons."""
    from mpi4py import MPI

    reason = broken_mpi_reason(MPI.Get_library_version())
    if reason is not None:
        raise DistBackendError(reason)


def _whoami() -> str:
    """This process, as the holder of a rank claim (pid is read now: forked children differ)."""
    return f"process {os.getpid()} on {socket.gethostname()}"


def _claim_rank(store: Store, rank: int, world_size: int, me: str) -> str:
    """Claim ``rank`` in ``store`` for this process; ValueError when another process holds it."""
    key = f"{_KEY_ROOT}/holder/{rank}"
    holder = store.compare_set(key, b"", me.encode()).decode("utf-8", "replace")
    if holder != me:
        raise ValueError(
            f"rendezvous: rank {rank} is claimed twice: {holder} already joined (or is joining) as rank {rank} "
            f"of world_size={world_size} over this store, and this {me} asked for rank {rank} too; give every "
            f"process a distinct RANK 0..{world_size - 1} (if {holder} has exited, start the job again with a "
            f"fresh store: another MASTER_PORT or file)"
        )
    return key


def _release_rank(store: Store, key: str, me: str) -> None:
    """Give up the claim ``key`` (after a failed join); best effort, within about a second.

    The store may be gone (rank 0 gave up): a TCP store would then try to
    reconnect for its whole timeout, so the timeout is shortened meanwhile.
    """
    saved = store.timeout
    try:
        store.set_timeout(_RELEASE_TIMEOUT)
        store.compare_set(key, me.encode(), b"")
    except Exception:
        pass
    finally:
        with contextlib.suppress(Exception):
            store.set_timeout(saved)


def _info_timeout(seconds: float) -> MPI.Info:
    from mpi4py import MPI

    info = MPI.Info.Create()
    info.Set("timeout", str(max(1, int(seconds))))
    return info


@contextlib.contextmanager
def _watched(deadline: Deadline, what: str) -> Iterator[None]:
    """Arm hpcdist's watchdog around an MPI call that has no timeout of its own.

    ``MPI_Comm_accept`` waits forever for a partner that died after saying it
    would connect; past the rendezvous deadline (plus a grace period) the
    watchdog prints a DistTimeoutError message naming ``what`` and ends this
    process with ``MPI_Abort`` (status 124), instead of hanging.
    """
    from hpcdist._watchdog import WATCHDOG

    previous = WATCHDOG.arm(max(deadline.left(), 0.0) + _MPI_GRACE_S, what)
    try:
        yield
    finally:
        WATCHDOG.disarm(previous)


def _merge_round(
    comm: MPI.Intracomm,
    store: Store,
    prefix: str,
    rank: int,
    world_size: int,
    r: int,
    port: str | None,
    deadline: Deadline,
) -> tuple[MPI.Intracomm, str | None]:
    """One doubling round; returns the (possibly merged) intracomm and this rank's port."""
    from mpi4py import MPI

    span = 1 << r
    block = rank >> r
    leader = block << r
    if block % 2 == 0:
        partner = leader + span
        if partner >= world_size:
            return comm, port
        if rank == leader:
            if port is None:
                port = MPI.Open_port()
            # a key per round: a connector of a later round must not reach this port
            # while it still accepts the connector of an earlier round
            store.set(f"{prefix}/port/{r}/{leader}", port)
        deadline.wait(
            store,
            [f"{prefix}/ready/{r}/{partner}"],
            lambda lost: f"rendezvous: ranks {partner}.. never connected in merge round {r} (a process died?)",
        )
        with _watched(
            deadline, f"rendezvous: MPI_Comm_accept of merge round {r} (rank {rank}, waiting for rank {partner})"
        ):
            inter = comm.Accept(port if port is not None and rank == leader else "", root=0)
        merged = inter.Merge(high=False)
    else:
        lower = leader - span
        key = f"{prefix}/port/{r}/{lower}"
        deadline.wait(store, [key], lambda lost: f"rendezvous: rank {lower} never published its MPI port in round {r}")
        peer_port = store.get(key).decode() if rank == leader else ""
        if rank == leader:
            store.set(f"{prefix}/ready/{r}/{leader}", "1")
        info = _info_timeout(deadline.left())
        try:
            with _watched(deadline, f"rendezvous: MPI_Comm_connect of merge round {r} (rank {rank} to rank {lower})"):
                inter = comm.Connect(peer_port, info, root=0)
        finally:
            info.Free()
        merged = inter.Merge(high=True)
    inter.Free()
    if comm != MPI.COMM_SELF:
        comm.Free()
    return merged, port


def join_over_ports(store: Store, rank: int, world_size: int, timeout: timedelta) -> MPI.Intracomm:
    """One intracommunicator of ``world_size`` processes, rank ``rank`` here.

    SPMD: all ``world_size`` processes call it with the same store and their
    distinct ranks. Raises DistTimeoutError ("k of N joined") when some never
    arrive within ``timeout``; DistBackendError when MPI cannot connect them;
    ValueError when another process holds ``rank`` (see *Rank claims* above).
    """
    check_mpi_supports_ports()
    deadline = Deadline(timeout)
    me = _whoami()
    while True:
        claim: str | None = None
        try:
            claim = _claim_rank(store, rank, world_size, me)  # before the generation: a duplicate must not bump it
            prefix = _arrive(store, rank, world_size, deadline)
            break
        except BaseException as exc:
            if isinstance(exc, Exception) and is_lost_server(exc) and _server_replaced(store, rank, deadline):
                continue  # a new server at the store's address: rank 0 is joining again there, so do we
            if claim is not None:
                _release_rank(store, claim, me)
            if isinstance(exc, StoreLostError):
                raise DistTimeoutError(str(exc)) from None  # the public type; StoreLostError is internal
            raise
    try:
        comm = _merge(store, prefix, rank, world_size, deadline)
    except BaseException as exc:
        _release_rank(store, claim, me)
        if isinstance(exc, StoreLostError):
            raise DistTimeoutError(str(exc)) from None
        raise
    return comm


def _server_replaced(store: Store, rank: int, deadline: Deadline) -> bool:
    """After the store's server went away before every process arrived: True when another server answers.

    Init again after destroy races: a rank whose destroy ended first may reach
    rank 0's old store server before rank 0 closed it, and see it go away. A
    server that answers at the store's address within :data:`_REJOIN_GRACE_S`
    and does not hold this rank's claim is a new one (rank 0's next world), so
    the join starts over there. False when none answers (rank 0 died or gave
    up) or the same server answers (it holds the claim): the caller raises.
    """
    saved = store.timeout
    grace = min(_REJOIN_GRACE_S, deadline.left())
    if grace <= 0:
        return False
    try:
        store.set_timeout(timedelta(seconds=grace))  # a TCP store reconnects within its timeout
        return not store.check([f"{_KEY_ROOT}/holder/{rank}"])
    except Exception:
        return False
    finally:
        with contextlib.suppress(Exception):
            store.set_timeout(saved)


def _arrive(store: Store, rank: int, world_size: int, deadline: Deadline) -> str:
    """Announce this rank under a fresh generation and wait for all; return the generation's key prefix."""
    generation = store.add(f"{_KEY_ROOT}/generation/{rank}", 1)
    prefix = f"{_KEY_ROOT}/{generation}"
    arrive(store, prefix, rank, world_size, deadline)
    return prefix


def _merge(store: Store, prefix: str, rank: int, world_size: int, deadline: Deadline) -> MPI.Intracomm:
    from mpi4py import MPI

    comm: MPI.Intracomm = MPI.COMM_SELF
    port: str | None = None
    try:
        r = 0
        while (1 << r) < world_size:
            comm, port = _merge_round(comm, store, prefix, rank, world_size, r, port, deadline)
            r += 1
    except MPI.Exception as exc:
        raise DistBackendError(connect_failure(rank, exc.Get_error_string(), MPI.Get_library_version())) from exc
    finally:
        if port is not None:
            MPI.Close_port(port)
    if comm == MPI.COMM_SELF:
        comm = MPI.COMM_SELF.Dup()
    if comm.Get_rank() != rank or comm.Get_size() != world_size:
        raise DistBackendError(
            f"rendezvous: built a communicator where this process is rank {comm.Get_rank()} of "
            f"{comm.Get_size()}, expected {rank} of {world_size}; this is a bug in hpcdist, please report it"
        )
    return comm
