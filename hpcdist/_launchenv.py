"""What a launcher hands each rank: torchrun's variables, and a free port for ``MASTER_PORT``.

Shared by ``hpcdist run`` (:mod:`hpcdist.launch.run`, :mod:`hpcdist.launch._bootstrap`),
:func:`hpcdist.spawn` and the export after init
(:mod:`hpcdist.rendezvous.torchrun_env`). No MPI and no other hpcdist import
here, so the launchers stay light.
"""

from __future__ import annotations

import random
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

    Chosen below the kernel's ephemeral range (``net.ipv4.ip_local_port_range``),
    from which every ``bind(0)`` and outgoing connection takes its port: MPI
    libraries open such sockets by the dozen while they start, and one of them
    could otherwise take a ``MASTER_PORT`` picked here before the rendezvous
    store binds it. A program that binds ports below that range on purpose
    may still take it; the callers (a rendezvous store) fail loudly then.
    """
    low, _ = _ephemeral_range()
    rng = random.Random()
    for _ in range(64):
        port = rng.randrange(_LOWEST_PORT, max(_LOWEST_PORT + 1, low))
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind((host, port))
            except OSError:
                continue
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:  # the range below is full: any free port
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


#: the lowest port free_port picks (below: well-known and registered services' ports)
_LOWEST_PORT = 20000


def _ephemeral_range(path: str = "/proc/sys/net/ipv4/ip_local_port_range") -> tuple[int, int]:
    """The kernel's ephemeral port range (Linux's default where it cannot be read)."""
    try:
        with open(path) as f:
            low, high = (int(v) for v in f.read().split()[:2])
        return low, high
    except (OSError, ValueError):
        return 32768, 60999
