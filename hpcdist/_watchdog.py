"""The watchdog of blocking MPI calls (``HPCDIST_WAIT=block``).

A blocking MPI call cannot be interrupted from Python. In ``block`` mode
hpcdist makes blocking operations call the blocking MPI routine (the fastest
path) and arms this watchdog around it: a daemon thread that, when a call
outlives its group's timeout, prints a :class:`~hpcdist.errors.DistTimeoutError`
message naming the operation and the group and ends the job with
``MPI_Abort`` — like NCCL's watchdog in torch. It never hangs forever, but
the error cannot be caught; ``HPCDIST_WAIT=poll`` raises it in the calling
thread instead (at some cost in speed). ``block`` is the default.

Each thread's call has its own deadline (docs/sharp-bits.md, "Threads"), and
a call that returns within a short grace period after its deadline is not
aborted.
"""

from __future__ import annotations

import contextlib
import sys
import threading
import time
from typing import Any

from .errors import timeout_message

_get_ident = threading.get_ident
_monotonic = time.monotonic
_INF = float("inf")

__all__ = ["Watchdog", "WATCHDOG"]


class _Limit:
    """A fixed time limit where an entry's owner has none (:meth:`Watchdog.arm`)."""

    __slots__ = ("_timeout_s",)

    def __init__(self, limit: float) -> None:
        self._timeout_s = limit


class Watchdog:
    """One daemon thread watching every blocking call in flight.

    An entry is ``(what, owner)``, a new tuple per call: the call's limit is
    ``owner._timeout_s`` (a process group's timeout, read when checked, so
    ``set_timeout`` applies at once). The calling thread reads no clock: the
    watchdog notes when it first sees an entry (it looks every 0.1 s at most)
    and counts the limit from there, so a call is ended between its limit and
    its limit + 0.1 s + the grace period. Two tables hold the calls in flight:

    ``calls``
        thread ident -> entry (:meth:`arm`/:meth:`disarm`: a thread has at
        most one blocking MPI call in flight);
    ``inflight``
        call domain -> entry: a process group, or one domain for all groups
        when MPI allows one thread in MPI at a time. A guarded call
        (:meth:`guard`) claims its domain's slot with one atomic
        ``dict.setdefault``: finding it taken means another thread is inside
        a blocking call there, and the call is refused. The claim is the
        watchdog's entry, so one dictionary operation serves as both the
        lock and the arming.

    A call hung in one thread is aborted on time while other threads go on
    with calls of their own.
    """

    def __init__(self, grace: float = 0.2) -> None:
        self.calls: dict[int, tuple[Any, Any]] = {}
        self.inflight: dict[Any, tuple[Any, Any]] = {}
        self._seen: dict[int, tuple[tuple[Any, Any], float]] = {}  # id(entry) -> (entry, when first seen)
        self.grace = grace  # a call past its deadline is given this long to return before the job is ended
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def arm(self, limit: float, what: Any) -> Any:
        """Watch this thread's next blocking call for ``limit`` s (until :meth:`disarm`).

        Returns the entry this one replaces (None if none): hand it to
        :meth:`disarm`, so an armed stretch that contains another (a bench pass
        around a call that sets up a segment) is watched again after it.
        """
        if self._thread is None:
            self._start()
        ident = _get_ident()
        previous = self.calls.get(ident)
        self.calls[ident] = (what, _Limit(limit))
        return previous

    def disarm(self, previous: Any = None) -> None:
        """End this thread's watch; ``previous`` (what :meth:`arm` returned) is watched again, its clock anew."""
        if previous is None:
            self.calls.pop(_get_ident(), None)
        else:
            self.calls[_get_ident()] = previous

    def guard(
        self,
        fn: Any,
        what: Any,
        domain: Any,
        on_busy: Any,
        owner: Any,
        buffer: tuple | None = None,
        shape: str | None = None,
    ) -> Any:
        """``fn`` as a blocking call of ``owner`` (a process group) in call domain ``domain``.

        The returned ``run`` claims the domain's slot in :attr:`inflight` with
        its entry (taken: it raises ``on_busy(what[0])``, another thread is
        inside a blocking call there), calls ``fn`` and frees the slot. With
        ``owner`` None the call is not watched (it enforces its own timeout:
        ``HPCDIST_WAIT=poll``); only the slot is claimed.

        ``run(*args)`` calls ``fn(*args)``; with ``buffer=(head, spec, tail)``,
        ``run(x)`` calls ``fn(head, [x, spec], tail)`` (an mpi4py buffer call
        with its fixed arguments bound, such as ``Allreduce(IN_PLACE, [x,
        datatype], op)``). ``shape`` names another way to place the bound
        datatype (:data:`_SHAPES`): ``"rooted"``, ``run(x, root)`` calls
        ``fn([x, spec], root)`` (``Bcast``); ``"gather"``, ``run(out, x)``
        calls ``fn([x, spec], [out, spec])`` (``Allgather``); ``"scatter"``,
        ``run(out, x)`` calls ``fn([x, spec], [out, spec], tail)``
        (``Reduce_scatter_block`` with its op bound); ``"reduce"``,
        ``run(x, root, mine)`` calls ``fn(head, [x, spec], tail, root)`` on
        the root (``mine``: ``Reduce(IN_PLACE, ...)``), else ``fn([x, spec],
        None, tail, root)``; ``"gatherv"``, ``run(x, out, counts, root)``
        calls ``fn([x, spec], [out, counts, spec], root)`` (``out`` None: no
        receive buffer, as on a non-root: ``Gatherv``); ``"scatterv"``,
        ``run(x, src, counts, root)`` the same with the roles swapped
        (``Scatterv``); ``"alltoallv"``, ``run(out, x, counts)`` calls
        ``fn([x, counts, spec], [out, counts, spec])`` (``Alltoallv`` with
        one ``(counts, displacements)`` both ways). It is the whole
        blocking hot path around an MPI routine (one Python frame, one tuple,
        no clock), so it is built once per (engine, routine).
        """
        self.start()
        head, spec, tail = buffer or (None, None, None)
        run = _guard_factory(shape or ("buffer" if buffer else "args"))(
            fn, what, domain, on_busy, owner, self.inflight, head, spec, tail
        )
        _GUARD_CODE.add(run.__code__)
        return run

    def start(self) -> None:
        """Start the watching thread (once; arming does it too)."""
        if self._thread is None:
            self._start()

    def _start(self) -> None:
        with self._lock:
            if self._thread is None:
                t = threading.Thread(target=self._run, name="hpcdist-watchdog", daemon=True)
                t.start()
                self._thread = t

    def _entries(self, now: float) -> list[tuple[dict[Any, Any], Any, float, tuple[Any, Any]]]:
        """(table, key, deadline, entry) of every call in flight; an entry's clock starts when first seen."""
        out = []
        seen, fresh = self._seen, {}
        for table in (self.calls, self.inflight):
            for key, entry in list(table.items()):
                hit = seen.get(id(entry))
                since = hit[1] if hit is not None and hit[0] is entry else now
                fresh[id(entry)] = (entry, since)
                owner = entry[1]
                out.append((table, key, since + (owner._timeout_s if owner is not None else _INF), entry))
        self._seen = fresh  # calls that ended are forgotten
        return out

    def overdue(self, now: float) -> tuple[dict[Any, Any], Any, float, tuple[Any, Any]] | None:
        """The first call in flight past its deadline at ``now``, as (its table, its key, deadline, entry); else None."""
        for hit in self._entries(now):
            if now > hit[2]:
                return hit
        return None

    def _run(self) -> None:
        while True:
            now = _monotonic()
            hit = self.overdue(now)
            if hit is not None:
                table, key, _, entry = hit
                time.sleep(self.grace)  # a call that returns right at its deadline is not aborted
                if table.get(key) is entry:
                    ident = key if table is self.calls else _thread_holding(entry)
                    self._fire(entry[0], entry[1]._timeout_s, _thread_name(ident))
                    return
                continue
            deadlines = [d for _, _, d, _ in self._entries(now)]
            left = min(deadlines) - now if deadlines else 0.1
            time.sleep(min(0.1, max(0.005, left)))

    def _fire(self, what: Any, limit: float, thread: str) -> None:
        then = (
            ". Ending the job (MPI_Abort) because a blocking MPI call cannot be interrupted (HPCDIST_WAIT=block); "
            "use HPCDIST_WAIT=poll to get a catchable exception."
        )
        message = timeout_message(what, limit, where=f" (in thread {thread!r})", then=then)
        abort_job(f"hpcdist.DistTimeoutError: {message}\n", 124)


#: the code objects of guarded calls' frames (to find the thread inside a guarded call)
_GUARD_CODE: set[Any] = set()

#: a guarded call's shapes: (run's parameters, the call of fn) — Watchdog.guard's ``buffer`` picks one
_SHAPES = {
    "args": ("*args", "fn(*args)"),
    "buffer": ("x", "fn(head, [x, spec], tail)"),
    "rooted": ("x, root", "fn([x, spec], root)"),
    "gather": ("out, x", "fn([x, spec], [out, spec])"),
    "scatter": ("out, x", "fn([x, spec], [out, spec], tail)"),
    "reduce": ("x, root, mine", "fn(head, [x, spec], tail, root) if mine else fn([x, spec], None, tail, root)"),
    "alltoallv": ("out, x, counts", "fn([x, counts, spec], [out, counts, spec])"),
    "gatherv": ("x, out, counts, root", "fn([x, spec], None if out is None else [out, counts, spec], root)"),
    "scatterv": ("x, src, counts, root", "fn(None if src is None else [src, counts, spec], [x, spec], root)"),
}
_FACTORIES: dict[str, Any] = {}
_GUARD_SOURCE = """
def make(fn, what, domain, on_busy, owner, inflight, head, spec, tail):
    claim = inflight.setdefault

    def run({params}):
        entry = (what, owner)
        if claim(domain, entry) is not entry:
            raise on_busy(what[0])
        try:
            return {call}
        except _MPIError as exc:  # MPI's own error (a message that did not fit): hpcdist's, naming the operation
            raise _failure(what, exc) from exc
        finally:
            del inflight[domain]

    return run
"""


def _guard_factory(shape: str) -> Any:
    """The maker of guarded calls of ``shape`` (one source for every shape, compiled on first use).

    Generated like ``dataclasses``' ``__init__``: each shape calls ``fn`` in its
    own frame with no wrapper between, which is the point of the hot path.
    """
    make = _FACTORIES.get(shape)
    if make is None:
        from mpi4py import MPI

        from .work import mpi_failure

        params, call = _SHAPES[shape]
        namespace: dict[str, Any] = {"_MPIError": MPI.Exception, "_failure": mpi_failure}
        exec(_GUARD_SOURCE.format(params=params, call=call), namespace)  # the fixed source above
        make = _FACTORIES[shape] = namespace["make"]
    return make


def _thread_holding(entry: Any) -> int | None:
    """The ident of the thread whose guarded call made ``entry`` (its frame holds it), else None."""
    for ident, frame in sys._current_frames().items():
        f: Any = frame
        while f is not None:
            if f.f_code in _GUARD_CODE and f.f_locals.get("entry") is entry:
                return ident
            f = f.f_back
    return None


def _thread_name(ident: int | None) -> str:
    return next((t.name for t in threading.enumerate() if t.ident == ident), str(ident))


#: internal: callables given the text of :func:`abort_job` before it prints it (tests/mpi_pytest.py shows it on
#: the terminal, where pytest's capture of the test's stderr would lose it with the process)
ABORT_HOOKS: list[Any] = []


def abort_job(text: str, code: int) -> None:
    """Print ``text`` to stderr and end the whole job with ``MPI_Abort(code)``.

    Flushes what the program printed first and gives the launcher a moment to
    forward the output. Aborts COMM_WORLD, or the world hpcdist joined over
    ports when this process was started without a launcher.
    """
    try:
        from .flight import on_abort

        for hook in ABORT_HOOKS:
            with contextlib.suppress(Exception):
                hook(text)
        on_abort(text)  # the flight recorder's dump (it names its file on stderr)
        sys.stdout.flush()
        sys.stderr.write(text)
        sys.stderr.flush()
        time.sleep(0.5)  # let the launcher forward the output before MPI_Abort tears the job down
    finally:
        from mpi4py import MPI

        from ._world import WORLD

        pg = WORLD.default_pg
        comm = pg._comm if pg is not None and MPI.COMM_WORLD.Get_size() == 1 else MPI.COMM_WORLD
        comm.Abort(code)


WATCHDOG = Watchdog()
