"""The live child processes of a process, read from ``/proc`` (for test programs that check a helper is gone).

Imported by programs that the tests start (``tests/`` on their ``PYTHONPATH``), not by the tests themselves.
"""

from __future__ import annotations

import os


def children(pid: int | None = None) -> list[int]:
    """The pids whose parent is ``pid`` (default: this process), zombies included (an unreaped child counts)."""
    parent = os.getpid() if pid is None else pid
    kids = []
    for entry in filter(str.isdigit, os.listdir("/proc")):
        try:
            with open(f"/proc/{entry}/stat") as f:
                if int(f.read().rsplit(")", 1)[1].split()[1]) == parent:
                    kids.append(int(entry))
        except (OSError, ValueError, IndexError):
            pass  # gone meanwhile
    return kids
