"""The debug level in force: torch's ``DebugLevel`` and the ``DETAIL`` flag.

Read from ``HPCDIST_DEBUG`` (else ``TORCH_DISTRIBUTED_DEBUG``) at
``init_process_group`` or on first use; :func:`set_debug_level` changes it.
No MPI here.
"""

from __future__ import annotations

import enum

from .. import config

__all__ = ["DETAIL", "DebugLevel", "get_debug_level", "set_debug_level", "set_debug_level_from_env"]


class DebugLevel(enum.IntEnum):
    """torch's ``DebugLevel``."""

    OFF = 0
    INFO = 1
    DETAIL = 2


_LEVEL: list[DebugLevel] = []
#: DETAIL[0]: check every collective's fingerprint across the group (read on the hot path)
DETAIL = [False]


def get_debug_level() -> DebugLevel:
    """The debug level (``HPCDIST_DEBUG`` / ``TORCH_DISTRIBUTED_DEBUG`` unless set)."""
    if not _LEVEL:
        set_debug_level_from_env()
    return _LEVEL[0]


def set_debug_level(level: DebugLevel) -> None:
    """OFF, INFO or DETAIL; DETAIL checks that every rank calls the same collective (costs one exchange)."""
    _LEVEL[:] = [DebugLevel(level)]
    DETAIL[0] = _LEVEL[0] is DebugLevel.DETAIL


def set_debug_level_from_env() -> None:
    """Set the level from ``HPCDIST_DEBUG`` / ``TORCH_DISTRIBUTED_DEBUG`` (``OFF`` when neither is set)."""
    set_debug_level(DebugLevel[config.debug_level()])
