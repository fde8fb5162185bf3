"""Every ``HPCDIST_*`` environment knob, read in one place.

Knobs are read when asked for (never at import time), so a program may set
``os.environ`` before calling :func:`hpcdist.init_process_group`.

===============================  ===========================================
``HPCDIST_TIMEOUT``              default timeout of blocking operations, in
                                 seconds (default 1800, as torch's gloo)
``HPCDIST_ABORT_ON_EXCEPTION``   ``1`` (default): an unhandled exception on a
                                 rank calls ``MPI_Abort`` so the job ends
                                 instead of hanging; ``0`` turns that off
``HPCDIST_CUDA_AWARE``           ``1``/``0``: override the CUDA-aware MPI
                                 detection
``HPCDIST_NCCL_WATCHDOG``        ``1`` (default): NCCL work stuck past its
                                 group's timeout, or an NCCL async error,
                                 ends the job (as torch's watchdog); ``0``:
                                 off
``HPCDIST_DEBUG``                ``OFF`` | ``INFO`` | ``DETAIL`` (falls back
                                 to ``TORCH_DISTRIBUTED_DEBUG``)
``HPCDIST_STORE_SECRET``         the shared secret of the TCP store
``HPCDIST_STORE_SECRET_FILE``    a file (mode 0600) holding that secret
``HPCDIST_OBJECT_UNPICKLER``     ``full`` (default) or ``restricted``: what
                                 object collectives may unpickle
``HPCDIST_WAIT``                 how blocking collectives wait: ``block``
                                 (default: the blocking MPI call under a
                                 watchdog that ends the job with a
                                 DistTimeoutError message on timeout) or
                                 ``poll`` (non-blocking MPI call polled
                                 against the timeout; a timeout raises a
                                 catchable DistTimeoutError; slower)
``HPCDIST_FLIGHT_RECORDER``      entries of each group's flight recorder
                                 ring (default 2000; ``0``: off, and no
                                 SIGUSR2 handler)
``HPCDIST_FLIGHT_DIR``           where dumps go, one ``rank-<R>.json`` per
                                 rank (default ``./hpcdist-flight``)
``HPCDIST_FLIGHT_DUMP``          ``1`` (default): dump on a timeout error
                                 or an abort; ``0``: only on SIGUSR2 and
                                 ``dump_flight_recorder()``
``HPCDIST_HIER``                 hierarchical collectives for host arrays
                                 of groups spanning several nodes: ``auto``
                                 (default: from ``HPCDIST_HIER_MIN_BYTES``),
                                 ``1`` (at every size) or ``0`` (never)
``HPCDIST_HIER_MIN_BYTES``       the smallest message (bytes) that takes
                                 the hierarchical path in ``auto`` mode
``HPCDIST_NODE_ID``              this process's node identity, overriding
                                 host name + boot id + /dev/shm
                                 (:mod:`hpcdist.topology`)
``HPCDIST_SHM``                  host collectives of ranks on one node:
                                 unset/``auto`` (the measured table picks
                                 shared memory or MPI per op and size),
                                 ``1`` (shared memory always), ``0`` (MPI)
``HPCDIST_SHM_SLOT``             bytes per rank and pipeline stage of the
                                 shared-memory segment (default 1 MiB)
===============================  ===========================================
"""

from __future__ import annotations

import os
from datetime import timedelta

__all__ = [
    "KNOBS",
    "abort_on_exception",
    "cuda_aware_override",
    "debug_level",
    "default_timeout",
    "env_flag",
    "flight_dir",
    "flight_dump_on_error",
    "flight_recorder_size",
    "hierarchical_min_bytes",
    "nccl_watchdog_enabled",
    "object_unpickler",
    "shm_mode",
    "shm_slot_bytes",
    "wait_mode",
]

#: name -> one-line description, for ``hpcdist info`` and the docs.
KNOBS: dict[str, str] = {
    "HPCDIST_TIMEOUT": "default timeout of blocking operations in seconds (1800)",
    "HPCDIST_ABORT_ON_EXCEPTION": "1: MPI_Abort on an unhandled exception (default); 0: off",
    "HPCDIST_CUDA_AWARE": "1/0: force CUDA-aware MPI detection on or off",
    "HPCDIST_NCCL_WATCHDOG": "1: stuck or failed NCCL work ends the job (default); 0: off",
    "HPCDIST_DEBUG": "OFF | INFO | DETAIL (else TORCH_DISTRIBUTED_DEBUG)",
    "HPCDIST_STORE_SECRET": "shared secret of the TCP store (HMAC-SHA256)",
    "HPCDIST_STORE_SECRET_FILE": "file (0600) holding the TCP store secret",
    "HPCDIST_OBJECT_UNPICKLER": "full (default) | restricted",
    "HPCDIST_WAIT": "block (default) | poll: how blocking collectives wait (docs/sharp-bits.md)",
    "HPCDIST_FLIGHT_RECORDER": "entries kept per group by the flight recorder (2000; 0: off)",
    "HPCDIST_FLIGHT_DIR": "directory of flight recorder dumps (./hpcdist-flight)",
    "HPCDIST_FLIGHT_DUMP": "1: dump the flight recorder on a timeout or an abort (default); 0: off",
    "HPCDIST_HIER": "auto (default) | 1 | 0: hierarchical collectives across nodes (docs/multinode.md)",
    "HPCDIST_HIER_MIN_BYTES": "smallest message for the hierarchical path in auto mode (default 262144)",
    "HPCDIST_NODE_ID": "node identity override (default: host name + boot id + /dev/shm)",
    "HPCDIST_SHM": "auto (default: the measured table) | 1 (shared memory always) | 0 (MPI only), on one node",
    "HPCDIST_SHM_SLOT": "bytes per rank and pipeline stage of the shared-memory segment (1048576)",
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_flag(name: str, default: bool | None) -> bool | None:
    """Read a boolean knob; ``default`` when unset; ValueError when garbled."""
    raw = os.environ.get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"environment variable {name} must be one of 1/0/true/false/yes/no/on/off, got {raw!r}")


def default_timeout() -> timedelta:
    """The default timeout of blocking operations (``HPCDIST_TIMEOUT`` seconds)."""
    raw = os.environ.get("HPCDIST_TIMEOUT")
    if raw is None or raw.strip() == "":
        return timedelta(minutes=30)
    try:
        seconds = float(raw)
    except ValueError:
        raise ValueError(f"environment variable HPCDIST_TIMEOUT must be a number of seconds, got {raw!r}") from None
    if seconds <= 0:
        raise ValueError(f"environment variable HPCDIST_TIMEOUT must be > 0 seconds, got {raw!r}")
    return timedelta(seconds=seconds)


def abort_on_exception() -> bool:
    """Whether an unhandled exception on one rank aborts the whole MPI job."""
    return bool(env_flag("HPCDIST_ABORT_ON_EXCEPTION", True))


def cuda_aware_override() -> bool | None:
    """``HPCDIST_CUDA_AWARE`` as a bool, or None when unset."""
    return env_flag("HPCDIST_CUDA_AWARE", None)


def nccl_watchdog_enabled() -> bool:
    """Whether NCCL work is watched (``HPCDIST_NCCL_WATCHDOG``, default on)."""
    return bool(env_flag("HPCDIST_NCCL_WATCHDOG", True))


def debug_level() -> str:
    """``OFF``, ``INFO`` or ``DETAIL``."""
    raw = os.environ.get("HPCDIST_DEBUG") or os.environ.get("TORCH_DISTRIBUTED_DEBUG") or "OFF"
    level = raw.strip().upper()
    if level not in ("OFF", "INFO", "DETAIL"):
        raise ValueError(f"HPCDIST_DEBUG must be OFF, INFO or DETAIL, got {raw!r}")
    return level


def wait_mode() -> str:
    """``poll`` or ``block`` (``HPCDIST_WAIT``), read at init_process_group."""
    raw = os.environ.get("HPCDIST_WAIT", DEFAULT_WAIT).strip().lower()
    if raw not in ("poll", "block"):
        raise ValueError(f"HPCDIST_WAIT must be 'poll' or 'block', got {raw!r}")
    return raw


#: ``block``: blocking MPI calls are the fastest path (MPICH's non-blocking collectives run other algorithms:
#: measured here 0.87-0.95 of the blocking throughput from 1 MiB); a timeout then ends the job through the
#: watchdog. ``poll`` makes a timeout a catchable DistTimeoutError at that cost. docs/sharp-bits.md says more.
DEFAULT_WAIT = "block"


def object_unpickler() -> str:
    """``full`` or ``restricted``: what object collectives may unpickle."""
    raw = os.environ.get("HPCDIST_OBJECT_UNPICKLER", "full").strip().lower()
    if raw not in ("full", "restricted"):
        raise ValueError(f"HPCDIST_OBJECT_UNPICKLER must be 'full' or 'restricted', got {raw!r}")
    return raw


#: entries per group when ``HPCDIST_FLIGHT_RECORDER`` is unset (torch's TORCH_NCCL_TRACE_BUFFER_SIZE is
#: often set to 2000); an entry is a list of 9 small fields, ~200 bytes
DEFAULT_FLIGHT_ENTRIES = 2000


def flight_recorder_size() -> int:
    """Entries kept per group by the flight recorder (``HPCDIST_FLIGHT_RECORDER``; 0: off)."""
    raw = os.environ.get("HPCDIST_FLIGHT_RECORDER")
    if raw is None or raw.strip() == "":
        return DEFAULT_FLIGHT_ENTRIES
    try:
        n = int(raw)
    except ValueError:
        raise ValueError(
            f"environment variable HPCDIST_FLIGHT_RECORDER must be a number of entries (0: off), got {raw!r}"
        ) from None
    if n < 0:
        raise ValueError(f"environment variable HPCDIST_FLIGHT_RECORDER must be >= 0, got {raw!r}")
    return n


def flight_dir() -> str:
    """The directory flight recorder dumps go to (``HPCDIST_FLIGHT_DIR``, default ``hpcdist-flight``)."""
    raw = os.environ.get("HPCDIST_FLIGHT_DIR", "").strip()
    return raw or "hpcdist-flight"


def flight_dump_on_error() -> bool:
    """Whether a timeout error or an abort dumps the flight recorder (``HPCDIST_FLIGHT_DUMP``)."""
    return bool(env_flag("HPCDIST_FLIGHT_DUMP", True))


#: below this many bytes the flat MPI call wins (one step instead of three); measured on the simulated
#: 2 x 2 cluster (docs/benchmarks/hierarchical.md)
DEFAULT_HIER_MIN_BYTES = 256 * 1024


def hierarchical_min_bytes() -> int | None:
    """The smallest message for hierarchical collectives (``HPCDIST_HIER``/``HPCDIST_HIER_MIN_BYTES``); None: off."""
    mode = os.environ.get("HPCDIST_HIER", "auto").strip().lower()
    if mode not in ("auto", "1", "0"):
        raise ValueError(f"HPCDIST_HIER must be 'auto', '1' or '0', got {mode!r}")
    if mode == "0":
        return None
    if mode == "1":
        return 0
    raw = os.environ.get("HPCDIST_HIER_MIN_BYTES", "").strip()
    if not raw:
        return DEFAULT_HIER_MIN_BYTES
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"HPCDIST_HIER_MIN_BYTES must be a number of bytes, got {raw!r}") from None
    if value < 0:
        raise ValueError(f"HPCDIST_HIER_MIN_BYTES must be >= 0, got {value}")
    return value


def shm_mode() -> str:
    """``auto``, ``on`` or ``off`` (``HPCDIST_SHM``), read when a group's host engine is built."""
    raw = os.environ.get("HPCDIST_SHM", "").strip().lower()
    if raw in ("", "auto"):
        return "auto"
    flag = env_flag("HPCDIST_SHM", None)
    return "on" if flag else "off"


def shm_slot_bytes() -> int:
    """Bytes per rank and pipeline stage of a shared-memory segment (``HPCDIST_SHM_SLOT``)."""
    raw = os.environ.get("HPCDIST_SHM_SLOT", "").strip()
    if not raw:
        return 1 << 20
    try:
        value = int(raw)
    except ValueError:
        raise ValueError(f"environment variable HPCDIST_SHM_SLOT must be a number of bytes, got {raw!r}") from None
    if value < 64 or value % 64:
        raise ValueError(f"environment variable HPCDIST_SHM_SLOT must be a multiple of 64 bytes >= 64, got {raw!r}")
    return value
