"""FileStore: a store in a file shared by processes (torch's ``FileStore``).

The file is an append-only log. It starts with a header (magic, world_size)
and then holds records ``(type, key, value)``: set, delete, append, queue push,
queue pop, and the open/close of each user. Every handle replays the log
incrementally into an in-memory :class:`~hpcdist.store._state.KVState`.
Writers take an exclusive ``fcntl.flock``, catch up, append their records
and release; readers take a shared lock. Blocking calls poll (0.5 ms
growing to 10 ms, as torch's; longer in large worlds: :func:`_poll_cap`).

Life cycle (torch semantics): each ``FileStore(path, world_size)`` is a user
that writes an *open* record; :meth:`FileStore.close` (or garbage collection,
or interpreter exit) writes a *close* record, and the user whose close makes
the count reach ``world_size`` (or, with ``world_size=-1``, the number of
opens) deletes the file.

Stale-file detection: opening a file whose header has another world_size, or
that already saw ``world_size`` users open it, or (``world_size=-1``) whose
users all closed it, raises :class:`~hpcdist.errors.DistStoreError` telling
you to delete the file: it is left over from an earlier run (a crashed job
never writes its close records) or shared by two jobs at once.
"""

from __future__ import annotations

import fcntl
import os
import struct
import threading
import time
import weakref
from collections.abc import Callable
from datetime import timedelta
from typing import TypeVar

from ..errors import DistStoreError, QueueEmptyError
from ._state import KVState, add_counter
from .base import DEFAULT_STORE_TIMEOUT, Store, check_int, timeout_error

__all__ = ["FileStore"]

_MAGIC = b"HPCDFS01"
_HEADER = struct.Struct("!8sq")  # magic, world_size
_REC = struct.Struct("!BIQ")  # record type, key length, value length
R_SET, R_DEL, R_APPEND, R_QPUSH, R_QPOP, R_OPEN, R_CLOSE = range(1, 8)
_POLL_MIN, _POLL_MAX = 0.0005, 0.01

T = TypeVar("T")
Record = tuple[int, str, bytes]


class _FileLog:
    """The open file, the replayed state and the locking; owned by one FileStore handle."""

    def __init__(self, path: str, world_size: int, member: bool) -> None:
        self.path = path
        self.world_size = world_size
        self.poll_cap = _poll_cap(world_size)  # the longest pause between two polls of a blocking call
        self.member = member
        self.fd = -1
        self.offset = 0
        self.state: KVState[str] = KVState()
        self.opened = 0
        self.closed = 0
        self.lock = threading.RLock()
        self.pid = os.getpid()

    # --- opening and closing -------------------------------------------------------
    def open(self) -> None:
        flags = os.O_RDWR | os.O_CREAT | os.O_APPEND | getattr(os, "O_CLOEXEC", 0)
        for _ in range(100):
            try:
                fd = os.open(self.path, flags, 0o600)
            except OSError as exc:
                raise DistStoreError(f"FileStore: cannot open {self.path!r}: {exc}") from exc
            fcntl.flock(fd, fcntl.LOCK_EX)
            keep = False
            try:
                st = os.fstat(fd)
                try:
                    pst = os.stat(self.path)
                except FileNotFoundError:
                    pst = None
                if pst is None or (pst.st_ino, pst.st_dev) != (st.st_ino, st.st_dev):
                    continue  # the last user of an earlier incarnation deleted it meanwhile: reopen
                self.fd = fd
                if st.st_size == 0:
                    self._write_raw(_HEADER.pack(_MAGIC, self.world_size))
                    self.offset = _HEADER.size
                else:
                    self._check_header()
                self._catch_up()
                if self.member:
                    self._check_fresh()
                    self._write([(R_OPEN, "", b"")])
                keep = True
                return
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
                if not keep:
                    self.fd = -1
                    os.close(fd)
        raise DistStoreError(f"FileStore: {self.path!r} keeps being deleted and recreated; cannot open it")

    def _check_header(self) -> None:
        head = os.pread(self.fd, _HEADER.size, 0)
        if len(head) < _HEADER.size or not head.startswith(_MAGIC):
            raise DistStoreError(
                f"FileStore: {self.path!r} is not an hpcdist FileStore file (or was written by an incompatible "
                f"version); delete it (rm {self.path}) or choose another file name"
            )
        _, ws = _HEADER.unpack(head)
        if ws != self.world_size:
            raise DistStoreError(
                f"FileStore: {self.path!r} was created for world_size={ws}, this process opens it with "
                f"world_size={self.world_size}; it is probably left over from an earlier job: delete it "
                f"(rm {self.path}) or choose another file name"
            )
        self.offset = _HEADER.size

    def _check_fresh(self) -> None:
        ws = self.world_size
        if ws > 0 and self.opened >= ws:
            raise DistStoreError(
                f"FileStore: {self.path!r} was already opened by {self.opened} processes of a world_size={ws} "
                f"job ({self.closed} of them closed it); it is left over from an earlier run or used by two jobs "
                f"at once: delete it (rm {self.path}) or choose another file name"
            )
        if ws < 0 and self.opened > 0 and self.closed >= self.opened:
            raise DistStoreError(
                f"FileStore: every earlier user of {self.path!r} has closed it; it is left over from an earlier run: "
                f"delete it (rm {self.path}) or choose another file name"
            )

    def close(self) -> None:
        with self.lock:
            fd = self.fd
            if fd < 0:
                return
            self.fd = -1
            try:
                if self.member and os.getpid() == self.pid:
                    fcntl.flock(fd, fcntl.LOCK_EX)
                    try:
                        self.fd = fd
                        self._catch_up()
                        self._write([(R_CLOSE, "", b"")])
                        self.fd = -1
                        last = self.closed >= (self.world_size if self.world_size > 0 else self.opened)
                        if last:
                            self._unlink_if_ours(fd)
                    finally:
                        fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                self.fd = -1
                os.close(fd)

    def _unlink_if_ours(self, fd: int) -> None:
        try:
            st, pst = os.fstat(fd), os.stat(self.path)
            if (st.st_ino, st.st_dev) == (pst.st_ino, pst.st_dev):
                os.unlink(self.path)
        except FileNotFoundError:
            pass

    # --- the log -----------------------------------------------------------------------
    def _alive(self) -> int:
        if self.fd < 0:
            raise DistStoreError(f"FileStore {self.path!r} is closed")
        return self.fd

    def _catch_up(self) -> None:
        fd = self._alive()
        size = os.fstat(fd).st_size
        if size <= self.offset:
            return
        data = os.pread(fd, size - self.offset, self.offset)
        pos = self._apply(data)
        self.offset += pos

    def _apply(self, data: bytes) -> int:
        """Replay the complete records of ``data``; return the bytes consumed."""
        state = self.state
        pos = 0
        end = len(data)
        hs = _REC.size
        while pos + hs <= end:
            kind, klen, vlen = _REC.unpack_from(data, pos)
            stop = pos + hs + klen + vlen
            if stop > end:
                break  # a record still being written (only possible without the lock)
            key = data[pos + hs : pos + hs + klen].decode("utf-8")
            value = data[pos + hs + klen : stop]
            if kind == R_SET:
                state.data[key] = value
            elif kind == R_DEL:
                state.data.pop(key, None)
            elif kind == R_APPEND:
                state.append(key, value)
            elif kind == R_QPUSH:
                state.queue_push(key, value)
            elif kind == R_QPOP:
                state.queue_pop(key)
            elif kind == R_OPEN:
                self.opened += 1
            elif kind == R_CLOSE:
                self.closed += 1
            else:
                raise DistStoreError(
                    f"FileStore: {self.path!r} is corrupt (record type {kind} at offset {self.offset + pos}); delete it"
                )
            pos = stop
        return pos

    def _write_raw(self, blob: bytes) -> None:
        fd = self._alive()
        with memoryview(blob) as view:
            done = 0
            while done < len(blob):
                done += os.write(fd, view[done:])

    def _write(self, records: list[Record]) -> None:
        """Append ``records`` (exclusive lock held, caught up) and apply them here."""
        parts: list[bytes] = []
        for kind, key, value in records:
            kb = key.encode("utf-8")
            parts.append(_REC.pack(kind, len(kb), len(value)))
            parts.append(kb)
            parts.append(value)
        blob = b"".join(parts)
        self._write_raw(blob)
        self.offset += self._apply(blob)

    # --- operations ----------------------------------------------------------------------
    def read(self, fn: Callable[[KVState[str]], T]) -> T:
        with self.lock:
            fd = self._alive()
            fcntl.flock(fd, fcntl.LOCK_SH)
            try:
                self._catch_up()
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)
            return fn(self.state)

    def mutate(self, fn: Callable[[KVState[str]], tuple[T, list[Record]]]) -> T:
        with self.lock:
            fd = self._alive()
            fcntl.flock(fd, fcntl.LOCK_EX)
            try:
                self._catch_up()
                result, records = fn(self.state)
                if records:
                    self._write(records)
                return result
            finally:
                fcntl.flock(fd, fcntl.LOCK_UN)


def _poll_cap(world_size: int) -> float:
    """The longest pause between two polls of a blocking call: 10 ms (torch's), and 10 ms per 64 users in larger
    worlds, up to 1 s. Each poll takes the file's lock and reads it; 4096 ranks waiting at a ``file://``
    rendezvous polling every 10 ms were 400,000 lock requests a second to a shared file system."""
    return min(1.0, _POLL_MAX * max(1.0, world_size / 64))


def _poll(
    attempt: Callable[[], tuple[bool, T]],
    op: str,
    keys: list[str],
    timeout: float,
    missing: Callable[[], list[str]] | None = None,
    cap: float = _POLL_MAX,
) -> T:
    """Call ``attempt`` until it reports done, sleeping between tries (0.5 ms, doubling up to ``cap``).

    After ``timeout`` s raise DistTimeoutError naming ``missing()`` (or ``keys``).
    """
    deadline = time.monotonic() + timeout
    delay = _POLL_MIN
    while True:
        done, value = attempt()
        if done:
            return value
        left = deadline - time.monotonic()
        if left <= 0:
            raise timeout_error(op, (missing() if missing else None) or keys, timeout)
        time.sleep(min(delay, left))
        delay = min(delay * 2, cap)


class FileStore(Store):
    """A store kept in the file ``file_name``, usable by many processes at once.

    Args:
        file_name: the file (created with mode 0600 when missing). It must be on a
            file system where ``flock`` works across all users (local disk, or a
            shared file system with working locks for multi-node use).
        world_size: the number of processes that will open the file; ``-1`` when
            unknown (weaker stale-file detection). Every user must pass the same.
        timeout: the default timeout of blocking calls (torch's 300 s).

    The last of the ``world_size`` users to :meth:`close` deletes the file.
    :meth:`clone` opens another handle that is not a user (no open/close record).
    """

    def __init__(
        self, file_name: str | os.PathLike[str], world_size: int = -1, timeout: timedelta = DEFAULT_STORE_TIMEOUT
    ) -> None:
        super().__init__(timeout)
        self._log = self._open(file_name, world_size, member=True)
        self._finalizer = weakref.finalize(self, self._log.close)

    @staticmethod
    def _open(file_name: object, world_size: object, member: bool) -> _FileLog:
        if not isinstance(file_name, (str, os.PathLike)):
            raise TypeError(f"file_name must be a str or os.PathLike, got {type(file_name).__name__}")
        path = os.fspath(file_name)
        if not isinstance(path, str) or not path:
            raise ValueError(f"file_name must be a non-empty path, got {file_name!r}")
        ws = check_int(world_size, "world_size")
        if ws == 0 or ws < -1:
            raise ValueError(f"world_size must be -1 (unknown) or >= 1, got {ws}")
        log = _FileLog(os.path.abspath(path), ws, member)
        log.open()
        return log

    @property
    def path(self) -> str:
        """The absolute path of the file."""
        return self._log.path

    @property
    def world_size(self) -> int:
        """The world_size the file was opened with (-1: unknown)."""
        return self._log.world_size

    def close(self) -> None:
        """Leave the store: write the close record; the last user deletes the file."""
        self._finalizer()

    def __enter__(self) -> FileStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def clone(self) -> FileStore:
        other = FileStore.__new__(FileStore)
        Store.__init__(other, self.timeout)
        other._log = self._open(self._log.path, self._log.world_size, member=False)
        other._finalizer = weakref.finalize(other, other._log.close)
        return other

    # --- primitives -------------------------------------------------------------------
    def _set(self, key: str, value: bytes) -> None:
        self._log.mutate(lambda s: (None, [(R_SET, key, value)]))

    def _add(self, key: str, amount: int) -> int:
        def op(s: KVState[str]) -> tuple[int, list[Record]]:
            total = add_counter(s.data.get(key), key, amount)
            return total, [(R_SET, key, str(total).encode())]

        return self._log.mutate(op)

    def _compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        def op(s: KVState[str]) -> tuple[bytes, list[Record]]:
            cur = s.data.get(key)
            if (cur is None and expected == b"") or (cur is not None and cur == expected):
                return desired, [(R_SET, key, desired)]
            return (expected if cur is None else cur), []

        return self._log.mutate(op)

    def _wait(self, keys: list[str], timeout: float) -> None:
        def attempt() -> tuple[bool, None]:
            return self._log.read(lambda s: s.has_all(keys)), None

        _poll(attempt, "wait", keys, timeout, self._missing(keys), self._log.poll_cap)

    def _check(self, keys: list[str]) -> bool:
        return self._log.read(lambda s: s.has_all(keys))

    def _delete_key(self, key: str) -> bool:
        return self._log.mutate(lambda s: (True, [(R_DEL, key, b"")]) if key in s.data else (False, []))

    def _num_keys(self) -> int:
        return self._log.read(lambda s: len(s.data))

    def _list_keys(self) -> list[str]:
        return self._log.read(lambda s: list(s.data))

    def _multi_get(self, keys: list[str], timeout: float) -> list[bytes]:
        def attempt() -> tuple[bool, list[bytes]]:
            def look(s: KVState[str]) -> tuple[bool, list[bytes]]:
                if not s.has_all(keys):
                    return False, []
                return True, [s.data[k] for k in keys]

            return self._log.read(look)

        op = "multi_get" if len(keys) > 1 else "get"
        return _poll(attempt, op, keys, timeout, self._missing(keys), self._log.poll_cap)

    def _missing(self, keys: list[str]) -> Callable[[], list[str]]:
        return lambda: self._log.read(lambda s: s.missing(keys))

    def _multi_set(self, keys: list[str], values: list[bytes]) -> None:
        self._log.mutate(lambda s: (None, [(R_SET, k, v) for k, v in zip(keys, values)]))

    def _append(self, key: str, value: bytes) -> None:
        self._log.mutate(lambda s: (None, [(R_APPEND, key, value)]))

    def _queue_push(self, key: str, value: bytes) -> None:
        self._log.mutate(lambda s: (None, [(R_QPUSH, key, value)]))

    def _queue_pop(self, key: str, block: bool, timeout: float) -> bytes:
        def op(s: KVState[str]) -> tuple[tuple[bool, bytes], list[Record]]:
            q = s.queues.get(key)
            if not q:
                return (False, b""), []
            return (True, q[0]), [(R_QPOP, key, b"")]

        def attempt() -> tuple[bool, bytes]:
            return self._log.mutate(op)

        if not block:
            found, value = attempt()
            if not found:
                raise QueueEmptyError(f"queue_pop: queue {key!r} is empty (block=False)")
            return value
        return _poll(attempt, "queue_pop", [key], timeout, cap=self._log.poll_cap)

    def _queue_len(self, key: str) -> int:
        return self._log.read(lambda s: s.queue_len(key))
