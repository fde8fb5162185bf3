"""The rendezvous scheme registry: ``register_rendezvous_handler`` and ``rendezvous``.

Same semantics as ``torch.distributed.rendezvous``: a handler is a generator
function ``handler(url, **kwargs)`` that yields ``(store, rank, world_size)``;
``rendezvous(url, rank, world_size, **kwargs)`` folds ``rank`` and
``world_size`` into the URL query and calls the handler of the URL's scheme.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any
from urllib.parse import urlparse, urlunparse

from hpcdist.rendezvous.fields import check_rank_world_types, query_to_dict

if TYPE_CHECKING:
    from hpcdist.store import Store

__all__ = ["RendezvousHandler", "register_rendezvous_handler", "registered_schemes", "rendezvous", "scheme_of"]

RendezvousHandler = Callable[..., Iterator[tuple["Store", int, int]]]

_handlers: dict[str, RendezvousHandler] = {}
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*$")


def register_rendezvous_handler(scheme: str, handler: RendezvousHandler) -> None:
    """Register ``handler`` for URLs ``scheme://...``.

    ``handler(url, **kwargs)`` must be a generator function that yields
    ``(store, rank, world_size)``. Raises ``ValueError`` for a malformed
    scheme name, ``TypeError`` for a handler that is not callable and
    ``RuntimeError`` (as torch) when the scheme is already registered.
    """
    if not isinstance(scheme, str) or not _SCHEME.match(scheme):
        raise ValueError(
            f"register_rendezvous_handler: scheme must be a URL scheme name such as 'mytcp' "
            f"(a letter, then letters, digits, '+', '-', '.'), got {scheme!r}"
        )
    if not callable(handler):
        raise TypeError(
            f"register_rendezvous_handler: handler must be a generator function handler(url, **kwargs) "
            f"yielding (store, rank, world_size), got {type(handler).__name__}"
        )
    key = scheme.lower()
    if key in _handlers:
        raise RuntimeError(f"Rendezvous handler for {key}:// already registered")
    _handlers[key] = handler


def registered_schemes() -> tuple[str, ...]:
    """The schemes with a handler, sorted."""
    return tuple(sorted(_handlers))


def scheme_of(url: str) -> str:
    """The scheme of ``url`` in lower case; ValueError when it has none."""
    scheme = urlparse(url).scheme.lower()
    if not scheme:
        raise ValueError(
            f"init_method {url!r} has no scheme; use one of {', '.join(s + '://' for s in registered_schemes())}"
        )
    return scheme


def _with_rank_world(url: str, rank: int, world_size: int) -> str:
    """``url`` with ``rank`` and ``world_size`` (when not -1) added to its query."""
    if rank == -1 and world_size == -1:
        return url
    result = urlparse(url)
    query = query_to_dict(result.query, scheme=result.scheme)
    if "rank" in query or "world_size" in query:
        raise ValueError(
            f"The url: {url} has node-specific arguments(rank, world_size) already; "
            f"pass them either in the URL or as arguments, not both"
        )
    if rank != -1:
        query["rank"] = str(rank)
    if world_size != -1:
        query["world_size"] = str(world_size)
    return urlunparse(result._replace(query="&".join(f"{k}={v}" for k, v in query.items())))


def rendezvous(url: str, rank: int = -1, world_size: int = -1, **kwargs: Any) -> Iterator[tuple[Store, int, int]]:
    """Start the rendezvous for ``url``: a generator of ``(store, rank, world_size)``.

    SPMD: every process of the job calls it with the same URL (its own rank).
    ``rank``/``world_size`` of -1 mean "not given here" (the handler takes
    them from the URL query or, for ``env://``, the environment). Extra
    keyword arguments (``timeout=``) go to the handler.
    """
    if not isinstance(url, str | bytes):
        raise RuntimeError(f"`url` must be a string. {type(url)}: {url}")
    if isinstance(url, bytes):
        url = url.decode()
    check_rank_world_types(rank, world_size)
    scheme = scheme_of(url)
    handler = _handlers.get(scheme)
    if handler is None:
        raise ValueError(
            f"No rendezvous handler for {scheme}:// (init_method={url!r}); registered: "
            f"{', '.join(s + '://' for s in registered_schemes())}. "
            f"Register one with hpcdist.register_rendezvous_handler"
        )
    return handler(_with_rank_world(url, int(rank), int(world_size)), **kwargs)
