"""torch's process groups -> hpcdist groups, each on its own MPI communicator.

torch calls the backend's creator once per group it makes, on the group's
members only, with the group's store, rank, size, timeout and the *global*
ranks of the members (empty for the default group):

* **The default group** initializes hpcdist's world once per process: under
  an MPI launcher ``COMM_WORLD`` is the world (torch's rank and size must
  agree with MPI's); otherwise the processes (torchrun, ``tcp://``,
  ``file://``) join over MPI ports through the torch store torch made. A
  world hpcdist already has (the user called ``hpcdist.init_process_group``)
  is reused when it matches.
* **A subgroup** (``new_group``, ``new_subgroups``, ``split_group``, a
  ``DeviceMesh`` dimension) becomes ``MPI_Comm_create_group`` over the
  members' ranks of the world's communicator: collective over the members
  only, as torch calls the creator.

``destroy_process_group`` frees the subgroup's communicator, and the world
when the default group initialized it.
"""

from __future__ import annotations

from datetime import timedelta
from typing import Any

from .._world import WORLD
from ..group import ProcessGroup, destroy_group

__all__ = ["Attached", "attach", "detach"]


class Attached:
    """The hpcdist side of one torch group, and what to free with it."""

    __slots__ = ("main", "owns_main", "owns_world")

    def __init__(self, main: ProcessGroup, owns_main: bool, owns_world: bool) -> None:
        self.main = main
        self.owns_main = owns_main
        self.owns_world = owns_world


def attach(store: Any, rank: int, size: int, timeout: timedelta, global_ranks: list[int]) -> Attached:
    """The hpcdist groups for a torch group being created (collective over its members)."""
    if global_ranks:
        main, owns_main, owns_world = _subgroup(global_ranks, rank, timeout), True, False
    else:
        (main, owns_world), owns_main = _world(store, rank, size, timeout), False
    return Attached(main, owns_main, owns_world)


def _world(store: Any, rank: int, size: int, timeout: timedelta) -> tuple[ProcessGroup, bool]:
    """hpcdist's world for torch's default group, and whether this call initialized it."""
    from .. import _init

    pg = WORLD.default_pg
    if pg is not None:  # the user initialized hpcdist first: borrow its world, leave it alive at destroy
        if (pg.rank(), pg.size()) != (rank, size):
            raise ValueError(
                f"hpcdist backend: torch's default group is rank {rank} of {size}, but hpcdist's world (already "
                f"initialized) is rank {pg.rank()} of {pg.size()}; call hpcdist.destroy_process_group() first or "
                "give torch the same rank and world size"
            )
        return pg, False
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_size() > 1 or size == 1:
        _init.init_process_group("mpi", timeout=timeout, rank=rank, world_size=size)
    else:  # not started by mpiexec/srun: join over MPI ports, the torch store carrying the port names
        _init.init_process_group("mpi", timeout=timeout, rank=rank, world_size=size, store=store)
    pg = WORLD.default_pg
    assert pg is not None
    return pg, True


def _subgroup(global_ranks: list[int], rank: int, timeout: timedelta) -> ProcessGroup:
    from ..group import new_group

    world = WORLD.default_pg
    if world is None:
        raise ValueError(
            "hpcdist backend: a subgroup with backend 'hpcdist' needs hpcdist's world: initialize the default group "
            "with backend 'hpcdist' (init_process_group('hpcdist')), or call hpcdist.init_process_group() on every "
            "rank first"
        )
    pg = new_group(list(global_ranks), timeout=timeout, use_local_synchronization=True, sort_ranks=False)
    if not isinstance(pg, ProcessGroup) or pg.rank() != rank:
        got = pg.rank() if isinstance(pg, ProcessGroup) else -1
        raise ValueError(f"hpcdist backend: subgroup of ranks {global_ranks}: torch says rank {rank}, MPI says {got}")
    return pg


def detach(att: Attached) -> None:
    """Free what :func:`attach` made (``destroy_process_group``)."""
    if att.owns_main:
        destroy_group(att.main)
    if att.owns_world and WORLD.default_pg is not None:
        from .. import _init

        _init.destroy_process_group()
