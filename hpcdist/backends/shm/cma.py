"""Reading a peer's memory directly: Linux cross-memory attach (``process_vm_readv``).

``process_vm_readv(2)`` copies bytes from another process's address space
into this one's in a single pass in the kernel — one copy where a
shared-memory segment needs two (into the segment, out of it). MPICH and
Open MPI use it for large node-local messages ("CMA"). It needs the same
user and ptrace permission over the peer (Yama ``ptrace_scope`` 0, or 1 for
a descendant; containers may forbid it), so a segment's ranks first
:func:`probe` it together and use it only when every rank read every peer's
secret token correctly; otherwise they keep the segment's two-copy
algorithms. It is off unless ``HPCDIST_SHM_DIRECT=1`` (on every rank: one
rank without it makes the probe answer no everywhere): in a VM, where the
kernel pins and maps the peer's pages one batch at a time, it copied at
5-10 GB/s where ``memcpy`` ran at 21-34 GB/s, and the segment's two copies won
(docs/benchmarks/shm.md). On bare metal measure both with ``hpcdist bench``.

Nothing here runs at import; the C function is looked up by the first probe.
"""

from __future__ import annotations

import ctypes
import functools
import os
import secrets
import sys
from typing import Any

import numpy as np

from .segment import Segment

__all__ = ["Reader", "probe"]


class _IOVec(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]


@functools.cache
def _call() -> Any:
    """libc's ``process_vm_readv``, looked up once (None where there is none: not Linux, an old libc)."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        fn = ctypes.CDLL(None, use_errno=True).process_vm_readv
    except (OSError, AttributeError):  # pragma: no cover - a libc without it
        return None
    iov = ctypes.POINTER(_IOVec)
    fn.argtypes = [ctypes.c_int, iov, ctypes.c_ulong, iov, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_ssize_t
    return fn


class Reader:
    """Copies byte ranges out of the memory of a segment's ranks (their process ids in ``pids``).

    Local: one reader per segment, reused by every call (its two iovecs and
    its scratch buffers are allocated once).
    """

    def __init__(self, fn: Any, pids: list[int]) -> None:
        self._fn = fn
        self.pids = pids
        self._local, self._remote = _IOVec(), _IOVec()
        self._lp, self._rp = ctypes.byref(self._local), ctypes.byref(self._remote)
        self._scratch: dict[tuple[np.dtype, int], list[np.ndarray]] = {}

    def read(self, rank: int, remote: int, local: int, nbytes: int) -> None:
        """Copy ``nbytes`` at address ``remote`` of rank ``rank``'s process to address ``local`` of this one.

        Raises OSError (naming the process and the reason) when the peer is gone or the range is not mapped.
        """
        pid, fn, lv, rv = self.pids[rank], self._fn, self._local, self._remote
        while nbytes > 0:
            lv.base, lv.len, rv.base, rv.len = local, nbytes, remote, nbytes
            got = fn(pid, self._lp, 1, self._rp, 1, 0)
            if got <= 0:
                err = ctypes.get_errno()
                raise OSError(err, f"reading {nbytes} bytes of process {pid} (process_vm_readv): {os.strerror(err)}")
            local, remote, nbytes = local + got, remote + got, nbytes - got

    def scratch(self, dtype: np.dtype, count: int, items: int) -> list[np.ndarray]:
        """``count`` scratch arrays of ``items`` items of ``dtype`` (kept for the next call)."""
        key = (dtype, items)
        bufs = self._scratch.get(key)
        if bufs is None or len(bufs) < count:
            if len(self._scratch) > 8:  # a few shapes at a time: the chunk size is fixed, dtypes vary
                self._scratch.clear()
            bufs = self._scratch[key] = [np.empty(items, dtype) for _ in range(count)]
        return bufs


def probe(seg: Segment, allowed: bool = True) -> Reader | None:
    """Collective over ``seg``'s ranks: a :class:`Reader` when every rank can read every peer, else None on all.

    ``allowed``: this rank's ``HPCDIST_SHM_DIRECT`` (one rank's False makes the answer None on every rank).

    Each rank posts its process id and the address of a random token in its
    slot, reads every peer's token (a process id of another PID namespace
    names some other process: only the token proves it is the peer), and
    posts whether all matched; two syncs. The answer is the same on every rank.
    """
    me = seg.rank
    fn = _call() if allowed else None
    token = np.array([secrets.randbits(62) + 1], np.int64)
    posted = seg.exchange([os.getpid(), token.ctypes.data, int(token[0])])
    ok = fn is not None
    reader = Reader(fn, [p[0] for p in posted]) if ok else None
    if reader is not None:
        got = np.zeros(1, np.int64)
        for r, (_, addr, want) in enumerate(posted):
            if r == me:
                continue
            try:
                reader.read(r, addr, got.ctypes.data, 8)
            except OSError:
                ok = False
                break
            if int(got[0]) != want:
                ok = False
                break
    # every peer has read this rank's token (it lives until here) and posted its verdict
    agreed = all(v[0] for v in seg.exchange([int(ok)]))
    return reader if agreed else None
