"""The flight recorder: every group's last N operations, dumped when something goes wrong.

Each :class:`~hpcdist.group.ProcessGroup` owns a :class:`Ring` of its last
``HPCDIST_FLIGHT_RECORDER`` operations (default 2000; 0 turns recording off),
as torch's ``TORCH_NCCL_TRACE_BUFFER_SIZE`` does for NCCL. The free functions
of :mod:`hpcdist.collectives`, :mod:`hpcdist.p2p` and :mod:`hpcdist.objects`
record one entry per call, before any message moves: the sequence number (a
group's collectives are numbered alike on every rank; point-to-point has its
own counter), the operation, dtype, element count, root or peer, and the wall
time it started. A blocking call marks its entry completed when it returns; an
``async_op`` call keeps a weak reference to its :class:`~hpcdist.work.Work`,
whose state is read when the ring is dumped (no cost on the completion path).

Recording is one clock read and a list store per call, about 0.3 µs (``examples/benchmarks/
bench_flight.py`` measures it). The rings are written out, one JSON file per
rank (``rank-<R>.json``) in ``HPCDIST_FLIGHT_DIR`` (default ``./hpcdist-flight``,
made absolute at init), when:

- a timeout error is raised (:class:`~hpcdist.errors.DistTimeoutError`),
- the job is aborted (the block-mode watchdog, an unhandled exception),
- another rank asks (it timed out or aborts: it posts a request to the
  default group's TCP store, which a thread on every rank waits on at no cost),
- the process gets ``SIGUSR2`` (handler installed at init only where the
  program has none; a helper thread writes the dump, so it works while the main
  thread is blocked inside MPI),
- the program calls :func:`dump_flight_recorder`.

``hpcdist debug analyze DIR`` (:mod:`hpcdist.debug_analyze`) reads every
rank's file and names the first operation where the ranks diverge.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
import threading
import time
import traceback
import weakref
from typing import Any

from . import config

__all__ = [
    "FORMAT_VERSION",
    "Ring",
    "attach",
    "dump",
    "dump_flight_recorder",
    "install",
    "new_ring",
    "on_abort",
    "on_timeout",
    "stop",
]

#: version of the dump file's layout (``"version"`` in every file)
FORMAT_VERSION = 1

_time = time.time
_ref = weakref.ref

# entry layout (a list, so a blocking call's completion is one store): index -> meaning
SEQ, OP, DTYPE, COUNT, PEER, START, END = range(7)


class Ring:
    """The bounded history of one group's operations: its last ``cap`` collectives and ``cap`` p2p ops.

    ``coll``/``p2p`` append an entry (oldest overwritten) and return it; the
    caller marks a blocking call done with ``entry[END] = True`` (or a
    completion time) or attaches an async Work with :func:`attach`. Safe
    enough under the GIL: an entry is complete when stored, and a dump that
    reads concurrently sees either the old or the new one.
    """

    __slots__ = ("cap", "colls", "n_coll", "n_p2p", "p2ps")

    def __init__(self, cap: int) -> None:
        self.cap = cap
        # grown one entry a call up to ``cap``, then overwritten oldest first: memory follows the calls made,
        # not the knob (a huge HPCDIST_FLIGHT_RECORDER must not allocate cap slots per group at init)
        self.colls: list[Any] = []
        self.p2ps: list[Any] = []
        self.n_coll = 0  # collective sequence number: the same on every rank of the group
        self.n_p2p = 0  # point-to-point sequence number: this rank's own

    def coll(self, op: str, dtype: Any, count: int, root: int) -> list[Any]:
        """Record a collective about to start (``root``: a group rank, -1 for none); return its entry."""
        self.n_coll = s = self.n_coll + 1
        e = [s, op, dtype, count, root, _time(), False]
        if s > self.cap:
            self.colls[(s - 1) % self.cap] = e
        else:
            self.colls.append(e)
        return e

    def p2p(self, op: str, dtype: Any, count: int, peer: int) -> list[Any]:
        """Record a point-to-point operation (``peer``: a group rank, negative for any source)."""
        self.n_p2p = s = self.n_p2p + 1
        e = [s, op, dtype, count, peer, _time(), False]
        if s > self.cap:
            self.p2ps[(s - 1) % self.cap] = e
        else:
            self.p2ps.append(e)
        return e

    def snapshot(self, ranks: list[int]) -> list[dict[str, Any]]:
        """The entries in the order they started, as JSON-ready dicts (``ranks``: the group's global ranks)."""
        got = [(e, False) for e in list(self.colls) if e is not None]
        got += [(e, True) for e in list(self.p2ps) if e is not None]
        got.sort(key=lambda item: (item[0][START], item[1], item[0][SEQ]))
        return [_entry_dict(e, p2p, ranks) for e, p2p in got]


def _entry_dict(e: list[Any], p2p: bool, ranks: list[int]) -> dict[str, Any]:
    end = e[END]
    completed_at: float | None = None
    if isinstance(end, weakref.ref):  # an async_op Work: completed if someone saw it complete
        work = end()
        if work is None:
            state = "unknown"  # the Work was dropped before completing was observed
        elif getattr(work, "_done", False):
            state = "failed" if getattr(work, "_exc", None) is not None else "completed"
        elif getattr(work, "_exc", None) is not None:
            state = "failed"
        else:
            state = "started"
    elif end is True:  # a blocking call returned (no second clock read on the hot path)
        state = "completed"
    elif end:  # a completion time (object collectives)
        state, completed_at = "completed", float(end)
    else:
        state = "started"
    peer = e[PEER]
    out: dict[str, Any] = {
        "seq": e[SEQ],
        "p2p": p2p,
        "op": e[OP],
        "dtype": None if e[DTYPE] is None else str(e[DTYPE]),
        "count": e[COUNT],
        "state": state,
        "started_at": e[START],
        "completed_at": completed_at,
        "async": isinstance(end, weakref.ref),
    }
    if p2p:
        out["peer"] = ranks[peer] if 0 <= peer < len(ranks) else "any"
    else:
        out["root"] = ranks[root] if 0 <= (root := peer) < len(ranks) else None
    return out


def new_ring() -> Ring | None:
    """A ring of ``HPCDIST_FLIGHT_RECORDER`` entries for a new group, or None when recording is off."""
    cap = config.flight_recorder_size()
    return Ring(cap) if cap > 0 else None


def attach(entry: list[Any], work: Any) -> None:
    """Let ``entry``'s state follow ``work`` (an async operation's handle), read at dump time."""
    try:
        entry[END] = _ref(work)
    except TypeError:  # a handle type without weak references: state stays "started"
        pass


# ------------------------------------------------------------------ dumping

_STATE: dict[str, Any] = {"dir": None, "auto": False, "announced": set(), "reader": None}
_LOCK = threading.RLock()  # reentrant: a SIGUSR2 handler may run in the main thread while it dumps


def _directory() -> str:
    d = _STATE["dir"]
    return d if d is not None else os.path.abspath(config.flight_dir())


def _job_id() -> str:
    env = os.environ
    for key in ("SLURM_JOB_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid", "TORCHELASTIC_RUN_ID", "PBS_JOBID"):
        if env.get(key):
            step = env.get("SLURM_STEP_ID") if key == "SLURM_JOB_ID" else None
            return env[key] + (f".{step}" if step else "")
    return ""


def collect(reason: str) -> dict[str, Any]:
    """Everything a dump holds, as one JSON-ready dict (see docs/debugging.md for the layout)."""
    from ._version import __version__
    from ._world import WORLD

    default = WORLD.default_pg
    groups = []
    for pg in list(WORLD.groups.values()):
        ring = getattr(pg, "_flight", None)
        ranks = list(pg._ranks)
        groups.append(
            {
                "name": pg.group_name,
                "desc": pg.group_desc,
                "ranks": ranks,
                "rank": pg._rank,
                "size": pg._size,
                "backend": pg._backend_str,
                "timeout_s": pg._timeout_s,
                "collectives": 0 if ring is None else ring.n_coll,
                "p2p_ops": 0 if ring is None else ring.n_p2p,
                "capacity": 0 if ring is None else ring.cap,
                "entries": [] if ring is None else ring.snapshot(ranks),
            }
        )
    frames = sys._current_frames()
    names = {t.ident: t.name for t in threading.enumerate()}
    stacks = {
        names.get(ident, str(ident)): "".join(traceback.format_list(_outside_dump(frame)))
        for ident, frame in frames.items()
        if names.get(ident) != "hpcdist-flight"
    }
    return {
        "version": FORMAT_VERSION,
        "hpcdist": __version__,
        "rank": -1 if default is None else default._rank,
        "world_size": -1 if default is None else default._size,
        "job": _job_id(),
        "run": WORLD.run_id,
        "host": socket.gethostname(),
        "pid": os.getpid(),
        "time": _time(),
        "reason": reason,
        "groups": groups,
        "stacks": stacks,
    }


def _outside_dump(frame: Any) -> traceback.StackSummary:
    """A thread's stack without the frames of this module (the dump itself, in the dumping thread)."""
    summary = traceback.extract_stack(frame)
    while summary and summary[-1].filename == __file__:
        summary.pop()
    return summary


def dump(reason: str, announce: bool = False) -> str | None:
    """Write this rank's dump (``rank-<R>.json`` in the flight directory); return its path.

    Never raises: a dump that cannot be written returns None (and says so on
    stderr when ``announce``). ``announce`` prints where the file went, once
    per process.
    """
    try:
        with _LOCK:
            data = collect(reason)
            directory = _directory()
            os.makedirs(directory, exist_ok=True)
            rank = data["rank"] if data["rank"] >= 0 else f"pid{data['pid']}"
            path = os.path.join(directory, f"rank-{rank}.json")
            tmp = f"{path}.{os.getpid()}.tmp"
            with open(tmp, "w") as f:
                json.dump(data, f, indent=1, default=str)
            os.replace(tmp, path)
    except Exception as exc:  # a failing dump must never hide the error that triggered it
        if announce:
            sys.stderr.write(f"hpcdist: could not write the flight recorder dump: {exc}\n")
        return None
    if announce and path not in _STATE["announced"]:
        _STATE["announced"].add(path)
        sys.stderr.write(
            f"hpcdist: flight recorder written to {path} ({reason.partition(':')[0]}); "
            f"run `hpcdist debug analyze {directory}` once every rank has written its file\n"
        )
        sys.stderr.flush()
    return path


def dump_flight_recorder(reason: str = "dump_flight_recorder() called") -> str | None:
    """Write this rank's flight recorder (every group's last operations) to a JSON file.

    Not collective: each rank that calls it writes ``rank-<R>.json`` in
    ``HPCDIST_FLIGHT_DIR`` (default ``./hpcdist-flight``), replacing the file
    of an earlier dump. Read the files of all ranks with
    ``hpcdist debug analyze DIR``.

    Args:
        reason: a note stored in the file.

    Returns:
        The path written, or None when it could not be written.
    """
    return dump(reason)


def on_timeout(message: str) -> None:
    """A DistTimeoutError is being raised: dump, and ask every other rank to dump (once per process)."""
    if _STATE.get("auto"):
        reason = f"timeout: {message}"
        _request_all(reason)
        dump(reason, announce=True)


def on_abort(message: str) -> None:
    """The job is about to be aborted (watchdog, unhandled exception): dump, here and on every rank, first."""
    if _STATE.get("auto"):
        reason = f"abort: {message.strip()}"
        asked = _request_all(reason)
        dump(reason, announce=True)
        if asked:
            time.sleep(_GRACE_S)  # let the other ranks write their files before MPI_Abort ends them


# ------------------------------------------------------------------ every rank dumps: requests through the store

_KEY = "hpcdist/flight/dump"
_GRACE_S = 1.0  # how long an aborting rank waits for the others' dumps
_REQUEST_S = 2.0  # at most this long to post the request (a dead store server must not delay the abort)
_CONNECT_S = 10.0  # the watcher's connection: the server is up when init returns; gone means the job is over


def _watch(store: Any) -> None:
    """A thread parked in the group store's ``wait`` (no cost: the server holds the request) for dump requests.

    Only a TCP store parks a wait server-side; with another store the ranks
    dump on their own errors only. The thread opens its own connection (a
    server already gone must not hold up init) and ends when the store closes
    or :func:`stop` is called.
    """
    if type(store).__name__ != "TCPStore":
        return
    with _LOCK:
        _STATE["gen"] = gen = _STATE.get("gen", 0) + 1
        _STATE["store"] = store
    from datetime import timedelta

    from .errors import DistTimeoutError

    def run() -> None:
        try:
            watch = store.clone(timedelta(seconds=_CONNECT_S))
        except Exception:
            return
        with _LOCK:
            if _STATE.get("gen") != gen:  # stop() ran while connecting
                watch.close()
                return
            _STATE["watch"] = watch
        try:
            k = int(watch.add(f"{_KEY}/count", 0)) + 1  # requests of an earlier init on a reused store: not ours
        except Exception:
            return
        while True:
            try:
                watch.wait([f"{_KEY}/{k}"], timedelta(days=7))
                why = watch.get(f"{_KEY}/{k}").decode("utf-8", "replace")
            except DistTimeoutError:
                continue
            except Exception:  # the store closed: the job is over
                return
            k += 1
            who, _, what = why.partition("\n")
            if who != str(_own_rank()):  # the requester wrote its own dump already
                dump(f"requested by rank {who}: {what}")  # silent: the requester says where the files go

    threading.Thread(target=run, name="hpcdist-flight-watch", daemon=True).start()


def _request_all(reason: str) -> bool:
    """Ask every rank to dump (the first time only); True when the request was posted."""
    store = _STATE.get("store")
    if store is None or _STATE.get("requested"):
        return False
    _STATE["requested"] = True
    from datetime import timedelta

    rank = _own_rank()
    posted: list[bool] = []

    def post() -> None:
        try:
            own = store.clone(
                timedelta(seconds=_REQUEST_S)
            )  # the caller's may be busy (and the watcher's is parked): a connection of our own
            try:
                n = own.add(f"{_KEY}/count", 1)
                own.set(f"{_KEY}/{n}", f"{rank}\n{reason}"[:4000].encode())
                posted.append(True)
            finally:
                own.close()
        except Exception:
            pass

    t = threading.Thread(target=post, name="hpcdist-flight-request", daemon=True)
    t.start()
    t.join(_REQUEST_S)
    return bool(posted)


def _own_rank() -> int:
    from ._world import WORLD

    return -1 if WORLD.default_pg is None else int(WORLD.default_pg._rank)


def stop() -> None:
    """At destroy_process_group: close the watcher's store connection (its thread then ends)."""
    with _LOCK:
        _STATE["gen"] = _STATE.get("gen", 0) + 1
        watch = _STATE.pop("watch", None)
        _STATE.pop("store", None)
        _STATE.pop("requested", None)
    if watch is not None:
        try:
            watch.close()
        except Exception:
            pass


# ------------------------------------------------------------------ SIGUSR2


def install(store: Any = None) -> None:
    """At init: fix the dump directory, watch ``store`` for dump requests, install the SIGUSR2 handler.

    The SIGUSR2 handler is installed only where the program has none.
    """
    _STATE["dir"] = os.path.abspath(config.flight_dir())
    _STATE["auto"] = auto = config.flight_recorder_size() > 0 and config.flight_dump_on_error()
    if store is not None and auto:
        _watch(store)
    if config.flight_recorder_size() <= 0 or threading.current_thread() is not threading.main_thread():
        return  # off, or not the main thread (only it may install signal handlers)
    sig = signal.SIGUSR2
    if _STATE["reader"] is not None or signal.getsignal(sig) is not signal.SIG_DFL:
        return  # already ours, or a handler of the program's (or of a tool, outside Python): leave it
    signal.signal(sig, _on_sigusr2)
    _start_reader()


def _on_sigusr2(signum: int, frame: Any) -> None:
    """The Python-level handler: dumps unless the reader thread was woken (then it has dumped already)."""
    if not _reader_woken():
        dump("SIGUSR2", announce=True)


def _reader_woken() -> bool:
    """Whether the wakeup fd still is the reader's (asyncio, say, may have replaced it since)."""
    ours = _STATE.get("wakeup", -1)
    if _STATE["reader"] is None or ours < 0:
        return False
    try:
        current = signal.set_wakeup_fd(ours, warn_on_full_buffer=False)  # the only way to read it
        if current != ours:
            signal.set_wakeup_fd(current)  # theirs: put it back
        return current == ours
    except ValueError:  # not the main thread
        return True


def _start_reader() -> None:
    """A thread woken through ``signal.set_wakeup_fd``: it dumps even while the main thread sits in MPI.

    Python runs signal handlers in the main thread between bytecodes only, so
    a rank blocked in a blocking MPI call would never dump; the C-level
    handler writes the signal number to the wakeup fd, which this thread
    reads. Skipped (the Python handler alone then serves) when the program
    already uses a wakeup fd (asyncio, for example).
    """
    r, w = os.pipe()
    os.set_blocking(w, False)
    try:
        old = signal.set_wakeup_fd(w, warn_on_full_buffer=False)
    except ValueError:
        os.close(r)
        os.close(w)
        return
    if old != -1:  # someone else's: put it back
        signal.set_wakeup_fd(old)
        os.close(r)
        os.close(w)
        return

    def run() -> None:
        while True:
            try:
                data = os.read(r, 64)
            except OSError:
                return
            if not data:
                return
            if signal.SIGUSR2 in data:
                dump("SIGUSR2", announce=True)

    t = threading.Thread(target=run, name="hpcdist-flight", daemon=True)
    _STATE["reader"] = t
    _STATE["wakeup"] = w
    t.start()
