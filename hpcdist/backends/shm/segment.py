"""One shared-memory segment of a node's ranks, and its counter barrier.

**Memory.** A POSIX shared-memory file (``/dev/shm/hpcdist-<pidns>-<pid>-<random>``:
the creator's PID namespace and process id) that the communicator's rank 0 creates and sizes, whose name it hands to the
others (a polled ``MPI_Ibcast``), which every rank maps, and which rank 0
unlinks as soon as every rank has mapped it (a polled barrier): nothing is
left in ``/dev/shm`` even when a process is killed later, and the mapping
lives until every rank unmaps it. A job killed *during* that setup (another
rank's exception ends it with ``MPI_Abort``) leaves the file; the next rank 0
that creates a segment on the node first removes every such file of its own
user whose creator, a process of its own PID namespace, no longer exists
(:func:`sweep`). Unlike an MPI-3 shared window this works in
every world, launcher-free ones included (MPICH refuses shared windows to
processes joined through ports), and freeing it is local (``MPI_Win_free`` is
a collective that waits for a stuck peer). Every step of the setup is bounded
by the timeout: a peer that never comes gives
:class:`~hpcdist.errors.DistTimeoutError`, not a hang.

Layout::

    [ control: one 64-byte line per rank: its step counter, two operation tags (begin) ]
    [ set 0: slot 0 | slot 1 | ... | slot n-1 ]   each slot ``slot_bytes``
    [ set 1: ... ]
    [ set 2: ... ]

**Synchronization.** Every rank owns one int64 counter, alone on its cache
line. :meth:`Segment.sync` is a barrier: the rank raises its counter to its
next step and waits until every other counter reached that step. All ranks
run the same sequence of syncs (the algorithms are deterministic functions of
the sizes, which agree on every rank), so equal step numbers mean the same
point of the program. The counter is one aligned 8-byte store and load
(``memoryview`` of format ``q``), which x86-64 and AArch64 perform
atomically. Memory order: on x86-64 (total store order) stores become
visible in program order and loads are not reordered with older loads, so
"write the data, then the counter" and "see the counter, then read the data"
need no fence (every NumPy call is an opaque function call, so nothing is
reordered at compile time either). Elsewhere ``MPI_Win_sync`` on a small
window of this process (a full memory barrier in MPICH and Open MPI) runs
before the counter store and after the wait. Waits spin briefly, then yield
the CPU (``sched_yield``: oversubscribed nodes), then sleep 1 ms, and raise
DistTimeoutError after the group's timeout; after that the segment is
*broken* (its counters are out of step) and every later use raises at once.

**Sets rotate by step.** The set an algorithm first writes in the interval
after sync step ``t`` is set ``t % 3``; an algorithm may touch it during that
interval and the two after it, never later. A rank can only be two intervals
ahead of the slowest (it cannot pass a sync the slowest has not reached), so
three sets make every reuse safe, within one operation (pipelined chunks) and
across consecutive operations, with no extra sync.
"""

from __future__ import annotations

import functools
import mmap
import os
import platform
import secrets
import time
from collections.abc import Callable
from typing import Any, TypeVar

import numpy as np

from ..._timed import timed_allgather_json, timed_bcast_json
from ...errors import DistError, DistTimeoutError, describe_op
from ...work import timeout_error

__all__ = ["NSETS", "Segment", "sweep"]

NSETS = 3
_LINE = 64  # bytes per rank counter: one cache line each (no false sharing)
_SPIN = 64  # polls before yielding the CPU
_YIELD_S = 10.0  # then yield this long, then sleep 1 ms per poll
_yield = getattr(os, "sched_yield", lambda: time.sleep(0))
_SHM_DIR = "/dev/shm"
_TSO = platform.machine().lower() in ("x86_64", "amd64", "i386", "i686", "x86")
_HINT = (
    "every rank of the group must make the same collective calls in the same order; a rank that never comes, "
    "crashed or is stuck leaves the others waiting (raise timeout= if it is just slow; HPCDIST_SHM=0 turns "
    "shared memory off)"
)


def _fence_window() -> Any:
    """None on x86-64 (TSO, see the module docstring), else a window of this process whose ``Sync`` is a fence."""
    if _TSO:
        return None
    from mpi4py import MPI

    win = MPI.Win.Allocate(8, 1, comm=MPI.COMM_SELF)
    win.Lock_all(MPI.MODE_NOCHECK)
    return win


def _nothing() -> None:
    return None


@functools.cache
def _pid_namespace() -> str:
    """This process's PID namespace as a short token, read once ("0" where /proc does not tell)."""
    try:
        link = os.readlink("/proc/self/ns/pid")  # "pid:[4026531836]"
    except OSError:
        return "0"
    return "".join(c for c in link if c.isdigit()) or "0"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # EPERM: it exists, as another user's process
        return True
    return True


def sweep(directory: str = _SHM_DIR) -> list[str]:
    """Remove the segment files left by dead creators of this PID namespace and user; the paths removed.

    A file is left only when its job was killed between creating it and every rank mapping it; a live
    creator's file (its setup still running) and files of other namespaces (whose process ids mean
    nothing here) or users are never touched.
    """
    prefix = f"hpcdist-{_pid_namespace()}-"
    uid = os.getuid()
    removed: list[str] = []
    try:
        names = [n for n in os.listdir(directory) if n.startswith(prefix)]
    except OSError:
        return removed
    for name in names:
        pid = name[len(prefix) :].split("-", 1)[0]
        path = f"{directory}/{name}"
        try:
            if not pid.isdigit() or _alive(int(pid)) or os.stat(path).st_uid != uid:
                continue
            os.unlink(path)
        except OSError:  # gone meanwhile (another rank 0 swept it), or not ours to remove
            continue
        removed.append(path)
    return removed


def _create(total: int) -> tuple[str, int]:
    """Rank 0: a new shared-memory file of ``total`` bytes (zeroed); its path and descriptor.

    The pages are reserved now (``posix_fallocate``): a ``/dev/shm`` too small for them (a container's
    64 MiB default) is ENOSPC here, not a SIGBUS at the first write into the mapping.
    """
    sweep()
    for _ in range(8):
        path = f"{_SHM_DIR}/hpcdist-{_pid_namespace()}-{os.getpid()}-{secrets.token_hex(6)}"
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:  # pragma: no cover - 48 random bits collided
            continue
        try:
            os.ftruncate(fd, total)
            if total and hasattr(os, "posix_fallocate"):
                os.posix_fallocate(fd, 0, total)
        except OSError:
            os.close(fd)
            os.unlink(path)
            raise
        return path, fd
    raise OSError(f"no free name for a shared-memory file in {_SHM_DIR}")  # pragma: no cover


#: why a segment is out of step after a wait ran past the group's timeout (the later uses raise DistTimeoutError)
_TIMED_OUT = "a wait timed out"


_F = TypeVar("_F", bound=Callable[..., Any])


def interruptible(algorithm: _F) -> _F:
    """For the algorithms run on a begun operation (first argument: the :class:`Segment`). An exception other
    than hpcdist's own escaping one (KeyboardInterrupt in a notebook, a signal handler's error, NumPy's) leaves
    this rank's counters mid-operation: the segment then refuses reuse (this rank's next call raises at once,
    the peers time out). Otherwise the next operation's syncs would release a peer still in this one past a
    sync it must wait at, to read a slot being rewritten. hpcdist's own errors mark the segment themselves where
    it is out of step. Costs a call frame on the shared-memory path only."""

    @functools.wraps(algorithm)
    def guarded(seg: Segment, *args: Any, **kwargs: Any) -> Any:
        try:
            return algorithm(seg, *args, **kwargs)
        except DistError:
            raise
        except BaseException as exc:
            seg.interrupted(exc)
            raise

    return guarded  # type: ignore[return-value]


class Segment:
    """A shared segment of ``3 x size`` slots of ``slot_bytes`` over the node communicator ``comm``.

    Collective over ``comm`` (every rank constructs it; :meth:`free` is local).
    ``what``: the (operation, group) named by timeout errors.
    """

    def __init__(self, comm: Any, slot_bytes: int, timeout_s: float, what: Any, op_names: tuple[str, ...] = ()) -> None:
        self.comm = comm
        self.size = n = comm.Get_size()
        self.rank = comm.Get_rank()
        self.slot_bytes = int(slot_bytes)
        self.timeout_s = timeout_s
        self.what = what
        self.broken = ""  # why the counters are out of step ("": they are not): a timeout, a mismatch, ...
        ctrl = -(-_LINE * n // 4096) * 4096  # the data starts page-aligned
        self.set_bytes = n * self.slot_bytes
        total = ctrl + NSETS * self.set_bytes
        self._map: mmap.mmap | None = _map_shared(comm, total, timeout_s, describe_op(what))[0]
        self.mem = np.frombuffer(self._map, dtype=np.uint8, count=total)
        self._ctrl = memoryview(self._map)[:ctrl].cast("q")
        self._words = memoryview(self._map)[ctrl:].cast("q")  # the data area as int64 words (exchange)
        self.data = self.mem[ctrl:]
        self._typed: dict[np.dtype, np.ndarray] = {}  # dtype -> the data area viewed as it (items())
        self._mine = self.rank * (_LINE // 8)
        self._others = [r * (_LINE // 8) for r in range(n) if r != self.rank]
        self._fence_win = _fence_window()
        self._fence = self._fence_win.Sync if self._fence_win is not None else _nothing
        self.step = 0
        self.op_names = op_names  # op code - 1 -> name, for mismatch errors (begin)
        self.kind_name: Callable[[int], str] = str  # a tag's kind (begin's op >> 8: dtype, reduction) -> words
        self.seq = 0  # operations begun on this segment
        self._tag: tuple[int, int, int] | None = None  # the begun operation's, until its first sync checks it

    # -- layout ------------------------------------------------------------

    def set_of(self, step: int) -> int:
        """The set first written in the interval after sync ``step``."""
        return step % NSETS

    def slot(self, set_: int, rank: int, dtype: Any, count: int, start: int = 0) -> np.ndarray:
        """``count`` items of ``dtype`` from item ``start`` of ``rank``'s slot in ``set_``."""
        dt = np.dtype(dtype)
        off = set_ * self.set_bytes + rank * self.slot_bytes + start * dt.itemsize
        return self.data[off : off + count * dt.itemsize].view(dt)

    def items(self, dtype: Any) -> np.ndarray:
        """The data area as one 1-D array of ``dtype`` (cached): slot ``r`` of set ``s`` starts at item
        ``(s * size + r) * slot_bytes // itemsize`` — what hot loops slice instead of calling :meth:`slot`."""
        dt = np.dtype(dtype)
        view = self._typed.get(dt)
        if view is None:
            usable = self.data.size // dt.itemsize * dt.itemsize
            view = self._typed[dt] = self.data[:usable].view(dt)
        return view

    def whole(self, set_: int, dtype: Any, count: int) -> np.ndarray:
        """``count`` items of ``dtype`` over the whole of set ``set_`` (all slots, for one writer)."""
        off = set_ * self.set_bytes
        dt = np.dtype(dtype)
        return self.data[off : off + count * dt.itemsize].view(dt)

    def exchange(self, words: list[int]) -> list[list[int]]:
        """Post ``words`` (int64) in this rank's slot of the current set, sync, and return every rank's
        words, by rank. One sync (which checks the begun operation's tags); at most a slot's worth."""
        k = len(words)
        stride = self.slot_bytes // 8
        base = self.set_of(self.step) * (self.set_bytes // 8)
        w = self._words
        at = base + self.rank * stride
        for i, v in enumerate(words):
            w[at + i] = v
        self.sync()
        return [w[base + r * stride : base + r * stride + k].tolist() for r in range(self.size)]

    # -- synchronization ------------------------------------------------------

    def begin(self, op: int, nbytes: int) -> None:
        """Tag the operation this rank starts on the segment: ``op`` (a code >= 1 in its low byte, the kind
        above: dtype and reduction, named by :attr:`kind_name`) and its size (0: sizes may differ by rank);
        the first :meth:`sync` after it checks that every rank started the same one.

        The counters alone cannot tell operations apart: ranks that call different collectives would pass
        each other's syncs and return wrong data. The tag (sequence number, op, size) goes into this
        rank's control line, in one of two slots by the sequence number's parity: a rank can write its
        tag of operation ``k + 2`` only after passing a sync every rank reached after checking ``k`` —
        provided every begun operation syncs at least once (callers begin no empty operation).
        """
        self.seq = seq = self.seq + 1
        at = self._mine + 1 + 3 * (seq & 1)
        ctrl = self._ctrl
        ctrl[at] = seq
        ctrl[at + 1] = op
        ctrl[at + 2] = nbytes
        self._tag = (seq, op, nbytes)

    def _check_tags(self, tag: tuple[int, int, int]) -> None:
        ctrl, off = self._ctrl, 1 + 3 * (tag[0] & 1)
        for pos in self._others:
            theirs = (ctrl[pos + off], ctrl[pos + off + 1], ctrl[pos + off + 2])
            if theirs != tag:
                self.broken = "the ranks called different collectives"
                raise DistError(
                    f"{describe_op(self.what)}: the ranks of the group called different collectives: this rank "
                    f"(group rank {self.rank}) called {self._describe(tag)}, group rank {pos // (_LINE // 8)} "
                    f"{self._describe(theirs)}. Every rank of the group must make the same collective calls, with "
                    "the same sizes, in the same order (HPCDIST_DEBUG=DETAIL checks every call); the group's "
                    "shared memory is out of step now: create a new group"
                )

    def _describe(self, tag: tuple[int, int, int]) -> str:
        seq, word, nbytes = tag
        op, kind = word & 0xFF, word >> 8
        name = self.op_names[op - 1] if 0 < op <= len(self.op_names) else f"operation {op}"
        size = f" of {nbytes} bytes" if nbytes else ""
        what = f" ({self.kind_name(kind)})" if kind else ""
        return f"{name}{size}{what} as its shared-memory operation #{seq}"

    def interrupted(self, exc: BaseException) -> None:
        """An exception other than hpcdist's own escaped an operation begun on this segment: its counters are
        mid-operation on this rank, so the segment refuses reuse (see :func:`interruptible`)."""
        if not self.broken:
            self.broken = f"an operation was interrupted on this rank by {type(exc).__name__}"

    def sync(self) -> None:
        """Barrier over the node communicator through the counters (see module docstring)."""
        if self.broken:
            error = DistTimeoutError if self.broken == _TIMED_OUT else DistError
            raise error(
                f"{describe_op(self.what)}: this group's shared-memory segment is out of step since an earlier "
                f"error ({self.broken}); create a new group (or set HPCDIST_SHM=0)"
            )
        fence = self._fence
        fence()  # release: the data this rank wrote is visible before its counter
        step = self.step + 1
        self.step = step
        ctrl = self._ctrl
        ctrl[self._mine] = step
        for pos in self._others:
            if ctrl[pos] < step:
                self._wait(pos, step)
        fence()  # acquire: read the peers' data only after seeing their counters
        tag = self._tag
        if tag is not None:
            self._tag = None
            self._check_tags(tag)

    #: :meth:`sync` as a whole operation (the barrier), guarded as the algorithms are (:func:`interruptible`)
    guarded_sync = interruptible(sync)

    def _wait(self, pos: int, step: int) -> None:
        ctrl = self._ctrl
        n = 0
        start = time.monotonic()
        deadline = start + self.timeout_s
        while ctrl[pos] < step:
            n += 1
            if n < _SPIN:
                continue
            now = time.monotonic()
            if now >= deadline:
                if ctrl[pos] >= step:
                    return
                self.broken = _TIMED_OUT
                raise timeout_error(self.what, self.timeout_s)
            if now - start < _YIELD_S:
                _yield()
            else:
                time.sleep(0.001)

    def free(self) -> None:
        """Unmap the segment (local: no message; the memory goes when the last rank unmaps it)."""
        m, self._map = self._map, None
        if m is None:
            return
        self._ctrl.release()
        self._words.release()
        self.mem = self.data = np.empty(0, np.uint8)
        self._typed.clear()
        win, self._fence_win = self._fence_win, None
        if win is not None:
            win.Unlock_all()
            win.Free()
        try:
            m.close()
        except BufferError:  # a caller still holds a view: the mapping goes with the last one
            pass


def _map_shared(
    comm: Any, total: int, timeout_s: float, what: str, hint: str = "set HPCDIST_SHM=0 to use MPI instead, or "
) -> tuple[mmap.mmap, str]:
    """Collective over ``comm``: one ``total``-byte shared file mapped by every rank, unlinked once all have it.

    Returns the mapping and the file's former path (the same on every rank: a name for the mapping).
    """
    me = comm.Get_rank()
    room = f"{hint}make room in {_SHM_DIR}"  # the advice for a file that could not be made or mapped
    path, fd, err = "", -1, ""
    if me == 0:
        try:
            path, fd = _create(total)
        except OSError as e:
            err = f"cannot create a {total}-byte shared-memory file in {_SHM_DIR}: {e}; {room}"
    try:
        path, err, made = timed_bcast_json(
            comm, [path, err, total], 0, timeout_s, f"{what} (shared-memory setup)", _HINT
        )
        m: mmap.mmap | None = None
        if not err and made != total:  # every rank must lay the file out alike, or it reads the others' bytes amiss
            err = (
                f"rank {me} needs a {total}-byte shared-memory file where rank 0 made {made} bytes: the ranks "
                "disagree on its size (HPCDIST_SHM_SLOT, or a symmetric allocation's shape, must be the same on "
                "every rank)"
            )
        elif not err:
            try:
                if fd < 0:
                    fd = os.open(path, os.O_RDWR)
                m = mmap.mmap(fd, total, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            except (OSError, ValueError) as e:  # ValueError: a file shorter than asked
                err = f"rank {me} cannot map the shared-memory file {path}: {e}; {room}"
        errs = timed_allgather_json(comm, err, timeout_s, f"{what} (shared-memory setup)", _HINT)
        bad = [e for e in errs if e]
        if bad:
            if m is not None:
                m.close()
            raise DistError(f"{what}: {bad[0]}")
        assert m is not None
        return m, path
    finally:
        if fd >= 0:
            os.close(fd)
        if me == 0 and path:
            try:
                os.unlink(path)  # every rank has mapped it (or given up): the name is no longer needed
            except OSError:
                pass
