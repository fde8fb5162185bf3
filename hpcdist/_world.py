"""The one state object: the default group, the group registry, counters.

Nothing here talks to MPI; :mod:`hpcdist._init` and :mod:`hpcdist.group`
fill it in.
"""

from __future__ import annotations

from typing import Any

__all__ = ["WORLD", "World", "not_initialized"]


class World:
    """Process-wide state of hpcdist (one instance: :data:`WORLD`)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.default_pg: Any = None  # hpcdist.group.ProcessGroup
        self.groups: dict[str, Any] = {}  # group_name -> ProcessGroup
        self.pg_count = 0  # groups created since init (names are "0", "1", ...)
        self.store: Any = None  # the default group's store
        self.store_owned = False  # made by hpcdist (closed at destroy), not passed by the user
        self.joined_comm: Any = None  # what the rendezvous returned (freed at destroy unless COMM_WORLD)
        self.launcher: str | None = None  # the MPI launcher that started the job; None: joined without one
        self.device_id: Any = None
        self.liveness: Any = None  # rendezvous.liveness.Liveness of a launcher-free world
        self.node_of: list[int] = []  # node index of every world rank (hpcdist.topology.node_layout)
        self.node_cpus: list[int] = []  # CPUs of every world rank's node (hpcdist.topology.node_layout_and_cpus)
        self.exported_env: dict[str, Any] = {}  # torchrun variables init set: name -> (earlier value, value set)
        self.run_id = ""  # this init's id, the same on every rank (rank 0's, random): flight dumps carry it

    def next_name(self) -> str:
        name = str(self.pg_count)
        self.pg_count += 1
        return name


WORLD = World()


def not_initialized() -> ValueError:
    return ValueError(
        "Default process group has not been initialized, please make sure to call init_process_group "
        "(hpcdist.init_process_group('mpi') under mpiexec/srun)."
    )
