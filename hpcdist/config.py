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
``HPCDIST_HIER_ALGO``            hierarchical all_reduce, all_gather and
                                 reduce_scatter (tensor forms): ``auto``
                                 (default: ``rails`` for all_reduce and
                                 reduce_scatter where every node holds as
                                 many of the group's ranks, else
                                 ``leaders``), ``rails`` or ``leaders``
``HPCDIST_HIER_ASYNC``           ``1`` (default): ``async_op=True``
                                 hierarchical calls run their steps on a
                                 thread of the engine (needs
                                 ``MPI_THREAD_MULTIPLE``); ``0``: they take
                                 the flat non-blocking MPI call
``HPCDIST_NODE_ID``              this process's node identity, overriding
                                 host name + boot id + /dev/shm
                                 (:mod:`hpcdist.topology`)
``HPCDIST_SHM``                  host collectives of ranks on one node:
                                 unset/``auto`` (the measured table picks
                                 shared memory or MPI per op and size),
                                 ``1`` (shared memory always), ``0`` (MPI)
``HPCDIST_SHM_SLOT``             bytes per rank and pipeline stage of the
                                 shared-memory segment (default 1 MiB)
``HPCDIST_SHM_TABLE``            a selection table measured on this
                                 machine (the JSON file of ``hpcdist bench
                                 --table-file``) replacing the built-in
                                 one's rows, per operation
``HPCDIST_RUN_WARDEN``           ``1`` (default): under ``hpcdist run`` each
                                 rank runs under a small parent process that
                                 reports a rank killed by a signal or leaving
                                 through ``os._exit``; ``0``: the rank is the
                                 launcher's own process
``HPCDIST_KEEPALIVE``            seconds after which the peer of an idle
                                 store or liveness connection that answers
                                 no TCP keepalive probe is taken for dead
                                 (default 120; ``0``: the OS default, no
                                 probes)
``HPCDIST_MPI_TUNE``             ``1`` (default): a launcher-free world, and
                                 ``hpcdist run`` with every rank on this host,
                                 start the embedded MPICH with the settings
                                 of :mod:`hpcdist.rendezvous.mpi_env`, where
                                 unset; ``0``: hpcdist sets no MPI variable
===============================  ===========================================
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from datetime import timedelta
from typing import Any

__all__ = [
    "KNOBS",
    "abort_on_exception",
    "check_timeout",
    "cuda_aware_override",
    "debug_level",
    "default_timeout",
    "env_flag",
    "flight_dir",
    "flight_dump_on_error",
    "flight_recorder_size",
    "hierarchical_algorithm",
    "hierarchical_min_bytes",
    "keepalive_seconds",
    "nccl_watchdog_enabled",
    "object_unpickler",
    "parse_number",
    "run_warden",
    "shm_direct",
    "shm_mode",
    "shm_slot_bytes",
    "shm_table_path",
    "wait_mode",
]

#: name -> one-line description, for ``hpcdist info`` and the docs.
KNOBS: dict[str, str] = {
    "HPCDIST_TIMEOUT": "default timeout of blocking operations in seconds (1800)",
    "HPCDIST_ABORT_ON_EXCEPTION": "1: MPI_Abort on an unhandled exception or a failing sys.exit (default); 0: off",
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
    "HPCDIST_HIER_MIN_BYTES": "smallest message for the hierarchical path in auto mode (default 524288)",
    "HPCDIST_HIER_ALGO": "auto (default) | rails | leaders: how hierarchical reductions and gathers cross nodes "
    "(docs/multinode.md)",
    "HPCDIST_HIER_ASYNC": "1 (default): async_op=True hierarchical calls run on the engine's thread (with "
    "MPI_THREAD_MULTIPLE); 0: they take the flat non-blocking MPI call (docs/multinode.md)",
    "HPCDIST_NODE_ID": "node identity override (default: host name + boot id + /dev/shm)",
    "HPCDIST_SHM": "auto (default: the measured table) | 1 (shared memory always) | 0 (MPI only), on one node",
    "HPCDIST_SHM_DIRECT": "1: node-local collectives read peers' arrays directly (process_vm_readv) where the OS "
    "allows it; 0 (default): through the shared-memory segment (docs/performance.md)",
    "HPCDIST_SHM_SLOT": "bytes per rank and pipeline stage of the shared-memory segment (1048576)",
    "HPCDIST_SHM_TABLE": "a selection table file from hpcdist bench --table-file, used instead of the built-in "
    "table's rows (docs/performance.md)",
    "HPCDIST_RUN_WARDEN": "1 (default): under hpcdist run a parent process per rank reports a rank killed by a "
    "signal or leaving through os._exit; 0: off",
    "HPCDIST_KEEPALIVE": "seconds after which the peer of an idle store or liveness connection that answers no TCP "
    "keepalive probe is taken for dead (120; 0: no probes)",
    "HPCDIST_MPI_TUNE": "1 (default): launcher-free worlds, and hpcdist run with every rank on this host, start "
    "the embedded MPICH with UCX_MEM_EVENTS=no and, "
    "on an oversubscribed host, MPIR_CVAR_ENABLE_HEAVY_YIELD=1, where unset; 0: set nothing",
}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def env_flag(name: str, default: bool | None, env: Mapping[str, str] | None = None) -> bool | None:
    """Read a boolean knob from ``env`` (``os.environ``); ``default`` when unset; ValueError when garbled."""
    raw = (os.environ if env is None else env).get(name)
    if raw is None or raw.strip() == "":
        return default
    value = raw.strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    raise ValueError(f"environment variable {name} must be one of 1/0/true/false/yes/no/on/off, got {raw!r}")


def parse_number(raw: str, what: str, *, minimum: float, unit: str = "an integer", kind: type = int) -> Any:
    """``kind(raw)`` when it is at least ``minimum`` (above it when ``kind`` is float).

    The one parser of every numeric knob and command-line number: a bad value
    raises ValueError "``what``: expected ``unit`` >= ``minimum``, got ``raw``".

    Args:
        raw: the text to parse (surrounding spaces are ignored).
        what: names the source in the message (``"environment variable X"``, ``"--timeout"``).
        minimum: the smallest accepted value; for ``kind=float`` the value must be greater.
        unit: what the value counts, as the message says it (``"a number of bytes"``).
        kind: ``int`` or ``float``.

    Returns:
        The parsed value.
    """
    bound = f"> {minimum:g}" if kind is float else f">= {minimum:g}"
    try:
        value = kind(str(raw).strip())
    except ValueError:
        value = None
    if kind is float:  # NaN and infinity are no number of seconds
        ok = value is not None and math.isfinite(value) and value > minimum
    else:
        ok = value is not None and value >= minimum
    if not ok:
        raise ValueError(f"{what}: expected {unit} {bound}, got {raw!r}")
    return value


def _choice(name: str, choices: tuple[str, ...], default: str) -> str:
    """Knob ``name`` as one of ``choices`` (any case, spaces ignored); ``default`` when unset or empty; else
    ValueError naming the variable, the choices and the value as given."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if not value:
        return default
    if value not in choices:
        raise ValueError(f"environment variable {name} must be one of {', '.join(map(repr, choices))}, got {raw!r}")
    return value


def _int_env(name: str, default: int, minimum: int, unit: str = "an integer") -> int:
    """Integer knob ``name``: ``default`` when unset or empty, else :func:`parse_number`'s value."""
    raw = os.environ.get(name, "")
    if not raw.strip():
        return default
    return int(parse_number(raw, f"environment variable {name}", minimum=minimum, unit=unit))


def default_timeout() -> timedelta:
    """The default timeout of blocking operations (``HPCDIST_TIMEOUT`` seconds)."""
    raw = os.environ.get("HPCDIST_TIMEOUT", "")
    if not raw.strip():
        return timedelta(minutes=30)
    what = "environment variable HPCDIST_TIMEOUT"
    seconds = parse_number(raw, what, minimum=0, unit="a number of seconds", kind=float)
    if seconds > MAX_TIMEOUT_S:
        raise ValueError(f"{what}: expected a number of seconds > 0 and <= {MAX_TIMEOUT_S:g}, got {raw!r}")
    return timedelta(seconds=seconds)


#: the longest timeout a number of seconds may give: ``datetime.timedelta.max`` (about 2.7 million years)
MAX_TIMEOUT_S = timedelta.max.total_seconds()


def check_timeout(timeout: object, arg: str = "timeout", *, seconds: bool = False) -> timedelta:
    """``timeout`` as a positive timedelta, else TypeError/ValueError naming ``arg``.

    The one check of every ``timeout=`` argument; ``None`` is the caller's to
    replace (by :func:`default_timeout` or a store's own timeout) before.

    Args:
        timeout: a ``datetime.timedelta`` (or, with ``seconds=True``, a number of seconds).
        arg: the argument's name, for the message.
        seconds: accept an int or float number of seconds too (``monitored_barrier``, as torch).

    Returns:
        ``timeout`` as a timedelta.
    """
    if seconds and isinstance(timeout, int | float) and not isinstance(timeout, bool):
        if not (math.isfinite(timeout) and 0 < timeout <= MAX_TIMEOUT_S):
            raise ValueError(
                f"{arg} must be a positive number of seconds (at most {MAX_TIMEOUT_S:g}) or timedelta, got {timeout!r}"
            )
        timeout = timedelta(seconds=timeout)
    if not isinstance(timeout, timedelta):
        accepted = "a datetime.timedelta or a number of seconds" if seconds else "a datetime.timedelta"
        raise TypeError(f"{arg} must be {accepted}, got {type(timeout).__name__} ({timeout!r:.60})")
    if timeout.total_seconds() <= 0:
        raise ValueError(f"{arg} must be a positive timedelta, got {timeout!r}")
    return timeout


def abort_on_exception() -> bool:
    """Whether an unhandled exception (or a failing ``sys.exit``) on one rank aborts the whole MPI job."""
    return bool(env_flag("HPCDIST_ABORT_ON_EXCEPTION", True))


def cuda_aware_override() -> bool | None:
    """``HPCDIST_CUDA_AWARE`` as a bool, or None when unset."""
    return env_flag("HPCDIST_CUDA_AWARE", None)


def nccl_watchdog_enabled() -> bool:
    """Whether NCCL work is watched (``HPCDIST_NCCL_WATCHDOG``, default on)."""
    return bool(env_flag("HPCDIST_NCCL_WATCHDOG", True))


def debug_level() -> str:
    """``OFF``, ``INFO`` or ``DETAIL``."""
    name = "HPCDIST_DEBUG" if os.environ.get("HPCDIST_DEBUG", "").strip() else "TORCH_DISTRIBUTED_DEBUG"
    raw = os.environ.get(name, "")
    level = raw.strip().upper() or "OFF"
    if level not in ("OFF", "INFO", "DETAIL"):
        raise ValueError(f"environment variable {name} must be OFF, INFO or DETAIL, got {raw!r}")
    return level


def wait_mode() -> str:
    """``poll`` or ``block`` (``HPCDIST_WAIT``), read at init_process_group."""
    return _choice("HPCDIST_WAIT", ("block", "poll"), DEFAULT_WAIT)


#: ``block``: blocking MPI calls are the fastest path (MPICH's non-blocking collectives run other algorithms:
#: measured here 0.87-0.95 of the blocking throughput from 1 MiB); a timeout then ends the job through the
#: watchdog. ``poll`` makes a timeout a catchable DistTimeoutError at that cost. docs/sharp-bits.md says more.
DEFAULT_WAIT = "block"


def object_unpickler() -> str:
    """``full`` or ``restricted``: what object collectives may unpickle."""
    return _choice("HPCDIST_OBJECT_UNPICKLER", ("full", "restricted"), "full")


#: entries per group when ``HPCDIST_FLIGHT_RECORDER`` is unset (torch's TORCH_NCCL_TRACE_BUFFER_SIZE is
#: often set to 2000); an entry is a list of 9 small fields, ~200 bytes
DEFAULT_FLIGHT_ENTRIES = 2000


def flight_recorder_size() -> int:
    """Entries kept per group by the flight recorder (``HPCDIST_FLIGHT_RECORDER``; 0: off)."""
    return _int_env("HPCDIST_FLIGHT_RECORDER", DEFAULT_FLIGHT_ENTRIES, 0, "a number of entries (0: off)")


def flight_dir() -> str:
    """The directory flight recorder dumps go to (``HPCDIST_FLIGHT_DIR``, default ``hpcdist-flight``)."""
    raw = os.environ.get("HPCDIST_FLIGHT_DIR", "").strip()
    return raw or "hpcdist-flight"


def flight_dump_on_error() -> bool:
    """Whether a timeout error or an abort dumps the flight recorder (``HPCDIST_FLIGHT_DUMP``)."""
    return bool(env_flag("HPCDIST_FLIGHT_DUMP", True))


#: below this many bytes the flat MPI call wins (one step instead of three): on the simulated 2 x 2 cluster
#: the hierarchical all_reduce lost at 256 KiB in every run of 2026-11-25 and was about even at 512 KiB
#: (docs/multinode.md, "The smallest size (HPCDIST_HIER_MIN_BYTES)")
DEFAULT_HIER_MIN_BYTES = 512 * 1024


def hierarchical_min_bytes() -> int | None:
    """The smallest message for hierarchical collectives (``HPCDIST_HIER``/``HPCDIST_HIER_MIN_BYTES``); None: off."""
    mode = _tristate("HPCDIST_HIER")
    if mode == "off":
        return None
    if mode == "on":
        return 0
    return _hier_min_bytes()


def hierarchical_async() -> bool:
    """Whether ``async_op=True`` hierarchical calls run their steps on the engine's thread (``HPCDIST_HIER_ASYNC``)."""
    return bool(env_flag("HPCDIST_HIER_ASYNC", True))


def _hier_min_bytes() -> int:
    return _int_env("HPCDIST_HIER_MIN_BYTES", DEFAULT_HIER_MIN_BYTES, 0, "a number of bytes")


#: HPCDIST_HIER_ALGO's values
HIER_ALGOS = ("auto", "rails", "leaders")


def hierarchical_algorithm() -> str:
    """How hierarchical collectives cross nodes (``HPCDIST_HIER_ALGO``): ``auto``, ``rails`` or ``leaders``."""
    return _choice("HPCDIST_HIER_ALGO", HIER_ALGOS, "auto")


def shm_mode() -> str:
    """``auto``, ``on`` or ``off`` (``HPCDIST_SHM``), read when a group's host engine is built."""
    return _tristate("HPCDIST_SHM")


def _tristate(name: str) -> str:
    """``auto`` (unset, empty or ``auto``), ``on`` (1/true/yes/on) or ``off`` (0/false/no/off): the knobs that
    let a measurement decide by default (``HPCDIST_SHM``, ``HPCDIST_HIER``)."""
    raw = os.environ.get(name, "")
    value = raw.strip().lower()
    if value in ("", "auto"):
        return "auto"
    if value in _TRUE:
        return "on"
    if value in _FALSE:
        return "off"
    raise ValueError(f"environment variable {name} must be auto or one of 1/0/true/false/yes/no/on/off, got {raw!r}")


def shm_direct() -> bool:
    """Whether shared-memory collectives may read peers' arrays directly (``HPCDIST_SHM_DIRECT``, default off:
    on the machine of the selection table ``process_vm_readv`` copies at 5-10 GB/s where ``memcpy`` runs at 21-34)."""
    return bool(env_flag("HPCDIST_SHM_DIRECT", False))


def shm_slot_bytes() -> int:
    """Bytes per rank and pipeline stage of a shared-memory segment (``HPCDIST_SHM_SLOT``)."""
    value = _int_env("HPCDIST_SHM_SLOT", 1 << 20, 64, "a number of bytes")
    if value % 64:
        raise ValueError(f"environment variable HPCDIST_SHM_SLOT must be a multiple of 64 bytes >= 64, got {value}")
    return value


def shm_table_path() -> str | None:
    """The selection table file of ``HPCDIST_SHM_TABLE`` (None: unset or empty, the built-in table);
    :func:`hpcdist.backends.shm.table.active` reads it."""
    path = os.environ.get("HPCDIST_SHM_TABLE", "").strip()
    return path or None


def _shm_table() -> Any:
    from .backends.shm import table

    return table.active()


def keepalive_seconds() -> int:
    """Seconds after which an idle TCP peer of hpcdist's own connections (store, liveness) that answers no keepalive
    probe is taken for dead (``HPCDIST_KEEPALIVE``; 0: no probes): :func:`hpcdist._descriptors.keepalive`."""
    return _int_env("HPCDIST_KEEPALIVE", 120, 0, "a number of seconds")


def _mpi_tune() -> bool:
    return bool(env_flag("HPCDIST_MPI_TUNE", True))


def run_warden() -> bool:
    """Whether ``hpcdist run``'s bootstrap runs each rank under a warden process (``HPCDIST_RUN_WARDEN``)."""
    return bool(env_flag("HPCDIST_RUN_WARDEN", True))


def _store_secret() -> bytes | None:
    from .store._auth import resolve_secret  # the store's own checks (a file of mode 0600 that this user owns)

    return resolve_secret(None)


#: the reader of every knob whose value can be wrong, each reading that knob alone (the others are free text: a
#: path, a node name, a secret)
READERS: dict[str, Any] = {
    "HPCDIST_TIMEOUT": default_timeout,
    "HPCDIST_ABORT_ON_EXCEPTION": abort_on_exception,
    "HPCDIST_CUDA_AWARE": cuda_aware_override,
    "HPCDIST_NCCL_WATCHDOG": nccl_watchdog_enabled,
    "HPCDIST_DEBUG": debug_level,
    "HPCDIST_OBJECT_UNPICKLER": object_unpickler,
    "HPCDIST_WAIT": wait_mode,
    "HPCDIST_FLIGHT_RECORDER": flight_recorder_size,
    "HPCDIST_FLIGHT_DUMP": flight_dump_on_error,
    "HPCDIST_HIER": lambda: _tristate("HPCDIST_HIER"),
    "HPCDIST_HIER_MIN_BYTES": _hier_min_bytes,
    "HPCDIST_HIER_ALGO": hierarchical_algorithm,
    "HPCDIST_HIER_ASYNC": hierarchical_async,
    "HPCDIST_SHM": shm_mode,
    "HPCDIST_SHM_DIRECT": shm_direct,
    "HPCDIST_SHM_SLOT": shm_slot_bytes,
    "HPCDIST_SHM_TABLE": _shm_table,
    "HPCDIST_MPI_TUNE": _mpi_tune,
    "HPCDIST_KEEPALIVE": keepalive_seconds,
    "HPCDIST_RUN_WARDEN": run_warden,
    "HPCDIST_STORE_SECRET_FILE": _store_secret,
}


def problems() -> dict[str, str]:
    """Each knob of ``os.environ`` whose value its reader refuses -> the reader's message: what
    ``init_process_group`` or the first collective would raise (``hpcdist info`` lists them first)."""
    out: dict[str, str] = {}
    for name, read in READERS.items():
        try:
            read()
        except (ValueError, RuntimeError) as exc:  # RuntimeError: the store's DistStoreError
            out[name] = str(exc)
    return out
