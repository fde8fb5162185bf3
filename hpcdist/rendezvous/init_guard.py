"""A bound on ``MPI_Init`` under a launcher: a rank that never starts MPI must not leave the others there forever.

Under ``mpiexec`` (MPICH's Hydra) or ``srun``, ``MPI_Init`` waits until every
rank of the launch has started MPI. A rank that ends before it — an exception
before ``init_process_group``, a ``sys.exit``, an ``os._exit`` — does not end
the job: Hydra and Slurm (without ``--kill-on-bad-exit``) leave the other
ranks waiting in ``MPI_Init`` until the batch job's time limit. No
``MPI_Abort`` is possible there, and mpi4py holds the GIL throughout, so no
Python thread or signal handler runs either.

:func:`bounded_mpi_init` starts, just before MPI is initialized, a small
watcher process (``timeout SECONDS cat`` on a pipe, spawned with
``posix_spawn``: about a millisecond, no Python start-up). When MPI is up the
pipe is closed and the watcher ends; when this process dies the pipe closes
too. If ``MPI_Init`` is still waiting when the time is up, the watcher writes
what happened on this rank's stderr and ends it with ``SIGKILL``, which the
launcher sees as a failed rank: it ends the whole job.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import sys
import threading
from collections.abc import Iterator

__all__ = ["bounded_mpi_init"]


def _message(seconds: float, rank: int) -> str:
    return (
        f"hpcdist: MPI_Init on rank {rank} (pid {os.getpid()}) did not complete within {seconds:g}s "
        "(init_process_group's timeout). MPI_Init waits until every rank of the launch has started MPI: a rank "
        "that ended before init_process_group (look above for its error) or never started leaves the others "
        "waiting here, and the launcher does not end the job. Ending this rank (SIGKILL), so the launcher ends the job."
    )


@contextlib.contextmanager
def bounded_mpi_init(seconds: float, declared: tuple[int, int] | None) -> Iterator[None]:
    """Within the block, ``MPI_Init`` (importing ``mpi4py.MPI``) may wait ``seconds`` at most; see the module.

    ``declared``: (rank, size) as the launcher's variables state them. Does
    nothing when MPI is already imported, when the launch has one rank or
    states no size (None: no launcher, and a singleton ``MPI_Init`` waits
    for nobody), or where ``posix_spawn`` or coreutils' ``timeout`` is missing.
    """
    if "mpi4py.MPI" in sys.modules or declared is None or declared[1] < 2 or seconds <= 0:
        yield  # (checked first: launcher-free init, the one measured against gloo's, looks up nothing)
        return
    tool = shutil.which("timeout")
    spawn = getattr(os, "posix_spawn", None)
    if tool is None or spawn is None:
        yield
        return
    script = (
        f"{shlex.quote(tool)} {seconds:.3f} cat >/dev/null; "
        f"[ $? -eq 124 ] && {{ printf '%s\\n' {shlex.quote(_message(seconds, declared[0]))} >&2; "
        f"kill -{int(signal.SIGKILL)} {os.getpid()}; }}"  # killed even where stderr cannot be written
    )
    read_end, write_end = os.pipe()
    try:
        actions = [(os.POSIX_SPAWN_DUP2, read_end, 0), (os.POSIX_SPAWN_CLOSE, write_end)]
        pid = spawn("/bin/sh", ["sh", "-c", script], os.environ, file_actions=actions)
    except OSError:  # no /bin/sh: go on unguarded
        os.close(read_end)
        os.close(write_end)
        yield
        return
    os.close(read_end)
    try:
        yield
    finally:
        os.close(write_end)  # the watcher's cat sees the end of its input and the watcher exits
        # reaped in the background: waiting here for the shell to start and end would add milliseconds to init
        threading.Thread(target=_reap, args=(pid,), name="hpcdist-init-guard-reaper", daemon=True).start()


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, 0)
