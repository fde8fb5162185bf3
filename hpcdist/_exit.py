"""How a process ends after a timeout left an MPI operation in flight.

``MPI_Finalize`` synchronizes with every process of the job (the embedded
MPICH waits in a PMI barrier), so a process that caught a
:class:`~hpcdist.errors.DistTimeoutError` of a collective and exits would sit
in it until the stuck peer arrives -- forever, if it never does. A timeout
that leaves an operation in flight (every collective, a send, a step of
init; not a receive, which is cancelled) *poisons* the process: at exit,
after every ``atexit`` handler ran, mpi4py ends the job with
``MPI_Abort(COMM_WORLD, 124)`` instead of finalizing (its documented
``mpi4py.run`` mechanism). Under a launcher that ends every rank at once;
in a launcher-free world it ends this process.

The same mechanism ends the job when a rank leaves through ``sys.exit`` with
a failing status while the process group is up (:func:`fail_at_exit`): the
process would otherwise wait in ``MPI_Finalize`` for peers that wait for it
in a collective, until their timeout.
"""

from __future__ import annotations

import atexit

__all__ = ["POISON_EXIT_STATUS", "exit_status", "fail_at_exit", "is_poisoned", "poison"]

#: The exit status of a job ended at exit because a timeout left an MPI operation in flight (as ``timeout(1)``
#: and the block-mode watchdog).
POISON_EXIT_STATUS = 124

_POISONED: list[str] = []
_STATUS: list[int] = []  # the status of that abort


def poison(reason: str) -> None:
    """Record that an MPI operation timed out and is still in flight; at exit, abort instead of finalizing."""
    _abort_at_exit_with(POISON_EXIT_STATUS, reason)


def _abort_at_exit_with(status: int, reason: str) -> bool:
    """At exit, ``MPI_Abort(status)`` instead of finalizing; False when an earlier call set it already."""
    if _POISONED:
        return False
    _POISONED.append(reason)
    _STATUS.append(status)
    from mpi4py import MPI

    setter = getattr(MPI, "_set_abort_status", None)
    if setter is not None:
        setter(status)
    else:  # pragma: no cover - older mpi4py: abort from an atexit handler of our own
        atexit.register(_abort_at_exit)
    return True


def exit_status(code: object) -> int:
    """The process status Python gives ``sys.exit(code)``: 0 for None, the int, else 1 (a message)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    return 1


def fail_at_exit(status: int) -> bool:
    """At exit, after every ``atexit`` handler, end the job with ``MPI_Abort(status)`` instead of finalizing.

    False (nothing done) for status 0, or when the process is set to abort
    already (a timeout's poisoning, status 124, or an earlier call).
    """
    return status != 0 and _abort_at_exit_with(status, f"exit status {status}")


def is_poisoned() -> bool:
    """Whether a timeout left an MPI operation in flight in this process."""
    return bool(_POISONED)


def _abort_at_exit() -> None:  # pragma: no cover - older mpi4py only
    from ._watchdog import abort_job

    abort_job(
        f"hpcdist: {_POISONED[0]}; ending the job with MPI_Abort instead of waiting in MPI_Finalize\n", _STATUS[0]
    )
