"""What a launcher hands each rank: torchrun's variables, and a free port for ``MASTER_PORT``.

Shared by ``hpcdist run`` (:mod:`hpcdist.launch.run`, :mod:`hpcdist.launch._bootstrap`),
:func:`hpcdist.spawn` and the export after init
(:mod:`hpcdist.rendezvous.torchrun_env`). No MPI and no other hpcdist import
here, so the launchers stay light.
"""

from __future__ import annotations

import socket

__all__ = ["TORCHRUN_VARS", "free_port", "torchrun_values"]

#: the variables torchrun sets for every rank, which libraries written for it read
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def torchrun_values(
    rank: int, world_size: int, local_rank: int, local_world_size: int, master_addr: str, master_port: int | str
) -> dict[str, str]:
    """torchrun's variables of one rank, as strings, in :data:`TORCHRUN_VARS` order."""
    values = (rank, world_size, local_rank, local_world_size, master_addr, master_port)
    return {name: str(value) for name, value in zip(TORCHRUN_VARS, values, strict=True)}


def free_port(host: str = "") -> int:
    """A TCP port that was free on ``host`` (all interfaces when empty) a moment ago.

    Another process may take it before the caller binds it; the callers
    (a rendezvous store's ``MASTER_PORT``) fail loudly when that happens.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])
