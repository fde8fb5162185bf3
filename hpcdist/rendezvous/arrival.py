"""Wait, within a deadline, until every process of a rendezvous has announced itself.

The store is served by rank 0's process. When rank 0 gives up (its own
timeout) its server goes away, so the others keep a snapshot of who had
arrived (refreshed about once a second while they wait) and can still say
how many of how many joined.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable
from datetime import timedelta
from typing import TYPE_CHECKING

from hpcdist._ranklist import MESSAGE_LIMIT, ranks_text
from hpcdist.errors import DistNetworkError, DistTimeoutError

if TYPE_CHECKING:
    from hpcdist.store import Store

__all__ = ["Deadline", "StoreLostError", "arrive", "is_lost_server"]

#: How long one store.wait lasts before the snapshot of arrivals is refreshed.
_SLICE = 1.0


def _torch_error(name: str) -> tuple[type, ...]:
    """``torch.distributed.<name>`` when torch is loaded (the torch backend passes torch's store), else ()."""
    cls = getattr(sys.modules.get("torch.distributed"), name, None)
    return (cls,) if isinstance(cls, type) else ()


class StoreLostError(DistTimeoutError):
    """A wait of the rendezvous ended because the store's server went away (rank 0 gave up, failed or left).

    Internal: :func:`~hpcdist.rendezvous.ports.join_over_ports` tells it from a plain timeout
    (it may join again at a new server) and raises a DistTimeoutError with its message.
    """


def _is_lost_server(exc: BaseException) -> bool:
    """The store's server went away: hpcdist's stores raise DistNetworkError, torch's its own DistNetworkError."""
    if isinstance(exc, TimeoutError):  # an OSError too, but only slow
        return False
    return isinstance(exc, (DistNetworkError, OSError, *_torch_error("DistNetworkError")))


def is_lost_server(exc: BaseException) -> bool:
    """``exc`` says the store's server went away: a store's own error, or :class:`StoreLostError` from a wait."""
    return isinstance(exc, StoreLostError) or _is_lost_server(exc)


def _is_timeout(exc: BaseException) -> bool:
    """A wait that ran out: hpcdist's stores raise DistTimeoutError (a TimeoutError), torch's a DistStoreError."""
    return isinstance(exc, (TimeoutError, *_torch_error("DistStoreError")))


class Deadline:
    """A fixed point in time and waits on a store that end there."""

    def __init__(self, timeout: timedelta) -> None:
        self.total = timeout.total_seconds()
        self.end = time.monotonic() + self.total

    def left(self) -> float:
        """Seconds until the deadline (negative once passed)."""
        return self.end - time.monotonic()

    def wait(
        self,
        store: Store,
        keys: list[str],
        message: Callable[[bool], str],
        refresh: Callable[[], None] | None = None,
    ) -> None:
        """``store.wait(keys)`` until the deadline, calling ``refresh`` between slices.

        Raises DistTimeoutError(``message(lost)``) when the deadline passes, or its
        subclass StoreLostError when the store's server goes away (``lost=True``:
        rank 0 gave up or died).
        """
        step = self.total if refresh is None else _SLICE
        while True:
            left = self.left()
            if left <= 0:
                raise DistTimeoutError(message(False))
            try:
                store.wait(keys, timedelta(seconds=max(0.001, min(left, step))))
                return
            except Exception as exc:
                if _is_lost_server(exc):
                    raise StoreLostError(message(True)) from None
                if not _is_timeout(exc):
                    raise
            if refresh is not None:
                try:
                    refresh()
                except Exception as exc:
                    if _is_lost_server(exc) or isinstance(exc, TimeoutError):  # no reply: as good as gone
                        raise StoreLostError(message(True)) from None
                    raise


def arrive(store: Store, prefix: str, rank: int, world_size: int, deadline: Deadline) -> None:
    """Announce ``rank`` under ``prefix`` and wait until all ``world_size`` did.

    SPMD: every rank 0..world_size-1 calls it once with the same ``prefix``.
    Raises DistTimeoutError "k of N processes joined (missing rank(s): ...)"
    when some never come; ValueError when more than ``world_size`` come.
    """
    who, count_key, all_key = f"{prefix}/who", f"{prefix}/count", f"{prefix}/all"
    store.append(who, f"{rank} ")
    count = store.add(count_key, 1)
    if count > world_size:
        raise ValueError(
            f"rendezvous: {count} processes joined for world_size={world_size}; two processes were given "
            f"the same rank, or the store is shared with another job (use a fresh MASTER_PORT or file)"
        )
    if count == world_size:
        store.set(all_key, "1")
    seen: dict[str, object] = {"count": count, "ranks": None}

    def refresh() -> None:
        # every waiting rank refreshes each second: who arrived (a list of them all, ~20 KB at 4096 ranks) is
        # fetched again only when more did, not each second from every rank while they wait for a late one
        count = store.add(count_key, 0)
        if count != seen["count"] or seen["ranks"] is None:
            seen["ranks"] = {int(x) for x in store.get(who).split()}
        seen["count"] = count

    def message(lost: bool) -> str:
        if not lost:
            try:
                refresh()
            except Exception:
                lost = True
        ranks = seen["ranks"]
        missing = "?"
        if isinstance(ranks, set):
            missing = ranks_text((r for r in range(world_size) if r not in ranks), limit=MESSAGE_LIMIT)
        why = (
            "the rendezvous store went away (rank 0, which serves it, gave up or failed); last seen: "
            if lost
            else f"rendezvous timed out after {deadline.total:g} s: "
        )
        return (
            f"{why}{seen['count']} of {world_size} processes joined (missing rank(s): {missing}); start all "
            f"{world_size} processes with the same MASTER_ADDR/MASTER_PORT (or URL) and distinct RANK "
            f"0..{world_size - 1}, or raise the timeout"
        )

    deadline.wait(store, [all_key], message, refresh)
