"""The exception hierarchy of hpcdist.

Mirrors ``torch.distributed``: every failure of the distributed machinery is a
:class:`DistError` (a :class:`RuntimeError`); argument errors are plain
:class:`ValueError` / :class:`TypeError` that name the argument, what was
expected and what was given.
"""

from __future__ import annotations

__all__ = [
    "DistBackendError",
    "DistError",
    "DistNetworkError",
    "DistStoreError",
    "DistTimeoutError",
    "QueueEmptyError",
]


class DistError(RuntimeError):
    """Base class of every error raised by the distributed machinery."""


class DistBackendError(DistError):
    """The communication backend (MPI, NCCL) failed."""


class DistNetworkError(DistError):
    """A network operation failed (bind, connect, a peer closed a socket)."""


class DistStoreError(DistError):
    """A key-value store operation failed."""


class DistTimeoutError(DistError, TimeoutError):
    """A blocking operation did not complete within its timeout.

    It is both a :class:`DistError` and a builtin :class:`TimeoutError`, so
    ``except TimeoutError`` catches it too.
    """


class QueueEmptyError(DistStoreError):
    """``Store.queue_pop(key, block=False)`` found the queue empty."""
