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
    "DistStoreTimeoutError",
    "DistTimeoutError",
    "DtypeMismatchError",
    "TIMEOUT_FIX",
    "QueueEmptyError",
    "describe_op",
    "timeout_message",
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


class DistStoreTimeoutError(DistTimeoutError, DistStoreError):
    """A store's blocking call (``get``, ``wait``, ``barrier``, a master waiting for its workers) ran out of time.

    A :class:`DistTimeoutError` (and ``TimeoutError``) as every hpcdist timeout, and a
    :class:`DistStoreError` as torch's stores raise there, so ``except DistStoreError`` written for
    torch catches it too.
    """


class DtypeMismatchError(TypeError, ValueError):
    """The arrays of one call have different dtypes (an argument error, raised before any message moves): a
    TypeError, and the ValueError torch.distributed raises there (its ``_ensure_all_tensors_same_dtype``), so
    ``except ValueError`` written for torch catches it too."""


class QueueEmptyError(DistStoreError):
    """``Store.queue_pop(key, block=False)`` found the queue empty."""


#: what to do about a timeout that is only slowness (part of every timeout message that raises)
TIMEOUT_FIX = "raise the timeout with init_process_group(timeout=...) or HPCDIST_TIMEOUT if it is just slow"


def describe_op(what: object) -> str:
    """An operation as timeout messages name it: ``what`` itself, or ``(op, group)`` as ``"op on <group>"``."""
    if isinstance(what, tuple) and len(what) == 2:
        return f"{what[0]} on {what[1]!r}"
    return str(what)


def timeout_message(what: object, limit: float, *, where: str = "", on: str = "", then: str = "") -> str:
    """The one description of an operation that outlived its timeout.

    Every timeout report (a DistTimeoutError raised, or a watchdog's message
    before it ends the job) reads ``"<op> on <group><where> did not
    complete<on> within <limit>s: a peer may have died, be stuck, or have
    called a different operation<then>"``.

    Args:
        what: the operation: a str, or ``(op name, group)``.
        limit: the timeout that passed, in seconds.
        where: after the operation's name, e.g. ``" (NCCL)"``, ``" (in thread 'x')"``.
        on: after "did not complete", e.g. ``" on the GPU"``.
        then: what happens now or what to do, from its own punctuation on (``"; " + TIMEOUT_FIX``).

    Returns:
        The message, without a trailing newline.
    """
    return (
        f"{describe_op(what)}{where} did not complete{on} within {limit:g}s: "
        f"a peer may have died, be stuck, or have called a different operation{then}"
    )
