"""Pinned host buffers for staging device arrays through a non-CUDA-aware MPI.

:class:`PinnedPool` hands out byte blocks by size class (the next power of
two, at least 4 KiB) and takes them back for reuse, so repeated calls of the
same sizes allocate nothing. It keeps at most ``max_free_per_class`` free
blocks per class and ``max_cached_bytes`` in all; beyond that, returned
blocks are dropped. The allocator is a parameter (CuPy's pinned allocator by
default), which keeps the bookkeeping testable on the CPU.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable

import numpy as np

__all__ = ["PinnedPool", "host_view", "pinned_pool", "size_class"]

_MIN_CLASS = 4096


def size_class(nbytes: int) -> int:
    """The block size serving a request of ``nbytes`` (a power of two, >= 4 KiB; 0 for 0)."""
    if nbytes < 0:
        raise ValueError(f"nbytes must be >= 0, got {nbytes}")
    if nbytes == 0:
        return 0
    return max(_MIN_CLASS, 1 << (nbytes - 1).bit_length())


def _cupy_pinned(nbytes: int) -> np.ndarray:
    import cupy

    mem = cupy.cuda.alloc_pinned_memory(nbytes)
    return np.frombuffer(mem, np.uint8, nbytes)  # the array keeps the pinned memory alive


class PinnedPool:
    """A free list of page-locked host blocks by size class (thread-safe)."""

    def __init__(
        self,
        alloc: Callable[[int], np.ndarray] = _cupy_pinned,
        max_free_per_class: int = 4,
        max_cached_bytes: int = 1 << 30,
    ) -> None:
        self._alloc = alloc
        self._free: dict[int, list[np.ndarray]] = {}
        self._cached = 0
        self._lock = threading.Lock()
        self.max_free_per_class = max_free_per_class
        self.max_cached_bytes = max_cached_bytes
        self.allocations = 0  # blocks ever allocated (the tests read it: reuse means it stays put)

    def acquire(self, nbytes: int) -> np.ndarray:
        """A uint8 block of at least ``nbytes`` (its length is the size class)."""
        cls = size_class(nbytes)
        if cls == 0:
            return np.empty(0, np.uint8)
        with self._lock:
            free = self._free.get(cls)
            if free:
                self._cached -= cls
                return free.pop()
            self.allocations += 1
        return self._alloc(cls)

    def release(self, block: np.ndarray) -> None:
        """Give ``block`` back (after every copy that touches it completed)."""
        cls = block.nbytes
        if cls == 0:
            return
        with self._lock:
            free = self._free.setdefault(cls, [])
            if len(free) < self.max_free_per_class and self._cached + cls <= self.max_cached_bytes:
                free.append(block)
                self._cached += cls

    @property
    def cached_bytes(self) -> int:
        return self._cached

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self._cached = 0


_POOL: list[PinnedPool] = []


def pinned_pool() -> PinnedPool:
    """The process's pool of CuPy pinned blocks (created on first use)."""
    if not _POOL:
        _POOL.append(PinnedPool())
    return _POOL[0]


def host_view(block: np.ndarray, dtype: np.dtype, shape: tuple[int, ...], nbytes: int | None = None) -> np.ndarray:
    """The first bytes of ``block`` as a C-contiguous array of ``dtype`` and ``shape`` (``nbytes`` of them)."""
    n = math.prod(shape) * dtype.itemsize if nbytes is None else nbytes
    if n == 0:
        return np.empty(shape, dtype)
    return block[:n].view(dtype).reshape(shape)
