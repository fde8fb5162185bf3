"""``Work`` handles and futures for asynchronous operations.

A :class:`Work` wraps the MPI requests of one operation, the step that
finishes it (copy-back from a staging buffer, AVG scaling, unpacking a list
output) and references to every buffer involved, so nothing is freed while
MPI may still touch it. Completion is detected by polling the requests with
``MPI_Test``: spinning first (latency), then yielding the CPU with short
sleeps (oversubscribed nodes), until the deadline, after which
:class:`~hpcdist.errors.DistTimeoutError` is raised.
"""

from __future__ import annotations

import numbers
import os
import sys
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable, Sequence
from datetime import timedelta
from typing import Any

from ._exit import poison
from .errors import TIMEOUT_FIX, DistBackendError, DistError, DistTimeoutError, describe_op, timeout_message

__all__ = [
    "Future",
    "ProbedRecv",
    "Work",
    "completed_work",
    "finish_orphans",
    "mpi_failure",
    "pending_orphans",
    "reap_orphans",
    "strand",
    "test_all",
    "timeout_error",
    "wait_requests",
]

_monotonic = time.monotonic
_sleep = time.sleep
_get_ident = threading.get_ident
#: id(Work) -> ident of the thread testing its requests: MPI lets one thread at a time complete a request (MPICH
#: fails with an internal error otherwise), so a Work waited by several threads is tested by one, awaited by the rest
_TESTING: dict[int, int] = {}
_SPIN_S = 0.002  # spin this long before yielding the CPU between tests
_YIELD_S = 10.0  # then yield between tests this long, then sleep 1 ms between tests
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))


def wait_requests(reqs: Sequence[Any], timeout_s: float, status: Any = None) -> bool:
    """Poll ``reqs`` until all completed (True) or ``timeout_s`` passed (False).

    ``status``: an ``MPI.Status`` filled from a single request on completion.
    """
    if len(reqs) == 1:
        req = reqs[0]
        if status is None:
            test = req.Test
        else:

            def test() -> bool:
                return bool(req.Test(status))

    else:
        lst = list(reqs)

        def test() -> bool:
            return test_all(lst)

    if test():
        return True
    if all(type(r) in BLOCKING_REQUESTS for r in reqs):  # request-like objects that can wait without spinning
        deadline = _monotonic() + timeout_s
        return all(r.block(max(deadline - _monotonic(), 0.0)) for r in reqs)
    start = _monotonic()
    deadline = start + timeout_s
    n = 0
    while True:
        n += 1
        if test():
            return True
        if n & 63 == 0:
            now = _monotonic()
            if now >= deadline:
                return test()
            waited = now - start
            if waited > _SPIN_S:
                # MPI progresses non-blocking operations only inside MPI calls: keep testing, but let other
                # processes on an oversubscribed node run; sleep only once the wait is clearly abnormal
                if waited < _YIELD_S:
                    _yield()
                else:
                    _sleep(0.001)


#: request-like classes whose ``block(timeout_s) -> bool`` waits for completion without spinning (the hierarchical
#: engine's StepJob, registered by it): :func:`wait_requests` uses it when every request is one
BLOCKING_REQUESTS: set[type] = set()


def test_all(reqs: list[Any]) -> bool:
    """``MPI_Testall`` of ``reqs``; request-like objects of hpcdist's own (:class:`ProbedRecv`) tested one by one."""
    from mpi4py import MPI

    try:
        return bool(MPI.Request.Testall(reqs))
    except TypeError:  # a ProbedRecv among them
        return all([r.Test() for r in reqs])


class ProbedRecv:
    """A receive from any source as ``MPI_Improbe(ANY_SOURCE)`` polled, then ``MPI_Imrecv`` of the matched message.

    MPICH 4.3 can lose an ``MPI_Irecv(ANY_SOURCE)`` on a communicator built
    by ``MPI_Comm_connect``/``accept`` and merged (the launcher-free worlds of
    :mod:`hpcdist.rendezvous.ports`): the receive never completes. Probing and
    then receiving the matched message does not lose it. Has the
    ``Test``/``Cancel``/``Wait`` of an ``MPI.Request``; ``status`` is filled
    with the sender when the message is matched.
    """

    __slots__ = ("_comm", "_req", "_spec", "_tag", "status")

    def __init__(self, comm: Any, spec: Any, tag: int, status: Any) -> None:
        self._comm, self._spec, self._tag, self.status = comm, spec, tag, status
        self._req: Any = None

    def Test(self, status: Any = None) -> bool:
        if self._req is None:
            from mpi4py import MPI

            msg = self._comm.Improbe(MPI.ANY_SOURCE, self._tag, self.status)
            if msg is None:
                return False
            self._req = msg.Irecv(self._spec)
        return bool(self._req.Test())

    def Cancel(self) -> None:
        if self._req is not None:  # nothing is matched before the probe succeeds: nothing to cancel
            self._req.Cancel()

    def Wait(self) -> None:
        if self._req is not None:
            self._req.Wait()


def timeout_error(name: Any, limit: float, cancelled: bool = False) -> DistTimeoutError:
    """The error of an operation (``name``: a str or ``(opname, group)``) that outlived ``limit`` s.

    Unless ``cancelled`` (a receive was cancelled, or the operation is another
    thread's to finish or time out: a torch Work the progress thread owns), it
    is still in flight on this caller's account: the process is poisoned
    (:mod:`hpcdist._exit`), so exiting ends the job promptly instead of waiting
    in ``MPI_Finalize``.
    """
    if not cancelled:
        poison(f"{describe_op(name)} timed out after {limit:g}s")
    then = " (every rank of the group must make the same calls in the same order); " + TIMEOUT_FIX
    err = DistTimeoutError(timeout_message(name, limit, then=then))
    from .flight import on_timeout

    on_timeout(str(err))  # the flight recorder's dump, before anyone catches the error
    return err


def mpi_failure(name: Any, exc: BaseException) -> BaseException:
    """The error of an operation (``name``: a str or ``(opname, group)``) whose request completed with ``exc``.

    An ``MPI.Exception`` (MPI reports a failed request from ``MPI_Test``)
    becomes a :class:`~hpcdist.errors.DistBackendError` that says what went
    wrong and keeps MPI's own message (and ``__cause__``); any other
    exception is returned as it is.
    """
    from mpi4py import MPI

    if not isinstance(exc, MPI.Exception):
        return exc
    detail = str(exc).strip().splitlines()[-1].strip() if str(exc).strip() else "no message"
    cls = exc.Get_error_class()
    if cls == MPI.ERR_TRUNCATE:
        what = (
            "the message is larger than the receive buffer (MPI_ERR_TRUNCATE): a receive must be at least as large "
            "as the message it matches (pass an array of the sender's size and dtype)"
        )
    else:
        what = f"MPI reported error class {cls} ({_error_string(cls)})"
    op = name[0] if isinstance(name, tuple) else name
    if cls in (MPI.ERR_TRUNCATE, MPI.ERR_IN_STATUS) and op not in _P2P_NAMES:
        what += (
            "; in a collective this usually means the ranks passed arrays of different sizes "
            "(TORCH_DISTRIBUTED_DEBUG=DETAIL checks every call and names the ranks)"
        )
    err = DistBackendError(f"{describe_op(name)} failed: {what}; MPI: {detail}")
    err.__cause__ = exc
    return err


#: the names of point-to-point operations' Works and calls (every p2p call, batched and object ones too): their MPI
#: errors concern one message, not the group's agreement on sizes
_P2P_NAMES = frozenset({"send", "recv"})


def _error_string(cls: int) -> str:
    from mpi4py import MPI

    try:
        return str(MPI.Get_error_string(cls)).strip()
    except Exception:  # an error class the library cannot describe
        return "no description"


class Work:
    """The handle of one asynchronous operation (torch's ``Work``).

    ``wait()`` blocks until the operation completed and its result is in the
    output arrays, or raises :class:`~hpcdist.errors.DistTimeoutError` after
    ``timeout`` (default: the group's timeout).
    """

    __slots__ = (
        "__weakref__",  # the flight recorder reads an async operation's state through a weak reference
        "_done",
        "_exc",
        "_future",
        "_keep",
        "_name",
        "_on_timeout",
        "_post",
        "_reqs",
        "_result",
        "_source",
        "_status",
        "_timeout_s",
    )

    def __init__(
        self,
        reqs: Sequence[Any],
        post: Callable[[], Any] | None,
        keep: Any,
        timeout_s: float,
        name: Any,
        result: Any = None,
        on_timeout: Callable[[], None] | None = None,
    ) -> None:
        self._reqs = reqs
        self._post = post
        self._keep = keep
        self._timeout_s = timeout_s
        self._name = name
        self._result = result
        self._done = False
        self._exc: BaseException | None = None
        self._future: Future | None = None
        self._source = -1
        self._on_timeout = on_timeout
        self._status: Any = None  # an MPI.Status for receives (source_rank)

    def __del__(self) -> None:
        if not self._done and self._reqs:
            if sys.is_finalizing():  # a Work kept by a cycle until interpreter shutdown: MPI has ended or is ending
                return
            if self._exc is None:
                _orphan(self._reqs, self._post, self._keep, self._timeout_s, self._name, self._status)
            elif not _all_done(self._reqs):  # timed out and still in flight: MPI may yet write its buffers
                strand(self._reqs, self._keep)
        if _HELD:
            unhold(self)  # handed on above with the finishing step that uses them, or no longer needed

    def _finish(self) -> None:
        post = self._post
        self._post = None
        try:
            if post is not None:
                out = post()
                if out is not None:
                    self._result = out
        except BaseException as exc:  # keep it for exception()/is_success()
            self._exc = exc
        finally:
            self._keep = None
            self._reqs = ()
            self._done = True  # after the finishing step: another thread's is_completed() means the result is there
        fut = self._future
        if fut is not None:
            fut._set(_as_list(self._result), self._exc)
        if self._exc is not None:
            raise self._exc

    def _fail(self, exc: BaseException) -> BaseException:
        """Record that a request completed with an error (``exc``, raised by ``MPI_Test``): the Work failed for good."""
        err = mpi_failure(self._name, exc)
        self._exc = err
        self._post = None  # the outputs hold no result: no copy-back, no source rank
        if self._future is not None:
            self._future._set(None, err)
        return err

    def wait(self, timeout: timedelta | float | None = None) -> bool:
        """Block until complete; True. Raises DistTimeoutError after ``timeout``.

        ``timeout``: a ``datetime.timedelta`` or a number of seconds; None or
        zero (torch's ``timedelta(0)``): the group's timeout. A negative,
        NaN or non-number timeout raises ValueError/TypeError before waiting.
        A Work that failed (timed out, or its request completed with an MPI
        error) stays failed: every later ``wait()`` raises the same error.
        """
        limit = self._timeout_s if timeout is None else _wait_limit(timeout, self._timeout_s)
        if self._exc is not None:  # a cancelled receive must not run its finishing step (copy-back, source) later
            raise self._exc
        if self._done:
            return True
        key, me = id(self), _get_ident()
        if _TESTING.get(key) == me:  # again from inside this thread's own completion (a future's callback)
            return self._wait_here(limit)
        if _TESTING.setdefault(key, me) != me:
            return self._wait_other(limit)
        try:
            return self._wait_here(limit)
        finally:
            del _TESTING[key]

    def _wait_other(self, limit: float) -> bool:
        """:meth:`wait` while another thread tests this Work's requests (MPI lets one thread complete a request):
        until that thread finished it, then as :meth:`wait` again; DistTimeoutError after ``limit``."""
        deadline = _monotonic() + limit
        while id(self) in _TESTING:
            if _monotonic() >= deadline:  # the other thread goes on waiting, for its own timeout
                raise timeout_error(self._name, limit, cancelled=True)
            _sleep(0.0002)
        return self.wait(max(deadline - _monotonic(), 1e-9))

    def _wait_here(self, limit: float) -> bool:
        """:meth:`wait` by the thread that tests this Work's requests."""
        try:
            finished = not self._reqs or wait_requests(self._reqs, limit, self._status)
        except Exception as failed:  # MPI_Test reported a failed request (a message larger than the receive buffer)
            raise self._fail(failed)  # noqa: B904 (mpi_failure chains MPI's error as __cause__)
        if not finished:
            if self._on_timeout is not None:
                self._on_timeout()
            exc = timeout_error(self._name, limit, cancelled=self._on_timeout is not None)
            self._exc = exc
            if self._future is not None:
                self._future._set(None, exc)
            raise exc
        self._finish()
        if _ORPHANS:
            reap_orphans()
        return True

    # -- composition (for engines and collectives; the fields above stay private) --------

    def chain(self, step: Callable[[], Any] | None = None, *, within: Any = None, name: Any = None) -> Work:
        """A Work that takes this one over and runs ``step()`` after it finished.

        The new Work owns this one's requests: wait on it, not on this one.
        It completes when they did, after this Work's own finishing step (run
        inside the context manager ``within`` when given, e.g. the array's
        CUDA stream) and then ``step()``. It keeps this Work's result (or
        ``step``'s return value when that is not None), its sender for
        :meth:`source_rank` and its cancel-on-timeout.

        Args:
            step: what to run once this Work finished (copies back, stream
                synchronization, returning staging blocks); None: nothing.
            within: a context manager entered around this Work's finishing step.
            name: the new Work's name in errors; default this one's.

        Returns:
            The new Work.
        """
        reqs, self._reqs = self._reqs, ()
        inner = self
        # the new Work by weak reference: a closure holding it would make a cycle (Work -> post -> Work), and a
        # dropped Work in a cycle is not handed to the orphans (finished at the next wait or barrier) until a
        # garbage collection finds it; its copy-back would wait for that
        outer_ref: list[Any] = []

        def post() -> Any:
            if within is None:
                inner._finish()
            else:
                with within:
                    inner._finish()
            outer = outer_ref[0]() if inner._source >= 0 else None
            if outer is not None:  # None once dropped: nobody asks a dropped Work for its sender
                outer._source = inner._source
            return None if step is None else step()

        outer = Work(
            reqs, post, inner, self._timeout_s, self._name if name is None else name, self._result, self._on_timeout
        )
        outer._status = self._status
        outer_ref.append(weakref.ref(outer))
        return outer

    @classmethod
    def receive(
        cls,
        req: Any,
        status: Any,
        ranks: Sequence[int],
        post: Callable[[], Any] | None,
        keep: Any,
        timeout_s: float,
        name: Any,
        result: Any = None,
        on_timeout: Callable[[], None] | None = None,
    ) -> Work:
        """The Work of one receive: ``req`` fills ``status``; :meth:`source_rank` is then
        ``ranks[status.Get_source()]`` (``ranks``: the group's global ranks), set before ``post`` runs."""
        work_ref: list[Any] = []  # by weak reference, as in chain(): no cycle keeps a dropped receive from the orphans

        def finish() -> Any:
            work = work_ref[0]()
            if work is not None:
                work._source = ranks[status.Get_source()]
            return post() if post is not None else None

        work = cls([req], finish, keep, timeout_s, name, result, on_timeout)
        work._status = status
        work_ref.append(weakref.ref(work))
        return work

    @classmethod
    def combine(cls, works: Sequence[Work], name: Any, timeout_s: float, result: Any = None) -> Work:
        """One Work over several started operations: it completes when all did, finishing each in order.

        Its result is ``result`` when given (a caller whose parts' results
        are pieces of one answer: the arrays in the order the caller was
        given them), else the list of the parts' results. Works of one kind
        that know a cheaper way (NCCL's: the last part's CUDA event covers
        all parts on one stream) combine their own way.

        Args:
            works: the parts (wait on the combined Work, not on them).
            name: the combined Work's name in errors, e.g. ``(opname, group)``.
            timeout_s: its default timeout for :meth:`wait`.
            result: the combined Work's result (None: the list of the parts' results).

        Returns:
            The combined Work.
        """
        for w in works:  # a kind with its own way (any part of it: host parts beside NCCL ones too)
            kind = type(w)
            if kind.combine.__func__ is not Work.combine.__func__:  # type: ignore[attr-defined]
                return kind.combine(
                    works, name, timeout_s, result
                )  # it falls back on _merged where it cannot do better
        return Work._merged(works, name, timeout_s, result=result)

    @staticmethod
    def _merged(
        works: Sequence[Work], name: Any, timeout_s: float, kind: type[Work] | None = None, result: Any = None
    ) -> Work:
        """:meth:`combine` for any Works: their requests, tested together; their finishing steps, in order.

        ``kind``: the class of the combined Work (a Work subclass that knows more of its parts); default Work."""
        reqs = [r for w in works for r in w._reqs]
        for w in works:
            w._reqs = ()

        def post() -> Any:
            out = []
            for w in works:
                w._finish()
                out.append(w._result)
            return out if result is None else result

        return (kind or Work)(reqs, post, list(works), timeout_s, name, result)

    def synchronize(self) -> None:
        """Same as :meth:`wait` for host work."""
        self.wait()

    def block_current_stream(self) -> None:
        self.wait()

    def is_completed(self) -> bool:
        """Non-blocking: has the operation completed (successfully or not)?

        False while another thread tests its requests (in :meth:`wait`)."""
        if self._done or self._exc is not None:
            return True
        key, me = id(self), _get_ident()
        if _TESTING.get(key) == me:
            return self._test_here()
        if _TESTING.setdefault(key, me) != me:
            return False
        try:
            return self._test_here()
        finally:
            del _TESTING[key]

    def _test_here(self) -> bool:
        reqs = self._reqs
        try:
            ready = (
                reqs[0].Test(self._status) if self._status is not None and reqs else not reqs or test_all(list(reqs))
            )
        except Exception as exc:  # a failed request: completed, not successfully
            self._fail(exc)
            return True
        if ready:
            try:
                self._finish()
            except BaseException:
                pass
            if _ORPHANS:
                reap_orphans()
            return True
        return False

    def is_success(self) -> bool:
        """True when completed without error."""
        if not self.is_completed():
            raise DistError("is_success() called on a Work that has not completed; call wait() first")
        return self._exc is None

    def exception(self) -> BaseException | None:
        return self._exc

    def source_rank(self) -> int:
        """The global rank a receive got its message from."""
        if self._source < 0:
            raise DistBackendError("source_rank() is only defined for completed receives")
        return self._source

    def _source_rank(self) -> int:
        """torch's private spelling of :meth:`source_rank` (torch's own code calls it)."""
        return self.source_rank()

    def result(self) -> list[Any]:
        """The output arrays of the operation (waits first)."""
        self.wait()
        return _as_list(self._result)

    def get_future(self) -> Future:
        """A :class:`Future` completed with this work's result: the list of its output arrays (as torch)."""
        if self._future is None:
            self._future = Future(self)
            if self._done or self._exc is not None:  # completed, or failed for good (timed out, MPI error)
                self._future._set(None if self._exc is not None else _as_list(self._result), self._exc)
        return self._future

    def __repr__(self) -> str:
        state = "completed" if self._done else "pending"
        return f"<hpcdist.Work {self._name} {state}>"


# ---------------------------------------------------------------- dropped handles

#: Objects a live Work needs once dropped, by the Work's id, until its ``__del__`` (see :func:`hold`).
_HELD: dict[int, Any] = {}


def hold(work: Work, objs: Any) -> None:
    """Keep ``objs`` alive from outside ``work`` until ``work``'s ``__del__`` hands them on.

    A Work whose future was asked for and its :class:`Future` reference each
    other, so a dropped one dies in the cycle collector, not at once. The
    collector runs the finalizer of every object that only this garbage
    reaches, before or after the Work's ``__del__``. CuPy's ``Stream`` and
    ``Event`` destroy their CUDA handles in ``__del__``: a finishing step (or
    NCCL's hand-over) would then use a destroyed stream or event, whose
    handle CUDA gives to the next one created. Objects held here are
    reachable, so never part of that garbage.
    """
    _HELD[id(work)] = objs


def unhold(work: Work, default: Any = None) -> Any:
    """Let go of what :func:`hold` kept for ``work`` (from its ``__del__``); return it, or ``default``."""
    return _HELD.pop(id(work), default)


#: Operations whose Work was dropped before completing: (requests, finishing step, buffers, timeout, name, the
#: ``MPI.Status`` of a receive or None), oldest first (``name``: the Work's, ``(opname, group)`` for the operations
#: of a group).
_ORPHANS: deque[tuple[Sequence[Any], Callable[[], Any] | None, Any, float, Any, Any]] = deque()
_ORPHAN_LOCK = threading.Lock()
_MAX_ORPHANS = 1024  # beyond this many dropped operations in flight, the oldest are waited for (back-pressure)
#: (requests, buffers) of dropped Works that timed out while in flight: a late peer may still make MPI write the
#: buffers, so they are never freed (a timeout poisons the process: it ends at exit)
_STRANDED: list[tuple[Sequence[Any], Any]] = []
_P2P = ("send", "recv")  # the names of point-to-point Works: a barrier does not imply their peer came


def strand(reqs: Sequence[Any], keep: Any) -> None:
    """Keep the requests and buffers of an operation that timed out in flight, for good.

    A late peer may still make MPI write (or read) the buffers: freeing them
    would let MPI corrupt memory reused since, or send garbage to the peer.
    A timeout poisons the process (:mod:`hpcdist._exit`), so this lasts
    until its end.
    """
    _STRANDED.append((reqs, keep))


def _orphan(
    reqs: Sequence[Any], post: Callable[[], Any] | None, keep: Any, timeout_s: float, name: Any, status: Any = None
) -> None:
    """Adopt the requests of a dropped Work: they complete (and are released) in the background.

    Letting mpi4py free an active request leaks it in MPICH until it
    completes, is erroneous for a non-blocking collective, and frees buffers
    MPI may still write. hpcdist keeps them and finishes them (copy-back, AVG
    scaling) as they complete -- tested oldest first whenever another Work is
    dropped, waited or completes (:func:`reap_orphans`), and every one of a
    group's collectives at its barrier (:func:`finish_orphans`) -- and waits
    for the oldest when more than ``_MAX_ORPHANS`` are in flight, so a loop of
    fire-and-forget ``isend``s runs in bounded memory.
    """
    _ORPHANS.append((reqs, post, keep, timeout_s, name, status))
    reap_orphans()


def reap_orphans() -> None:
    """Finish the dropped operations that completed, oldest first, up to the first one still in flight.

    Beyond ``_MAX_ORPHANS`` in flight, the oldest is waited for (its
    timeout). Returns at once when called again from inside (a Work
    collected while a finishing step runs is kept for the next time).
    """
    if not _ORPHAN_LOCK.acquire(False):
        return
    try:
        _reap()
    finally:
        _ORPHAN_LOCK.release()


def _reap() -> None:
    from mpi4py import MPI

    if MPI.Is_finalized():
        _ORPHANS.clear()
        return
    while _ORPHANS:
        reqs, post, _keep, timeout_s, _name, status = _ORPHANS[0]
        done = _all_done(reqs, status)
        if not done and (len(_ORPHANS) <= _MAX_ORPHANS or not wait_requests(reqs, timeout_s, status)):
            return  # the oldest is still in flight (and within the bound, or its peer is gone)
        _ORPHANS.popleft()
        _run_post(post)


def finish_orphans(group: Any = None) -> None:
    """Wait for ``group``'s dropped collectives and finish them (copy-back, AVG scaling); then :func:`reap_orphans`.

    ``group``: a ProcessGroup; None: the default group. For a barrier of ``group`` to call once it completed (gloo's barrier
    waits for the group's earlier work): every rank then started every
    earlier collective of the group, so these complete promptly. Waits at
    most each operation's timeout (then DistTimeoutError names it).
    Point-to-point operations are not waited for (a barrier says nothing of
    their peer), only finished if they completed.
    """
    if not _ORPHANS:
        return
    if group is None:
        from ._world import WORLD

        group = WORLD.default_pg
    if not _ORPHAN_LOCK.acquire(False):  # called from a finishing step (or a callback) while reaping
        return
    try:
        mine = [o for o in _ORPHANS if _group_of(o[4]) is group and _opname(o[4]) not in _P2P]
        for orphan in mine:
            reqs, post, _keep, timeout_s, name, status = orphan
            _ORPHANS.remove(orphan)
            if not _all_done(reqs, status) and not wait_requests(reqs, timeout_s, status):
                strand(reqs, _keep)
                raise timeout_error(name, timeout_s)
            _run_post(post)
        _reap()
    finally:
        _ORPHAN_LOCK.release()


def _run_post(post: Callable[[], Any] | None) -> None:
    if post is not None:
        try:
            post()
        except Exception:  # nobody is left to receive the error of a dropped operation
            pass


def _all_done(reqs: Sequence[Any], status: Any = None) -> bool:
    """Whether every request completed (a failed request counts: nobody is left to receive its error).

    ``status``: a receive's ``MPI.Status``, filled on completion (its finishing step may read the count)."""
    try:
        if status is not None and len(reqs) == 1:
            return bool(reqs[0].Test(status))
        return test_all(list(reqs))
    except Exception:
        return True


def _group_of(name: Any) -> Any:
    return name[1] if isinstance(name, tuple) and len(name) == 2 else None


def _opname(name: Any) -> Any:
    return name[0] if isinstance(name, tuple) and name else name


def pending_orphans() -> int:
    """How many dropped operations are still in flight (for tests and ``hpcdist info``)."""
    return len(_ORPHANS)


def _as_list(res: Any) -> list[Any]:
    if res is None:
        return []
    return list(res) if isinstance(res, (list, tuple)) else [res]


def _wait_limit(timeout: Any, default: float) -> float:
    """The seconds ``Work.wait(timeout)`` waits: ``default`` for zero (torch's ``timedelta(0)``: no timeout given).

    TypeError for anything but a ``timedelta`` or a real number, ValueError
    for a negative or NaN one, before anything waits.
    """
    if isinstance(timeout, timedelta):
        seconds = timeout.total_seconds()
    elif isinstance(timeout, numbers.Real) and not isinstance(timeout, bool):
        seconds = float(timeout)
    else:
        raise TypeError(
            f"Work.wait: timeout must be a datetime.timedelta or a number of seconds, got {type(timeout).__name__} "
            f"({timeout!r:.60})"
        )
    if not seconds >= 0:  # NaN too
        raise ValueError(
            f"Work.wait: timeout must be >= 0 (0: the group's timeout), got {timeout!r}; use is_completed() to test "
            "without waiting"
        )
    return seconds if seconds > 0 else default


def completed_work(name: Any, result: Any = None) -> Work:
    """A Work that is already complete (operations that moved nothing)."""
    w = Work((), None, None, 0.0, name, result)
    w._done = True
    return w


class Future:
    """A minimal ``torch.futures.Future``: ``wait``, ``done``, ``value``, ``then``."""

    __slots__ = ("_callbacks", "_done", "_exc", "_value", "_work")

    def __init__(self, work: Work | None = None) -> None:
        self._work = work
        self._done = False
        self._value: Any = None
        self._exc: BaseException | None = None
        self._callbacks: list[Callable[[Future], None]] = []

    def _set(self, value: Any, exc: BaseException | None) -> None:
        if self._done:
            return
        self._value, self._exc, self._done = value, exc, True
        callbacks, self._callbacks = self._callbacks, []
        for cb in callbacks:
            _run_callback(cb, self)

    def set_result(self, value: Any) -> None:
        if self._done:
            raise DistError("Future.set_result: the future is already completed")
        self._set(value, None)

    def set_exception(self, exc: BaseException) -> None:
        if self._done:
            raise DistError("Future.set_exception: the future is already completed")
        self._set(None, exc)

    def done(self) -> bool:
        if not self._done and self._work is not None:
            self._work.is_completed()
        return self._done

    def wait(self) -> Any:
        """Block until done; return the value or raise the error."""
        if not self._done:
            if self._work is None:
                raise DistError("Future.wait: this future has no work behind it and was never completed")
            try:
                self._work.wait()
            except BaseException as exc:
                self._set(None, exc)
            if not self._done:  # pragma: no cover - a completed Work completes its futures
                raise DistError("Future.wait: the work completed but this future was not completed")
        if self._exc is not None:
            raise self._exc
        return self._value

    def value(self) -> Any:
        if not self._done:
            raise DistError("Future.value() called before the future completed; call wait()")
        if self._exc is not None:
            raise self._exc
        return self._value

    def then(self, callback: Callable[[Future], Any]) -> Future:
        """A new future completed with ``callback(self)`` once this one is done."""
        child = Future(None)
        child._work = self._work  # so child.wait() drives completion

        def run(parent: Future) -> None:
            try:
                child._set(callback(parent), None)
            except BaseException as exc:
                child._set(None, exc)

        if self._done:
            run(self)
        else:
            self._callbacks.append(run)
        return child

    def add_done_callback(self, callback: Callable[[Future], None]) -> None:
        """Run ``callback(self)`` once done (now if done). An error it raises is printed and ignored (as torch)."""
        if self._done:
            _run_callback(callback, self)
        else:
            self._callbacks.append(callback)


def _run_callback(callback: Callable[[Future], Any], fut: Future) -> None:
    """``callback(fut)``; an error is printed to stderr and dropped, as torch does (the operation itself succeeded,
    and the other callbacks, ``then`` children included, still run)."""
    try:
        callback(fut)
    except Exception:
        import traceback

        sys.stderr.write(
            f"hpcdist: a Future's done callback {callback!r} raised (ignored; use Future.then to get the error):\n"
            + traceback.format_exc()
        )
