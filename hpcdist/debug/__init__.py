"""Debugging aids, one job a module; this package only re-exports them.

- :mod:`.levels`: torch's ``DebugLevel`` and the level in force
  (``HPCDIST_DEBUG`` / ``TORCH_DISTRIBUTED_DEBUG``), with the ``DETAIL`` flag
  the hot path reads;
- :mod:`.detail`: the ``DETAIL``-mode check that every rank enters the same
  collective;
- :mod:`.monitored`: ``monitored_barrier``, a barrier that names the ranks
  that did not arrive;
- :mod:`.breakpoints`: ``breakpoint``, pdb on one rank while the others wait.
"""

from __future__ import annotations

from .breakpoints import breakpoint
from .detail import check_collective, check_traffic
from .levels import DETAIL, DebugLevel, get_debug_level, set_debug_level, set_debug_level_from_env
from .monitored import monitored_barrier

__all__ = [
    "DETAIL",
    "DebugLevel",
    "breakpoint",
    "check_collective",
    "check_traffic",
    "get_debug_level",
    "monitored_barrier",
    "set_debug_level",
    "set_debug_level_from_env",
]
