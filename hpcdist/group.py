"""Process groups: :class:`ProcessGroup` over an MPI communicator it owns.

Every group owns one communicator created for it (``Dup``/``Split`` of the
world's), so hpcdist's traffic never collides with the user's on
``COMM_WORLD`` nor between groups. Ranks: ``src``/``dst`` arguments are
*global* ranks (torch's convention); ``group_src``/``group_dst`` are ranks in
the group.

SPMD contract of group creation: :func:`new_group` (default),
:func:`new_subgroups`, :func:`new_subgroups_by_enumeration` and
:func:`split_group` are collective over the parent group: every rank of it
calls them, in the same order, with the same arguments. A rank that does not
call them makes the others raise :class:`~hpcdist.errors.DistTimeoutError`
after the timeout. ``new_group(..., use_local_synchronization=True)`` is
collective over the new group's members only.

This module is also torch's ``group`` namespace: ``hpcdist.group.WORLD`` is
the default group, as ``torch.distributed.group.WORLD`` (torch has a class
there, hpcdist the module itself, so no class hides the module).
"""

from __future__ import annotations

import hashlib
import warnings
import zlib
from datetime import timedelta
from typing import TYPE_CHECKING, Any

import numpy as np

from . import config
from ._ranklist import MESSAGE_LIMIT, ranks_text
from ._timed import timed_members_barrier, wait_or_raise, watched
from ._world import WORLD as _WORLD
from ._world import not_initialized
from .backends import Engine, parse_backend
from .backends.selection import select_engine
from .flight import new_ring
from .ops import RedOpType

__all__ = [
    "GroupMember",
    "ProcessGroup",
    "get_global_rank",
    "get_group_rank",
    "get_process_group_ranks",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "shrink_group",
    "split_group",
]


class ProcessGroup:
    """A group of ranks with its own MPI communicator (torch's ``ProcessGroup``).

    Members have ``rank() >= 0``. Create groups with :func:`new_group` and
    friends, never directly. ``comm`` exposes the mpi4py communicator for code
    that wants to mix in raw MPI calls (don't free it).
    """

    def __init__(
        self,
        comm: Any,
        ranks: list[int],
        *,
        timeout: timedelta,
        backend: dict[str, str],
        backend_str: str,
        group_name: str,
        group_desc: str = "undefined",
        store: Any = None,
    ) -> None:
        self._comm = comm
        self._ranks = list(ranks)
        self._rank = comm.Get_rank()
        self._size = comm.Get_size()
        self._g2l = {g: i for i, g in enumerate(self._ranks)}
        self._timeout = timeout
        self._timeout_s = timeout.total_seconds()
        self._backend_map = backend
        self._backend_str = backend_str
        self._engines: dict[str, Engine] = {}
        # the lanes of small blocking calls (collectives._learn): id(NumPy dtype) -> (dtype, dtype name, max bytes,
        # run). hpcdist.all_reduce's, reduce's and reduce_scatter_tensor's by op (SUM's, the most common, at hand),
        # broadcast's, all_gather_into_tensor's, all_gather's (lists), all_to_all_single's (even splits), gather's
        # and scatter's; and the engine's one-call blocking barrier (None: not asked yet; False: the engine has none)
        self._lanes: dict[Any, dict[int, tuple[Any, str, int, Any]]] = {}
        self._sum_lanes = self._lanes[RedOpType.SUM] = {}
        self._rs_lanes: dict[Any, dict[int, tuple[Any, str, int, Any]]] = {}
        self._rs_sum_lanes = self._rs_lanes[RedOpType.SUM] = {}
        self._reduce_lanes: dict[Any, dict[int, tuple[Any, str, int, Any]]] = {}
        self._reduce_sum_lanes = self._reduce_lanes[RedOpType.SUM] = {}
        self._bcast_lanes: dict[int, tuple[Any, str, int, Any]] = {}
        self._gather_lanes: dict[int, tuple[Any, str, int, Any]] = {}
        self._a2a_lanes: dict[int, tuple[Any, str, int, Any]] = {}
        self._ag_list_lanes: dict[int, tuple[Any, str, int, Any]] = {}
        self._gather_root_lanes: dict[int, tuple[Any, str, int, Any]] = {}
        self._scatter_lanes: dict[int, tuple[Any, str, int, Any]] = {}
        self._barrier_lane: Any = None
        self.group_name = group_name
        self.group_desc = group_desc
        self._store = store
        self._destroyed = False
        self._block = config.wait_mode() == "block"  # HPCDIST_WAIT: how blocking calls wait
        self._flight = new_ring()  # this group's last operations (hpcdist.flight), None when off
        self.bound_device_id: Any = None
        # the slot of a blocking call on this group in the watchdog's table (hpcdist._watchdog): a second
        # thread's blocking call in the same domain raises (busy_error)
        self._call_domain, self._thread_level = _call_domain(self)
        self._monitored_seq = 0  # monitored_barrier's sequence number on this group
        self._local_counts: dict[tuple[int, ...], int] = {}  # members -> groups only they made from this one
        self._node_local: int | None = None  # node-local rank (a collective to find; cached per group)
        # a world joined over MPI ports (no launcher): receives from any source probe first (work.ProbedRecv)
        self._probe_any = _WORLD.launcher is None and self._size > 1

    # torch's ProcessGroup API
    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size

    def name(self) -> str:
        return self._backend_str

    @property
    def comm(self) -> Any:
        """The group's mpi4py ``Intracomm`` (owned by hpcdist; don't free it)."""
        return self._comm

    @property
    def ranks(self) -> list[int]:
        """The global ranks of the members, in group-rank order."""
        return list(self._ranks)

    @property
    def timeout(self) -> timedelta:
        return self._timeout

    def set_timeout(self, timeout: timedelta) -> None:
        self._timeout = _check_timeout(timeout)
        self._timeout_s = self._timeout.total_seconds()

    def get_group_store(self) -> Any:
        return self._store

    def engine(self, device_type: str) -> Engine:
        """The engine moving this group's arrays of ``device_type`` ('cpu'/'cuda'), built on first use.

        :func:`hpcdist.backends.selection.select_engine` chooses it from the
        group's backend for that device; the group keeps it until destroyed.
        """
        eng = self._engines.get(device_type)
        if eng is None:
            name = self._backend_map.get(device_type)
            if name is None:
                raise ValueError(
                    f"group {self.group_name!r} has backend {self._backend_str!r}, which cannot move {device_type} "
                    f"arrays; use a device map such as backend='cpu:mpi,cuda:nccl', or move the array to "
                    f"{' or '.join(sorted(self._backend_map))}"
                )
            eng = self._engines[device_type] = select_engine(self, name, device_type)
        return eng

    def barrier_engine(self) -> Engine:
        """The engine that runs this group's barrier: its host engine, else (an NCCL-only group) its only one."""
        return self.engine("cpu" if "cpu" in self._backend_map else next(iter(self._backend_map)))

    def busy_error(self, opname: str) -> Exception:
        """The error of a blocking call entered while another thread is inside one on this group."""
        from .errors import DistError

        if self._thread_level != "multiple":
            return DistError(
                f"{opname} on {self!r}: another thread is inside a blocking hpcdist call, and this MPI provides only "
                f"MPI_THREAD_{self._thread_level.upper()} (MPI.Query_thread()), so calls from different threads "
                "must not overlap; make them from one thread, or use an MPI with MPI_THREAD_MULTIPLE"
            )
        return DistError(
            f"{opname} on {self!r}: another thread is inside a blocking call on this group. The ranks of a group "
            "must issue its collectives in one order, which concurrent threads cannot guarantee: issue them from "
            "one thread, or give each thread a group of its own (new_group)"
        )

    def _lane_tables(self) -> list[dict[int, tuple[Any, str, int, Any]]]:
        """Every table of lanes (by dtype) the group keeps, of every operation and op."""
        by_op = [*self._lanes.values(), *self._reduce_lanes.values(), *self._rs_lanes.values()]
        moves = [self._bcast_lanes, self._gather_lanes, self._ag_list_lanes, self._a2a_lanes]
        return [*by_op, *moves, self._gather_root_lanes, self._scatter_lanes]

    def _drop_lanes(self, barrier: Any = None) -> None:
        """Forget the group's lanes: later calls learn them again (``barrier=False``: the barrier's never)."""
        for lanes in self._lane_tables():
            lanes.clear()
        self._barrier_lane = barrier

    def _free(self) -> None:
        if self._destroyed:
            return
        self._destroyed = True
        self._drop_lanes(barrier=False)
        for eng in self._engines.values():
            eng.close()
        self._engines.clear()
        try:
            from mpi4py import MPI

            if self._comm != MPI.COMM_NULL and not MPI.Is_finalized():
                self._comm.Free()
        except Exception:  # pragma: no cover - a broken comm must not block teardown
            pass

    def abort(self) -> None:
        """MPI_Abort on this group's communicator (ends the job)."""
        self._comm.Abort(1)

    def shutdown(self) -> None:
        destroy_group(self)

    def __repr__(self) -> str:
        ranks = self._ranks
        members = ""  # which ranks a subgroup holds (timeout and mismatch errors name the group so)
        if self is not _WORLD.default_pg:
            shown = ", ".join(map(str, ranks[:8])) + (f", ... ({len(ranks)} ranks)" if len(ranks) > 8 else "")
            members = f" global ranks [{shown}]"
        return f"<ProcessGroup {self.group_name!r} rank {self._rank}/{self._size}{members} backend={self._backend_str}>"


#: the call domain of every group when MPI allows one thread in MPI at a time
_SHARED_DOMAIN = "one thread in MPI at a time"


def _call_domain(pg: Any) -> tuple[Any, str]:
    """(the call domain of a new group, the MPI thread level's name).

    With ``MPI_THREAD_MULTIPLE`` every group is its own domain: threads may run
    blocking calls on different groups at once. Below it, all groups share one
    domain: calls from different threads must never overlap.
    """
    from mpi4py import MPI

    names = {
        MPI.THREAD_SINGLE: "single",
        MPI.THREAD_FUNNELED: "funneled",
        MPI.THREAD_SERIALIZED: "serialized",
        MPI.THREAD_MULTIPLE: "multiple",
    }
    level = names.get(MPI.Query_thread(), "single")
    return (pg if level == "multiple" else _SHARED_DOMAIN), level


class _WorldMeta(type):
    @property
    def WORLD(cls) -> ProcessGroup | None:
        """The default process group (None before :func:`hpcdist.init_process_group`)."""
        return _WORLD.default_pg


class GroupMember(metaclass=_WorldMeta):
    """torch's ``GroupMember``: ``WORLD`` (the default group) and ``NON_GROUP_MEMBER``."""

    NON_GROUP_MEMBER = object()


if TYPE_CHECKING:
    #: what ``__getattr__`` below gives; declared for mypy, which then still checks every other name
    WORLD: ProcessGroup | None
else:

    def __getattr__(name: str) -> ProcessGroup | None:
        """``hpcdist.group.WORLD``: the default process group, as torch's ``torch.distributed.group.WORLD``.

        torch keeps its group functions in ``distributed_c10d`` and exports a class
        ``group`` whose only attribute is ``WORLD``. hpcdist's group functions live in
        this module, ``hpcdist.group``, which is therefore that namespace itself: no
        class shadows the module (``import hpcdist.group`` and ``hpcdist.group.WORLD``
        both work, and ``hpcdist.group.new_group`` is ``hpcdist.new_group``).
        """
        if name == "WORLD":
            return _WORLD.default_pg
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _check_timeout(timeout: Any) -> timedelta:
    """``timeout``, or the default (``HPCDIST_TIMEOUT``) when None; checked by :func:`config.check_timeout`."""
    return config.default_timeout() if timeout is None else config.check_timeout(timeout)


def default_pg() -> ProcessGroup:
    pg = _WORLD.default_pg
    if pg is None:
        raise not_initialized()
    return pg


def resolve_group(group: Any, opname: str = "") -> ProcessGroup | None:
    """``group`` argument -> ProcessGroup, or None when this rank is not a member (warns)."""
    if group is None:
        pg = _WORLD.default_pg
        if pg is None:
            raise not_initialized()
        return pg
    if type(group) is ProcessGroup:
        if group._destroyed:
            raise ValueError(f"group {group.group_name!r} was destroyed (destroy_process_group); create a new one")
        return group
    if group is GroupMember.NON_GROUP_MEMBER:
        if _WORLD.default_pg is None:
            raise not_initialized()
        warnings.warn(
            f"Running {opname or 'a collective'} on a group this rank (global rank {_WORLD.default_pg.rank()}) "
            "does not belong to: it does nothing and returns None",
            stacklevel=3,
        )
        return None
    mesh_group = getattr(group, "get_group", None)
    if isinstance(group, ProcessGroup):
        return group
    if mesh_group is not None and getattr(group, "ndim", 2) == 1:
        return resolve_group(mesh_group(), opname)
    raise TypeError(
        f"group must be a ProcessGroup (from new_group) or None for the default group, got {type(group).__name__}"
    )


def group_rank(pg: ProcessGroup, glob: Any, grp: Any, name: str) -> int:
    """The group rank meant by ``name``/``group_name`` (global/group rank); ValueError if bad."""
    if grp is None and type(glob) is int:  # the common call: a global rank of the group
        r = pg._g2l.get(glob)
        if r is not None:
            return r
    if grp is not None:
        if glob is not None:
            raise ValueError(f"pass either {name}= (a global rank) or group_{name}= (a group rank), not both")
        if isinstance(grp, bool) or not isinstance(grp, (int, np.integer)) or not 0 <= grp < pg._size:
            raise ValueError(f"group_{name} must be a rank of the group, 0..{pg._size - 1}, got {grp!r}")
        return int(grp)
    if glob is None:
        raise ValueError(f"{name} (a global rank) or group_{name} (a rank in the group) is required")
    r = pg._g2l.get(int(glob)) if isinstance(glob, (int, np.integer)) and not isinstance(glob, bool) else None
    if r is None:
        raise ValueError(
            f"{name}={glob!r} is not a rank of group {pg.group_name!r}; expected one of its global ranks "
            f"{pg._ranks if pg._size <= 16 else f'({pg._size} ranks)'}"
        )
    return r


#: What a rank stuck creating a group is told.
GROUP_HINT = (
    "group creation is collective: every rank of the parent group must call it, in the same order, with the same "
    "arguments (the members only with use_local_synchronization=True or shrink_group)"
)


def _create_group(comm: Any, members: list[int], timeout: timedelta, what: str) -> Any:
    """``MPI_Comm_create_group`` of ``members`` (ranks of ``comm``), collective over the members only, bounded."""
    limit = timeout.total_seconds()
    timed_members_barrier(comm, members, limit, what, GROUP_HINT)
    mpi_group = comm.Get_group().Incl(members)
    try:
        return watched(
            lambda: _new_comm(lambda: comm.Create_group(mpi_group, tag=_tag_for(members)), what), limit, what
        )
    finally:
        mpi_group.Free()


def _new_comm(make: Any, what: str) -> Any:
    """``make()``, a new communicator; an MPI error (MPICH runs out of communicators near 2048) as DistBackendError.

    Every rank of the parent takes part in allocating the communicator's context, so all of them fail alike.
    """
    from mpi4py import MPI

    try:
        return make()
    except MPI.Exception as e:
        from .errors import DistBackendError

        raise DistBackendError(
            f"{what}: MPI could not create the new group's communicator ({len(_WORLD.groups)} groups exist on this "
            "rank; an MPI process holds a limited number of communicators, MPICH about 2048): destroy the groups "
            f"you no longer use with destroy_process_group(group). MPI said: {str(e).strip()[-300:]}"
        ) from e


def _validate_ranks(ranks: Any, world_size: int, argname: str = "ranks", of: str = "the world's ranks") -> list[int]:
    """``ranks`` as a list of ints in ``0..world_size-1``, without repeats; TypeError/ValueError naming ``argname``.

    Takes what torch takes: a list, tuple, range or set, a 1-D NumPy array or torch tensor, and
    NumPy integers among plain ones (``list(np.arange(4))``). A bool or a float is refused.
    """
    if isinstance(ranks, (str, bytes, dict)) or not hasattr(ranks, "__iter__"):
        raise TypeError(f"{argname} must be a list of global ranks, got {type(ranks).__name__}")
    tolist = getattr(ranks, "tolist", None)  # a NumPy array or torch tensor: its items as Python numbers
    items = tolist() if tolist is not None and not isinstance(ranks, (list, tuple, range)) else list(ranks)
    if not isinstance(items, list):
        raise TypeError(f"{argname} must be a 1-D list of global ranks, got {type(ranks).__name__} {ranks!r:.60}")
    out: list[int] = []
    for r in items:
        if isinstance(r, (bool, np.bool_)) or not isinstance(r, (int, np.integer)):
            raise TypeError(f"{argname} must hold ints, got {r!r} ({type(r).__name__})")
        if not 0 <= r < world_size:
            raise ValueError(f"{argname} holds rank {r}, outside {of} 0..{world_size - 1}")
        out.append(int(r))
    if len(set(out)) != len(out):
        dup = sorted({r for r in out if out.count(r) > 1})
        raise ValueError(f"{argname} holds duplicate ranks {dup}")
    return out


def _validate_lists(lists: Any, world_size: int, argname: str, what: str, of: str) -> list[list[int]]:
    """``ranks_per_subgroup_list`` / ``split_ranks``: a non-empty list of non-empty rank lists, each checked."""
    if isinstance(lists, (str, bytes, dict)) or not hasattr(lists, "__iter__"):
        raise TypeError(f"{argname} must be a list of lists of {what}, got {type(lists).__name__}")
    tolist = getattr(lists, "tolist", None)
    given = tolist() if tolist is not None and not isinstance(lists, (list, tuple)) else list(lists)
    if not isinstance(given, list) or not given:
        raise ValueError(f"{argname} must be a non-empty list of lists of {what}, got {lists!r:.80}")
    out = [_validate_ranks(lst, world_size, f"{argname}[{i}]", of) for i, lst in enumerate(given)]
    for i, lst in enumerate(out):
        if not lst:
            raise ValueError(f"{argname}[{i}] is empty: every group needs at least one rank")
    return out


def _make_pg(
    comm: Any, ranks: list[int], timeout: timedelta, backend: Any, desc: str | None, name: str | None = None
) -> ProcessGroup:
    world = default_pg()
    if backend is None:
        bmap, bstr = dict(world._backend_map), world._backend_str
    else:
        bmap, bstr = parse_backend(backend), str(backend).lower()
    name = name or _WORLD.next_name()
    pg = ProcessGroup(
        comm,
        ranks,
        timeout=timeout,
        backend=bmap,
        backend_str=bstr,
        group_name=name,
        group_desc=desc or "undefined",
        store=world._store,
    )
    _WORLD.groups[name] = pg
    return pg


def new_group(
    ranks: Any = None,
    timeout: timedelta | None = None,
    backend: Any = None,
    pg_options: Any = None,
    use_local_synchronization: bool = False,
    group_desc: str | None = None,
    device_id: Any = None,
    sort_ranks: bool = True,
) -> Any:
    """Create a group of the given global ``ranks`` (all ranks when None/empty).

    Collective over the default group (every rank calls it with the same
    ``ranks``), unless ``use_local_synchronization=True``: then only members
    call it. Returns the new :class:`ProcessGroup` on members and
    ``GroupMember.NON_GROUP_MEMBER`` elsewhere.

    Args:
        ranks: the members' global ranks, without repeats (None or empty: every rank): a list,
            tuple, range or set of ints, a 1-D NumPy array or torch tensor. Every rank passes the
            same ones (compared after sorting: ranks given different ones all raise ValueError).
        timeout: the new group's timeout of every blocking operation (default: ``HPCDIST_TIMEOUT``, 30 min).
        backend: the new group's backend or device map (default: the default group's).
        pg_options: accepted for torch compatibility and ignored (MPI takes no per-group options).
        use_local_synchronization: only the members call it (MPI_Comm_create_group); the others
            need not.
        group_desc: a description of the group, shown in errors and the flight recorder.
        device_id: accepted for torch compatibility and ignored (torch binds an NCCL communicator to
            it eagerly; hpcdist creates device resources on first use).
        sort_ranks: order the members by global rank (default); False keeps the order of ``ranks``
            as the group ranks.

    Returns:
        The new :class:`ProcessGroup` on members; ``GroupMember.NON_GROUP_MEMBER`` elsewhere.
    """
    world = default_pg()
    n = world.size()
    members = list(range(n)) if ranks is None else _validate_ranks(ranks, n) or list(range(n))
    if sort_ranks:
        members.sort()
    tmo = _check_timeout(timeout)
    if backend is not None:
        parse_backend(backend)
    if use_local_synchronization:
        if world.rank() not in members:
            return GroupMember.NON_GROUP_MEMBER
        comm = _create_group(world._comm, members, tmo, "new_group(use_local_synchronization=True)")
        return _make_pg(comm, members, tmo, backend, group_desc, _local_name(world, members))
    # every rank shows the others its members first: ranks given different lists raise ValueError on every rank
    mine, _ = _split_many(world, [members], tmo, backend, group_desc, "new_group")
    return GroupMember.NON_GROUP_MEMBER if mine is None else mine


def _local_name(parent: ProcessGroup, members: list[int]) -> str:
    """The name of a group only its members create (use_local_synchronization, shrink_group), as torch's hashed one.

    The world's group counter (``0``, ``1``, ...) advances on every rank of the world; a group that the
    others never see must not advance it, or the next groups would have different names on different ranks
    (the flight recorder's analysis matches groups by name). Members create their groups in one order, so the
    number of groups of these members made from ``parent`` so far is the same on each of them.
    """
    key = tuple(members)
    k = parent._local_counts.get(key, 0)
    parent._local_counts[key] = k + 1
    return f"{hashlib.sha1('_'.join(map(str, members)).encode(), usedforsecurity=False).hexdigest()[:16]}_{k}"


def _tag_for(ranks: list[int]) -> int:
    h = 0
    for r in ranks:
        h = (h * 1000003 + r + 1) & 0x3FFF
    return h


def _agree(parent: ProcessGroup, shown: Any, limit: float, what: str) -> None:
    """Every rank of ``parent`` shows the others a checksum of ``shown`` (the groups it was asked to make): one
    polled ``MPI_Iallgather`` within ``limit`` seconds, as cheap as a barrier. Ranks given different ones all raise
    the same ValueError, naming the ranks that differ from group rank 0."""
    digests = np.empty(parent._size, dtype=np.int64)
    digest = np.array([zlib.crc32(repr(shown).encode())], dtype=np.int64)
    wait_or_raise(parent._comm, [parent._comm.Iallgather(digest, digests)], limit, what, GROUP_HINT)
    differ = [r for r, d in enumerate(digests.tolist()) if d != digests[0]]
    if differ:
        raise ValueError(
            f"{what}: the ranks were given different groups to make: group rank(s) "
            f"{ranks_text(differ, MESSAGE_LIMIT)} passed other rank lists "
            f"than group rank 0 (this rank, group rank {parent.rank()}, passed {shown!r:.200}); every rank "
            "must pass the same mesh / rank lists"
        )


def _split_many(
    parent: ProcessGroup,
    lists: list[list[int]],
    timeout: timedelta,
    backend: Any,
    desc: str | None,
    what: str,
    given: Any = None,
) -> tuple[Any, list[Any]]:
    """One MPI_Comm_split of ``parent`` into the given lists of *global* ranks.

    The ranks first show each other a checksum of their ``lists`` (or of
    ``given``, the lists as the caller passed them, when ``lists`` is derived
    from them: the exchange that proves every rank is there): ranks that were
    given different lists (a mesh built otherwise on some ranks) raise the
    same ValueError on every rank, where a split would make groups whose
    members disagree about who is in them.
    """
    from mpi4py import MPI

    me = parent._ranks[parent.rank()]
    color, key = MPI.UNDEFINED, 0
    for i, lst in enumerate(lists):
        if me in lst:
            color, key = i, lst.index(me)
    limit = timeout.total_seconds()
    _agree(parent, lists if given is None else given, limit, what)
    comm = watched(lambda: _new_comm(lambda: parent._comm.Split(color, key), what), limit, what)
    out: list[Any] = []
    mine: Any = None
    for i, lst in enumerate(lists):
        if i == color:
            mine = _make_pg(comm, lst, timeout, backend, desc)
            out.append(mine)
        else:
            _WORLD.next_name()
            out.append(GroupMember.NON_GROUP_MEMBER)
    return mine, out


def new_subgroups(
    group_size: int | None = None,
    group: Any = None,
    timeout: timedelta | None = None,
    backend: Any = None,
    pg_options: Any = None,
    group_desc: str | None = None,
) -> tuple[Any, list[Any]]:
    """Split the world (or ``group``) into consecutive subgroups of ``group_size`` ranks.

    Collective over the parent: each of its ranks calls it with the same
    arguments.

    Args:
        group_size: ranks per subgroup, dividing the parent's size (default: the parent's ranks per
            node, as torch takes the GPUs per node: one group per node where ranks are placed node by
            node; ValueError on every rank where nodes hold different numbers of them).
        group: the parent group (None: the default group).
        timeout: the new group's timeout of every blocking operation (default: ``HPCDIST_TIMEOUT``, 30 min).
        backend: the new group's backend or device map (default: the default group's).
        pg_options: accepted for torch compatibility and ignored (MPI takes no per-group options).
        group_desc: a description of the group, shown in errors and the flight recorder.

    Returns:
        ``(this rank's subgroup, all subgroups)``; the subgroups this rank is not in are
        ``GroupMember.NON_GROUP_MEMBER``.
    """
    parent = _as_pg(group, "new_subgroups")  # a non-member: ValueError, no "does nothing" warning
    tmo = _check_timeout(timeout)
    if backend is not None:
        parse_backend(backend)
    if group_size is None:
        group_size = _ranks_per_node(parent)
    if isinstance(group_size, (bool, np.bool_)) or not isinstance(group_size, (int, np.integer)):
        raise TypeError(f"group_size must be an int, got {type(group_size).__name__} ({group_size!r:.40})")
    group_size = int(group_size)
    n = parent.size()
    if group_size <= 0 or group_size > n:
        raise ValueError(f"group_size must be in 1..{n} (the parent group's size), got {group_size}")
    if n % group_size != 0:
        raise ValueError(f"group_size={group_size} must divide the parent group's size {n}")
    # consecutive group ranks of the parent, each block in global-rank order as torch's (it calls new_group)
    lists = [sorted(parent._ranks[i : i + group_size]) for i in range(0, n, group_size)]
    return _split_many(parent, lists, tmo, backend, group_desc, "new_subgroups")


def _ranks_per_node(parent: ProcessGroup) -> int:
    """``new_subgroups``' default size: the parent's ranks per node (torch: the GPUs per node), taken in blocks of
    consecutive ranks as torch does (node-local where ranks are placed node by node). Nodes holding different
    numbers of the parent's ranks: ValueError. The same answer on every rank, from the world's node layout
    (known since init, right without a launcher too): no message, so no rank waits for one that raised."""
    from .topology import node_of_ranks

    nodes = node_of_ranks(_WORLD.node_of, parent._ranks)
    per_node = sorted({nodes.count(j) for j in set(nodes)})
    if len(per_node) == 1:
        return per_node[0]
    raise ValueError(
        f"new_subgroups(group_size=None) takes the parent's ranks per node as the size, but its nodes hold "
        f"{per_node[0]} to {per_node[-1]} of them (node of each rank: {_brief(nodes)}); pass group_size=, or "
        "new_subgroups_by_enumeration() with each node's ranks"
    )


def _brief(items: list[int], most: int = 16) -> str:
    return " ".join(map(str, items[:most])) + (f" ... ({len(items)} ranks)" if len(items) > most else "")


def new_subgroups_by_enumeration(
    ranks_per_subgroup_list: list[list[int]],
    timeout: timedelta | None = None,
    backend: Any = None,
    pg_options: Any = None,
    group_desc: str | None = None,
) -> tuple[Any, list[Any]]:
    """Create one subgroup per list of global ranks (lists must not overlap).

    Collective over the default group: every rank calls it with the same lists
    (ranks given different lists all raise ValueError). Each subgroup's group
    ranks are in global-rank order, as torch's (whose ``new_group`` sorts).

    Args:
        ranks_per_subgroup_list: one list of global ranks per subgroup, non-empty, disjoint (a
            2-D NumPy array works too).
        timeout: the new group's timeout of every blocking operation (default: ``HPCDIST_TIMEOUT``, 30 min).
        backend: the new group's backend or device map (default: the default group's).
        pg_options: accepted for torch compatibility and ignored (MPI takes no per-group options).
        group_desc: a description of the group, shown in errors and the flight recorder.

    Returns:
        ``(this rank's subgroup or None, all subgroups)``; the subgroups this rank is not in are
        ``GroupMember.NON_GROUP_MEMBER``.
    """
    world = default_pg()
    lists = _validate_lists(
        ranks_per_subgroup_list, world.size(), "ranks_per_subgroup_list", "global ranks", "the world's ranks"
    )
    seen: dict[int, int] = {}
    for i, lst in enumerate(lists):
        for r in lst:
            if r in seen:
                raise ValueError(f"rank {r} appears in subgroups {seen[r]} and {i}: subgroups must not overlap")
            seen[r] = i
    tmo = _check_timeout(timeout)
    if backend is not None:
        parse_backend(backend)
    # group ranks in global-rank order, as torch's (its new_group sorts each list); the lists as given are compared
    ordered = [sorted(lst) for lst in lists]
    return _split_many(world, ordered, tmo, backend, group_desc, "new_subgroups_by_enumeration", given=lists)


def split_group(
    parent_pg: Any = None,
    split_ranks: list[list[int]] | None = None,
    timeout: timedelta | None = None,
    pg_options: Any = None,
    group_desc: str | None = None,
    backend: Any = None,
) -> ProcessGroup | None:
    """Split ``parent_pg`` (default: the world) into disjoint groups.

    Collective over the parent: each of its ranks calls it with the same
    ``split_ranks`` (ranks given different ones all raise ValueError). Each
    split's group ranks follow its parent ranks in order, as torch sorts each
    split.

    Args:
        parent_pg: the group to split (None: the default group).
        split_ranks: one list per new group of *group ranks of the parent*, as in torch; disjoint,
            none empty.
        timeout: the new group's timeout of every blocking operation (default: ``HPCDIST_TIMEOUT``, 30 min).
        pg_options: accepted for torch compatibility and ignored (MPI takes no per-group options).
        group_desc: a description of the group, shown in errors and the flight recorder.
        backend: the new group's backend or device map (default: the default group's).

    Returns:
        This rank's new group, or None when it is in none of ``split_ranks``.
    """
    parent = _as_pg(parent_pg, "split_group")
    if split_ranks is None:
        raise ValueError("split_ranks must be a non-empty list of lists of parent group ranks, got None")
    lists = _validate_lists(split_ranks, parent.size(), "split_ranks", "parent group ranks", "the parent group's ranks")
    seen: set[int] = set()
    for i, lst in enumerate(lists):
        if seen & set(lst):
            raise ValueError(f"split_ranks[{i}] overlaps an earlier split: {sorted(seen & set(lst))}")
        seen |= set(lst)
    tmo = _check_timeout(timeout)
    if backend is not None:
        parse_backend(backend)
    # each split in parent-rank order, as torch's split_group sorts it; the lists as given are compared
    global_lists = [[parent._ranks[r] for r in sorted(lst)] for lst in lists]
    mine, _ = _split_many(parent, global_lists, tmo, backend, group_desc, "split_group", given=lists)
    return mine


def shrink_group(
    ranks_to_exclude: list[int], group: Any = None, shrink_flags: int = 0, pg_options: Any = None
) -> ProcessGroup:
    """A new group of ``group``'s members less ``ranks_to_exclude`` (group ranks of ``group``).

    Collective over the *remaining* members only (``MPI_Comm_create_group``),
    so excluded ranks need not call it and may be gone, as long as the MPI
    communicator itself still works. An excluded rank that calls it gets
    ValueError.

    Args:
        ranks_to_exclude: group ranks of ``group`` to leave out; at least one.
        group: the group to shrink (None: the default group).
        shrink_flags: accepted for torch compatibility and ignored (torch's ``SHRINK_ABORT`` ends the
            parent's ongoing NCCL operations first; the MPI communicator has none to end).
        pg_options: accepted for torch compatibility and ignored.

    Returns:
        The new :class:`ProcessGroup`, with ``group``'s timeout and the default group's backend.
    """
    parent = _as_pg(group, "shrink_group")
    excluded = set(_validate_ranks(ranks_to_exclude, parent.size(), "ranks_to_exclude", "the group's ranks"))
    if not excluded:
        raise ValueError("ranks_to_exclude must name at least one rank of the group")
    if parent.rank() in excluded:
        raise ValueError(f"shrink_group: this rank (group rank {parent.rank()}) is in ranks_to_exclude")
    keep = [r for r in range(parent.size()) if r not in excluded]
    comm = _create_group(parent._comm, keep, parent._timeout, "shrink_group")
    members = [parent._ranks[r] for r in keep]
    return _make_pg(comm, members, parent._timeout, None, "shrunk", _local_name(parent, members))


def get_group_rank(group: Any, global_rank: int) -> int:
    """The rank in ``group`` of the process with global rank ``global_rank``.

    Args:
        group: the group (None: the default group).
        global_rank: a global rank of one of ``group``'s members.

    Returns:
        Its rank in ``group``; ValueError when it is not a member.
    """
    pg = _as_pg(group, "get_group_rank")
    try:
        return pg._g2l[global_rank]
    except (KeyError, TypeError):  # TypeError: an unhashable global_rank
        raise ValueError(
            f"global rank {global_rank!r} is not part of group {pg.group_name!r} (ranks {_brief(pg._ranks)})"
        ) from None


def get_global_rank(group: Any, group_rank: int) -> int:
    """The global rank of the member ``group_rank`` of ``group``.

    Args:
        group: the group (None: the default group).
        group_rank: a rank in ``group``, 0..size-1.

    Returns:
        Its global rank.
    """
    pg = _as_pg(group, "get_global_rank")
    if not isinstance(group_rank, (int, np.integer)) or not 0 <= group_rank < pg.size():
        raise ValueError(f"group_rank must be in 0..{pg.size() - 1} for group {pg.group_name!r}, got {group_rank!r}")
    return pg._ranks[int(group_rank)]


def get_process_group_ranks(group: Any) -> list[int]:
    """The global ranks of ``group``'s members (None: the default group), in group-rank order.

    Args:
        group: the group (None: the default group).

    Returns:
        A new list; entry ``r`` is the global rank of group rank ``r``.
    """
    return list(_as_pg(group, "get_process_group_ranks")._ranks)


def _as_pg(group: Any, what: str) -> ProcessGroup:
    """``group`` (None: the default group); ValueError, without the non-member warning, on a non-member."""
    if group is GroupMember.NON_GROUP_MEMBER:
        raise ValueError(f"{what}: this rank is not a member of the group (it got GroupMember.NON_GROUP_MEMBER)")
    pg = resolve_group(group, what)
    assert pg is not None
    return pg


def destroy_group(pg: ProcessGroup) -> None:
    _WORLD.groups.pop(pg.group_name, None)
    pg._free()
