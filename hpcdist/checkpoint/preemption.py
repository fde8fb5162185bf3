"""Slurm preemption: a warning signal becomes a save at the next step boundary and a requeue.

Slurm sends a signal before a job's time limit or preemption when asked
(``#SBATCH --signal=B:USR1@120``: USR1 to the batch shell 120 s before the
end; the template ``jobs/slurm_requeue.sbatch`` forwards it to the ranks). The
signal handler only sets a flag; the training loop asks
:meth:`Preemption.should_stop` at step boundaries — one tiny all-reduce, so
every rank stops at the same step even when the signal reached some ranks
later — then saves and calls :meth:`Preemption.requeue`
(``scontrol requeue $SLURM_JOB_ID``). The requeued job starts the same script
again, which resumes from :func:`~hpcdist.checkpoint.latest`.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Iterable
from types import FrameType
from typing import Any

import numpy as np

__all__ = ["Preemption"]


_UNCATCHABLE = {int(signal.SIGKILL), int(signal.SIGSTOP)}


def _signal_list(signals: Any) -> list[int]:
    """``signals`` (one signal or an iterable of them) -> distinct signal numbers; ValueError naming ``signals``."""
    expect = "a signal (e.g. signal.SIGUSR1) or a non-empty iterable of catchable signals"
    if isinstance(signals, int) and not isinstance(signals, bool):
        items: list[Any] = [signals]
    elif isinstance(signals, (str, bytes)) or not isinstance(signals, Iterable):
        raise ValueError(f"Preemption: signals must be {expect}, got {signals!r}")
    else:
        items = list(signals)
    if not items:
        raise ValueError(f"Preemption: signals must be {expect}, got {signals!r} (empty)")
    valid = signal.valid_signals()
    out: list[int] = []
    for s in items:
        if isinstance(s, bool) or not isinstance(s, int) or s not in valid or int(s) in _UNCATCHABLE:
            raise ValueError(
                f"Preemption: signals must be {expect} (not SIGKILL or SIGSTOP), got {signals!r} (bad entry: {s!r})"
            )
        if int(s) not in out:
            out.append(int(s))
    return out


class Preemption:
    """Catch Slurm's warning signal(s); stop, save and requeue at a step boundary.

    Args:
        signals: the signal, or signals, that ask for a stop (default ``SIGUSR1``);
            each a signal number Python can catch (not ``SIGKILL``/``SIGSTOP``),
            else ValueError before any handler changes. Handlers are installed at
            construction (from the main thread) and restored by :meth:`uninstall`
            or on leaving a ``with`` block.
        group: the group whose ranks agree in :meth:`should_stop` (default: the world).

    Several live objects may watch the same signal: each handler also calls the
    Python handler it replaced (a function, not ``SIG_DFL``/``SIG_IGN`` or
    Python's default SIGINT handler), so every one of them sees the signal.
    :meth:`uninstall` puts back the replaced handler only while this object's
    handler is still the installed one; otherwise it just switches this object
    off in the chain and leaves the installed handler alone.

    Example::

        pre = Preemption()
        for step in range(start, steps):
            train_step()
            if pre.should_stop():          # collective: every rank, every step
                checkpoint.save(state, f"{ckpt}/step_{step + 1}")
                pre.requeue()              # rank 0 runs scontrol requeue
                break
    """

    def __init__(self, signals: int | Iterable[int] = (signal.SIGUSR1,), group: Any = None) -> None:
        sigs = _signal_list(signals)
        self._group = group
        self._flag = False
        self._active = True
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        self._installed = self._handler  # one bound-method object: compared by identity in uninstall
        try:
            for s in sigs:
                self._previous[s] = signal.signal(s, self._installed)
        except (OSError, ValueError) as e:
            for s, h in reversed(list(self._previous.items())):  # put back what was already installed
                signal.signal(s, h)
            self._previous.clear()
            self._active = False
            if isinstance(e, OSError):
                raise ValueError(
                    f"Preemption: signals must be signals Python can catch, got {signals!r} ({e.strerror or e})"
                ) from e
            raise

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        if self._active:
            self._flag = True
            self.received = signum
        prev = self._previous.get(signum)
        if callable(prev) and prev is not signal.default_int_handler:
            prev(signum, frame)  # the handler this one replaced (e.g. another Preemption's)

    @staticmethod
    def _unwind(signum: int, handler: Any) -> Any:
        """Skip switched-off Preemption handlers in the chain (what :meth:`uninstall` puts back)."""
        while True:
            owner = getattr(handler, "__self__", None)
            if not isinstance(owner, Preemption) or owner._active or signum not in owner._previous:
                return handler
            handler = owner._previous[signum]

    @property
    def requested(self) -> bool:
        """True once a signal arrived on this rank (local; no communication)."""
        return self._flag

    def request(self) -> None:
        """Ask for a stop as the signal would (for tests, or a loop's own reasons)."""
        self._flag = True

    def _member_group(self, opname: str) -> Any:
        from ..group import GroupMember, resolve_group

        pg = None if self._group is GroupMember.NON_GROUP_MEMBER else resolve_group(self._group, opname)
        if pg is None:
            raise ValueError(f"{opname}: this rank is not a member of the group; only members call it")
        return pg

    def should_stop(self) -> bool:
        """True on every rank once any rank received the signal. Collective over the group.

        Call it at the same step boundary on every rank of the group: it is one
        all-reduce (MAX) of a one-byte flag. A rank outside the group gets
        ValueError, as from :meth:`requeue`.
        """
        from .. import all_reduce
        from ..ops import ReduceOp

        pg = self._member_group("Preemption.should_stop")
        flag = np.array([1 if self._flag else 0], dtype=np.uint8)
        all_reduce(flag, op=ReduceOp.MAX, group=pg)
        if flag[0]:
            self._flag = True
        return bool(flag[0])

    @staticmethod
    def job_id() -> str | None:
        """The Slurm job id (``SLURM_JOB_ID``), or None outside Slurm."""
        return os.environ.get("SLURM_JOB_ID") or None

    @staticmethod
    def restart_count() -> int:
        """How often Slurm restarted this job (``SLURM_RESTART_COUNT``; 0 on the first run).

        Raises:
            ValueError: when ``SLURM_RESTART_COUNT`` is set but not a non-negative integer.
        """
        raw = os.environ.get("SLURM_RESTART_COUNT", "").strip()
        if not raw:
            return 0
        try:
            n = int(raw)
        except ValueError:
            n = -1
        if n < 0:
            raise ValueError(f"SLURM_RESTART_COUNT must be a non-negative integer, got {raw!r}")
        return n

    def requeue(self, scontrol: str = "scontrol") -> bool:
        """Requeue this Slurm job (group rank 0 runs ``scontrol requeue``). Collective over the group.

        Call it after the checkpoint is saved: Slurm ends the running job and
        queues it again; the script starts anew and resumes from ``latest()``.
        The job must be requeueable (``#SBATCH --requeue``).

        Args:
            scontrol: the ``scontrol`` command to run (a path when it is not on ``PATH``).

        Returns:
            True on every rank when the job was requeued; False outside Slurm.

        Raises:
            RuntimeError: on every rank when ``scontrol`` failed (its message
                included), could not be started, or ran longer than 60 s.
        """
        from .. import broadcast_object_list

        if not isinstance(scontrol, (str, os.PathLike)) or not os.fspath(scontrol):
            raise ValueError(f"Preemption.requeue: scontrol must be a command name or path, got {scontrol!r}")
        pg = self._member_group("Preemption.requeue")
        job = self.job_id()
        outcome: list[Any] = [None]
        if pg.rank() == 0:
            cmd = f"{os.fspath(scontrol)} requeue {job}"
            if job is None:
                outcome[0] = False
            else:
                try:
                    proc = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, timeout=60)
                except subprocess.TimeoutExpired:
                    outcome[0] = f"Preemption.requeue: {cmd!r} did not finish within 60 s"
                except Exception as e:  # reported on every rank, not raised on rank 0 alone
                    outcome[0] = (
                        f"Preemption.requeue: could not run {cmd!r}: {type(e).__name__}: {e} "
                        "(pass scontrol= the path of Slurm's scontrol)"
                    )
                else:
                    outcome[0] = (
                        True
                        if proc.returncode == 0
                        else f"scontrol requeue {job} failed: {proc.stderr.strip()} "
                        "(is the job requeueable? submit with --requeue)"
                    )
        broadcast_object_list(outcome, group=pg, group_src=0)
        if isinstance(outcome[0], str):
            raise RuntimeError(outcome[0])
        return bool(outcome[0])

    def uninstall(self) -> None:
        """Restore the signal handlers that were there before (idempotent).

        Where another handler replaced this object's since (say a second
        ``Preemption``), that one stays installed and this object is only
        switched off: its flag no longer changes, and the chain passes through it.
        """
        if not self._active:
            return
        self._active = False
        for s, h in self._previous.items():
            if signal.getsignal(s) is self._installed:
                signal.signal(s, self._unwind(s, h))

    def __enter__(self) -> Preemption:
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()
