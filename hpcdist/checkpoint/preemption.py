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
from types import FrameType
from typing import Any

import numpy as np

__all__ = ["Preemption"]


class Preemption:
    """Catch Slurm's warning signal(s); stop, save and requeue at a step boundary.

    Args:
        signals: the signals that ask for a stop (default ``SIGUSR1``). Handlers
            are installed at construction (from the main thread) and restored by
            :meth:`uninstall` or on leaving a ``with`` block.
        group: the group whose ranks agree in :meth:`should_stop` (default: the world).

    Example::

        pre = Preemption()
        for step in range(start, steps):
            train_step()
            if pre.should_stop():          # collective: every rank, every step
                checkpoint.save(state, f"{ckpt}/step_{step + 1}")
                pre.requeue()              # rank 0 runs scontrol requeue
                break
    """

    def __init__(self, signals: tuple[int, ...] = (signal.SIGUSR1,), group: Any = None) -> None:
        if not signals:
            raise ValueError("signals must name at least one signal, e.g. (signal.SIGUSR1,)")
        self._group = group
        self._flag = False
        self.received: int | None = None
        self._previous: dict[int, Any] = {}
        for s in signals:
            self._previous[int(s)] = signal.signal(s, self._handler)

    def _handler(self, signum: int, frame: FrameType | None) -> None:
        self._flag = True
        self.received = signum

    @property
    def requested(self) -> bool:
        """True once a signal arrived on this rank (local; no communication)."""
        return self._flag

    def request(self) -> None:
        """Ask for a stop as the signal would (for tests, or a loop's own reasons)."""
        self._flag = True

    def should_stop(self) -> bool:
        """True on every rank once any rank received the signal. Collective over the group.

        Call it at the same step boundary on every rank of the group: it is one
        all-reduce (MAX) of a one-byte flag.
        """
        from .. import all_reduce
        from ..ops import ReduceOp

        flag = np.array([1 if self._flag else 0], dtype=np.uint8)
        all_reduce(flag, op=ReduceOp.MAX, group=self._group)
        if flag[0]:
            self._flag = True
        return bool(flag[0])

    @staticmethod
    def job_id() -> str | None:
        """The Slurm job id (``SLURM_JOB_ID``), or None outside Slurm."""
        return os.environ.get("SLURM_JOB_ID") or None

    @staticmethod
    def restart_count() -> int:
        """How often Slurm restarted this job (``SLURM_RESTART_COUNT``; 0 on the first run)."""
        return int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)

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
            RuntimeError: on every rank when ``scontrol`` failed (its message included).
        """
        from .. import broadcast_object_list
        from ..group import resolve_group

        pg = resolve_group(self._group, "Preemption.requeue")
        if pg is None:
            raise ValueError("Preemption.requeue: this rank is not a member of the group; only members call it")
        job = self.job_id()
        outcome: list[Any] = [None]
        if pg.rank() == 0:
            if job is None:
                outcome[0] = False
            else:
                proc = subprocess.run([scontrol, "requeue", job], capture_output=True, text=True, timeout=60)
                outcome[0] = True if proc.returncode == 0 else f"scontrol requeue {job} failed: {proc.stderr.strip()}"
        broadcast_object_list(outcome, group=self._group, group_src=0)
        if isinstance(outcome[0], str):
            raise RuntimeError(outcome[0] + " (is the job requeueable? submit with --requeue)")
        return bool(outcome[0])

    def uninstall(self) -> None:
        """Restore the signal handlers that were there before."""
        for s, h in self._previous.items():
            signal.signal(s, h)
        self._previous.clear()

    def __enter__(self) -> Preemption:
        return self

    def __exit__(self, *exc: object) -> None:
        self.uninstall()
