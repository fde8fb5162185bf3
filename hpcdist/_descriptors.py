"""File descriptors for servers that rank 0 runs for every rank (the TCP store, liveness).

A job's rank 0 holds a connection from each rank to its store server (two:
the rank's store and its flight-recorder watcher) and, in a launcher-free
world, one liveness connection each: about three descriptors per rank. The
soft ``RLIMIT_NOFILE`` many systems start processes with is 1024, so a job
of a few hundred ranks ran rank 0 out of descriptors. Where ``accept`` fails
with ``EMFILE``, those servers call :func:`more_descriptors` and try again,
as Go's runtime raises its soft limit to the hard one at start; only where
the hard limit is reached do they report it, with :func:`limits_text`.

``resource`` is imported with this module, not when descriptors run out: by
then importing it (opening its extension module) fails with ``EMFILE`` too.
"""

from __future__ import annotations

try:
    import resource
except ImportError:  # pragma: no cover - not POSIX
    resource = None  # type: ignore[assignment]

__all__ = ["limits_text", "more_descriptors"]

_CAP = 1 << 20  # the kernel's default fs.nr_open: a soft limit above it is refused


def more_descriptors() -> tuple[int, int] | None:
    """Double this process's soft ``RLIMIT_NOFILE``, up to its hard limit.

    Returns ``(old, new)``, or None where the soft limit is already at the hard
    one (or the platform has no such limit, or the kernel refuses).
    """
    if resource is None:  # pragma: no cover - not POSIX
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    cap = _CAP if hard == resource.RLIM_INFINITY else min(hard, _CAP)
    if soft == resource.RLIM_INFINITY or soft >= cap:
        return None
    new = min(cap, max(2 * soft, soft + 64))
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (new, hard))
    except (ValueError, OSError):
        return None
    return soft, new


def limits_text() -> str:
    """The open-file limits of this process, and what to do about them, for an error message."""
    if resource is None:  # pragma: no cover - not POSIX
        return "its open-file limit"
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return (
        f"its open-file limit (RLIMIT_NOFILE soft {soft}, hard {hard}): raise the hard limit where the job starts "
        "(`ulimit -n` in the job script, `LimitNOFILE` of the service, or limits.conf)"
    )
