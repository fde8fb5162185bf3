"""``spawn(fn, args, nprocs)``: start ranks without an MPI launcher, like
``torch.multiprocessing.spawn``.

Each child is a fresh interpreter (multiprocessing's ``spawn`` start method)
with the ``env://`` variables set: ``MASTER_ADDR`` (``127.0.0.1`` unless
given), ``MASTER_PORT`` (a free port unless given), ``RANK``, ``WORLD_SIZE``,
``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``. It calls ``fn(rank, *args)``; inside,
``hpcdist.init_process_group("mpi", init_method="env://")`` joins the ranks
into one MPI world through the env:// rendezvous.

A launcher's own variables (``PMI_*``, ``OMPI_*``, ``SLURM_PROCID``, ...) are
removed from the children's environment, so that children of a rank started
by ``mpiexec``/``srun`` do not take themselves for that rank.

An exception in a child is re-raised in the parent as
:class:`ProcessRaisedException` carrying the child's traceback; a child that
ends with a failing status without one (``sys.exit(3)``, ``os._exit``, a
signal) gives :class:`ProcessExitedException` with its ``exit_code``, as
torch's does; either way the other children are terminated. ``timeout``
bounds the whole run.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import multiprocessing.connection
import operator
import os
import signal
import tempfile
import time
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from hpcdist._launchenv import free_port, torchrun_values
from hpcdist.errors import DistError, DistTimeoutError

__all__ = ["ProcessContext", "ProcessExitedException", "ProcessRaisedException", "spawn"]

#: variables of launchers that must not leak into spawned children
_SCRUB_PREFIXES = ("PMI_", "PMIX_", "OMPI_", "HYDRA_", "HYDI_", "PALS_", "MPI_LOCAL", "JSM_NAMESPACE_", "FLUX_TASK_")
_SCRUB_NAMES = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_GTIDS")
_TERMINATE_GRACE_S = 5.0
_LONGEST_WAIT_S = 86400.0  # one join() waits at most a day (spawn's join=True waits again)


class ProcessException(DistError):
    """A spawned process failed; ``error_index`` is its rank, ``pid`` its process id."""

    def __init__(self, msg: str, error_index: int, pid: int | None) -> None:
        super().__init__(msg)
        self.msg = msg
        self.error_index = error_index
        self.pid = pid

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.pid)


class ProcessRaisedException(ProcessException):
    """A spawned process raised; the message ends with the child's traceback."""


class ProcessExitedException(ProcessException):
    """A spawned process exited non-zero without a Python exception (signal, ``os._exit``)."""

    def __init__(
        self, msg: str, error_index: int, error_pid: int | None, exit_code: int, signal_name: str | None = None
    ):
        super().__init__(msg, error_index, error_pid)
        self.exit_code = exit_code
        self.signal_name = signal_name

    def __reduce__(self):
        return type(self), (self.msg, self.error_index, self.pid, self.exit_code, self.signal_name)


def _child(fn: Callable[..., Any], rank: int, args: tuple, env: dict[str, str], error_file: str) -> None:
    """Body of each child: set the env:// variables, run ``fn(rank, *args)``, report failure."""
    for name in list(os.environ):
        if name.startswith(_SCRUB_PREFIXES) or name in _SCRUB_NAMES:
            del os.environ[name]
    os.environ.update(env)
    try:
        fn(rank, *args)
    except KeyboardInterrupt:
        pass  # the parent is stopping everyone
    except SystemExit as exc:
        if exc.code not in (None, 0):  # an exit status, not an error: the parent raises ProcessExitedException
            Path(error_file + ".exit").write_text(f"SystemExit: {exc.code}")
            raise
    except BaseException:
        Path(error_file).write_text(traceback.format_exc())
        raise SystemExit(1) from None


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    """Set ``env`` (and scrub launcher variables) in os.environ while a child starts."""
    saved = dict(os.environ)
    try:
        for name in list(os.environ):
            if name.startswith(_SCRUB_PREFIXES) or name in _SCRUB_NAMES:
                del os.environ[name]
        os.environ.update(env)
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


class ProcessContext:
    """The running children of :func:`spawn` (``join=False`` returns it)."""

    def __init__(self, processes: list, error_dir: tempfile.TemporaryDirectory, deadline: float | None) -> None:
        self.processes = processes
        self._error_dir = error_dir
        self._deadline = deadline
        self._sentinels = {p.sentinel: i for i, p in enumerate(processes)}

    def pids(self) -> list[int]:
        """Process ids of the children, in rank order."""
        return [int(p.pid) for p in self.processes]

    def _terminate_all(self, grace_period: float | None = None) -> None:
        """SIGTERM the children still running (after ``grace_period`` s to end by themselves), SIGKILL later."""
        if grace_period is not None:
            end = time.monotonic() + grace_period
            for p in self.processes:
                p.join(max(0.0, end - time.monotonic()))
        for p in self.processes:
            if p.is_alive():
                p.terminate()
        end = time.monotonic() + (_TERMINATE_GRACE_S if grace_period is None else grace_period)
        for p in self.processes:
            p.join(max(0.0, end - time.monotonic()))
            if p.is_alive():
                p.kill()
                p.join()

    def _raise_for(self, rank: int, grace_period: float | None = None) -> None:
        proc = self.processes[rank]
        error_file = Path(self._error_dir.name, f"{rank}.err")
        self._terminate_all(grace_period)
        text = error_file.read_text() if error_file.exists() else ""
        exit_file = Path(f"{error_file}.exit")
        how = f" ({exit_file.read_text()})" if exit_file.exists() else ""  # sys.exit's argument
        self._error_dir.cleanup()
        if text:
            msg = f"\n\n-- Process {rank} terminated with the following error:\n{text}"
            raise ProcessRaisedException(msg, rank, proc.pid)
        code = int(proc.exitcode or 0)
        if code < 0:
            try:
                name = signal.Signals(-code).name
            except ValueError:
                name = f"<unknown signal {-code}>"
            raise ProcessExitedException(f"process {rank} terminated with signal {name}", rank, proc.pid, code, name)
        raise ProcessExitedException(f"process {rank} terminated with exit code {code}{how}", rank, proc.pid, code)

    def join(self, timeout: float | None = None, grace_period: float | None = None) -> bool:
        """Wait up to ``timeout`` s; True when all children ended well, False while some run.

        Raises :class:`ProcessRaisedException` / :class:`ProcessExitedException`
        when a child failed (the others are terminated first: after
        ``grace_period`` s to end by themselves when given, as torch's
        ``join``; SIGKILL follows SIGTERM after ``grace_period``, else 5 s), and
        :class:`~hpcdist.errors.DistTimeoutError` past spawn's ``timeout``.
        """
        if not self._sentinels:
            return True
        wait_for = timeout
        if self._deadline is not None:
            left = max(0.0, self._deadline - time.monotonic())
            wait_for = left if wait_for is None else min(wait_for, left)
        if wait_for is not None:  # select() takes no longer wait (OverflowError): return False, the caller waits again
            wait_for = min(wait_for, _LONGEST_WAIT_S)
        ready = multiprocessing.connection.wait(list(self._sentinels), timeout=wait_for)
        for sentinel in ready:
            rank = self._sentinels.pop(sentinel)
            self.processes[rank].join()
            if self.processes[rank].exitcode != 0:
                self._raise_for(rank, grace_period)
        if not self._sentinels:
            self._error_dir.cleanup()
            return True
        if self._deadline is not None and time.monotonic() >= self._deadline:
            self._terminate_all()
            self._error_dir.cleanup()
            raise DistTimeoutError(f"spawn: processes still running after the timeout; terminated {self.pids()}")
        return False


def _integer(value: Any, name: str, expected: str, low: int, high: int | None = None) -> int:
    """``value`` as an int in ``low..high``, else TypeError (not an integer) / ValueError naming ``name``."""
    if isinstance(value, bool) or not hasattr(value, "__index__"):
        raise TypeError(f"spawn: {name} must be {expected}, got {value!r} ({type(value).__name__})")
    number = operator.index(value)
    if number < low or (high is not None and number > high):
        raise ValueError(f"spawn: {name} must be {expected}, got {value!r}")
    return number


def spawn(
    fn: Callable[..., Any],
    args: tuple = (),
    nprocs: int = 1,
    join: bool = True,
    daemon: bool = False,
    start_method: str = "spawn",
    *,
    master_addr: str = "127.0.0.1",
    master_port: int | None = None,
    timeout: float | None = None,
) -> ProcessContext | None:
    """Start ``nprocs`` processes running ``fn(rank, *args)`` with env:// variables.

    Like ``torch.multiprocessing.spawn`` (same positional parameters); adds
    ``master_addr``/``master_port`` (default ``127.0.0.1`` and a free port)
    and ``timeout`` (seconds for the whole run; past it the children are
    terminated and :class:`~hpcdist.errors.DistTimeoutError` is raised).
    ``fn`` must be picklable (defined at module top level). With
    ``join=True`` returns None once all children ended well; with
    ``join=False`` returns a :class:`ProcessContext`.
    """
    if not callable(fn):
        raise TypeError(f"spawn: fn must be callable, got {type(fn).__name__}")
    nprocs = _integer(nprocs, "nprocs", "an int >= 1", 1)
    if not isinstance(args, tuple):
        raise TypeError(f"spawn: args must be a tuple, got {type(args).__name__}")
    if timeout is not None and (not isinstance(timeout, (int, float)) or isinstance(timeout, bool)):
        raise TypeError(f"spawn: timeout must be a number of seconds > 0 or None, got {timeout!r}")
    if timeout is not None and not timeout > 0:
        raise ValueError(f"spawn: timeout must be a number of seconds > 0 or None, got {timeout!r}")
    if not isinstance(master_addr, str) or not master_addr.strip():
        raise ValueError(f"spawn: master_addr must be a host name or address of this machine, got {master_addr!r}")
    if master_port is not None:
        master_port = _integer(master_port, "master_port", "an int in 1..65535 or None (a free port)", 1, 65535)
    ctx: Any = multiprocessing.get_context(start_method)
    try:
        port = master_port if master_port is not None else free_port(master_addr)
    except OSError as exc:  # the children run here: rank 0's store binds master_addr on this host
        raise ValueError(
            f"spawn: master_addr must be a host name or address of this machine (the children run here), "
            f"got {master_addr!r}: {exc}"
        ) from None
    error_dir = tempfile.TemporaryDirectory(prefix="hpcdist-spawn-")
    processes = []
    for rank in range(nprocs):
        env = torchrun_values(rank, nprocs, rank, nprocs, master_addr, port)
        error_file = os.path.join(error_dir.name, f"{rank}.err")
        proc = ctx.Process(target=_child, args=(fn, rank, args, env, error_file), daemon=daemon)
        with _environ(env):  # the child's interpreter starts with these (its __main__ may import mpi4py)
            proc.start()
        processes.append(proc)
    deadline = None if timeout is None or timeout == math.inf else time.monotonic() + timeout  # inf: no bound
    context = ProcessContext(processes, error_dir, deadline)
    if not join:
        return context
    try:
        while not context.join():
            pass
    except BaseException:
        context._terminate_all()
        raise
    return None
