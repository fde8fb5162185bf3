"""Parse and check the fields of a rendezvous: rank, world size, host, port.

Every check raises :class:`ValueError` naming the field, the value given and
what to do, before anything blocks (no socket is opened here except the name
lookup of a host).
"""

from __future__ import annotations

import os
import socket
from urllib.parse import parse_qsl

__all__ = [
    "RankTypeError",
    "check_port",
    "check_rank_world",
    "check_rank_world_types",
    "env_int",
    "parse_int",
    "query_to_dict",
    "resolve_host",
]


def query_to_dict(query: str, *, scheme: str) -> dict[str, str]:
    """``"rank=0&world_size=2"`` -> ``{"rank": "0", "world_size": "2"}``.

    A pair without ``=`` raises ValueError naming it.
    """
    for pair in filter(None, query.split("&")):
        if "=" not in pair:
            raise ValueError(
                f"{scheme}:// rendezvous: malformed URL query parameter {pair!r}; "
                f"write it as name=value, e.g. ?rank=0&world_size=2"
            )
    return dict(parse_qsl(query, keep_blank_values=True))


def parse_int(raw: str, *, field: str, where: str) -> int:
    """``int(raw)`` or a ValueError that names ``field`` and where it came from."""
    try:
        return int(str(raw).strip())
    except ValueError:
        raise ValueError(f"{field} must be an integer, got {raw!r} (from {where})") from None


def env_int(name: str) -> int | None:
    """The integer in environment variable ``name``; None when unset or empty."""
    raw = os.environ.get(name)
    if raw is None or not raw.strip():
        return None
    return parse_int(raw, field=name, where=f"environment variable {name}")


class RankTypeError(TypeError, RuntimeError):
    """A ``rank``/``world_size`` argument that is not an int.

    A TypeError like every other argument of the wrong type in hpcdist, and a
    RuntimeError because that is what torch's ``rendezvous()`` raises for it.
    """


def check_rank_world_types(rank: object, world_size: object) -> None:
    """The one type check of ``rank=``/``world_size=`` arguments (bools refused): RankTypeError naming it."""
    for name, value in (("rank", rank), ("world_size", world_size)):
        if isinstance(value, bool) or not isinstance(value, int):
            raise RankTypeError(f"{name} must be an integer, got {type(value).__name__} ({value!r:.60})")


def check_rank_world(rank: int, world_size: int, *, scheme: str) -> None:
    """``world_size >= 1`` and ``0 <= rank < world_size``, else ValueError.

    ``scheme`` names the rendezvous in the message: ``"env"`` gives
    ``env:// rendezvous: ...``; a label ending in ``=`` (``"store="``) is used as is.
    """
    label = scheme if scheme.endswith("=") else f"{scheme}://"
    if world_size < 1:
        raise ValueError(
            f"{label} rendezvous: world_size must be >= 1 (the number of processes), got {world_size}; "
            f"set WORLD_SIZE or pass world_size="
        )
    if not 0 <= rank < world_size:
        raise ValueError(
            f"{label} rendezvous: rank must be in [0, world_size) = [0, {world_size}), got {rank}; "
            f"set RANK or pass rank="
        )


def check_port(port: int, *, field: str, scheme: str) -> int:
    """A TCP port every rank can connect to: 1..65535."""
    if not 1 <= port <= 65535:
        raise ValueError(
            f"{scheme}:// rendezvous: {field} must be a TCP port in 1..65535 that rank 0 can listen on, got {port}"
        )
    return port


def resolve_host(host: str, *, field: str, scheme: str) -> str:
    """Check that ``host`` resolves to an address; return it unchanged."""
    if not host:
        raise ValueError(f"{scheme}:// rendezvous: {field} is empty; give the host name or address of rank 0")
    try:
        socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        raise ValueError(
            f"{scheme}:// rendezvous: {field} {host!r} does not resolve to an address ({exc}); "
            f"give the host name or IP address of rank 0"
        ) from None
    return host
