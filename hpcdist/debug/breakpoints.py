"""``breakpoint``: pdb on one rank while the others wait at a barrier."""

from __future__ import annotations

import sys
from datetime import timedelta

__all__ = ["breakpoint"]

_COUNT = [0]  # calls of breakpoint() so far (``skip`` ignores the first ones)


def breakpoint(rank: int = 0, skip: int = 0, timeout_s: float = 3600) -> None:
    """Drop into pdb on ``rank`` (with its terminal); the other ranks wait at a barrier.

    SPMD: every rank calls it.

    Args:
        rank: the global rank that enters pdb.
        skip: how many calls to ignore first.
        timeout_s: how long the other ranks wait at the barrier, in seconds.
    """
    from .. import collectives
    from .._init import get_rank

    count = _COUNT[0]
    _COUNT[0] += 1
    if count < skip:
        return
    if get_rank() == rank:
        import pdb

        try:
            sys.stdin = open("/dev/tty")  # noqa: SIM115 - the debugger keeps it
        except OSError:
            pass
        print(f"hpcdist.breakpoint(): rank {rank} is in pdb; type 'c' to continue", file=sys.stderr, flush=True)
        pdb.Pdb().set_trace(sys._getframe(1))
    collectives.barrier(timeout=timedelta(seconds=timeout_s))
