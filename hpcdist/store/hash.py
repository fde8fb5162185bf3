"""HashStore: an in-process, thread-safe store (torch's ``HashStore``)."""

from __future__ import annotations

import threading
import time
from datetime import timedelta

from ..errors import QueueEmptyError
from ._state import KVState
from .base import DEFAULT_STORE_TIMEOUT, Store, timeout_error

__all__ = ["HashStore"]


class HashStore(Store):
    """A store living in this process's memory, shared by its threads.

    Blocking calls wait on one condition variable that every write notifies.
    :meth:`clone` returns a handle on the same data.

    Args:
        timeout: the default timeout of blocking calls (torch's 300 s).
    """

    def __init__(self, timeout: timedelta = DEFAULT_STORE_TIMEOUT) -> None:
        super().__init__(timeout)
        self._state: KVState[str] = KVState()
        self._cond = threading.Condition(threading.Lock())

    def clone(self) -> HashStore:
        other = HashStore.__new__(HashStore)
        Store.__init__(other, self.timeout)
        other._state = self._state
        other._cond = self._cond
        return other

    def _await(self, ready, op: str, keys: list[str], timeout: float) -> None:  # type: ignore[no-untyped-def]
        """Wait (lock held) until ``ready()`` is true; DistTimeoutError after ``timeout`` s."""
        if ready():
            return
        deadline = time.monotonic() + timeout
        cond = self._cond
        while not ready():
            left = deadline - time.monotonic()
            if left <= 0:
                raise timeout_error(op, [k for k in keys if k not in self._state.data] or keys, timeout)
            cond.wait(min(left, 3600.0))  # bounded: huge timeouts overflow the lock's C timeout

    def _set(self, key: str, value: bytes) -> None:
        with self._cond:
            self._state.data[key] = value
            self._cond.notify_all()

    def _get(self, key: str, timeout: float) -> bytes:
        data = self._state.data
        with self._cond:
            self._await(lambda: key in data, "get", [key], timeout)
            return data[key]

    def _add(self, key: str, amount: int) -> int:
        with self._cond:
            n = self._state.add(key, amount)
            self._cond.notify_all()
            return n

    def _compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        with self._cond:
            out = self._state.compare_set(key, expected, desired)
            self._cond.notify_all()
            return out

    def _wait(self, keys: list[str], timeout: float) -> None:
        state = self._state
        with self._cond:
            self._await(lambda: state.has_all(keys), "wait", keys, timeout)

    def _check(self, keys: list[str]) -> bool:
        with self._cond:
            return self._state.has_all(keys)

    def _delete_key(self, key: str) -> bool:
        with self._cond:
            return self._state.delete(key)

    def _num_keys(self) -> int:
        with self._cond:
            return len(self._state.data)

    def _list_keys(self) -> list[str]:
        with self._cond:
            return list(self._state.data)

    def _multi_get(self, keys: list[str], timeout: float) -> list[bytes]:
        state = self._state
        with self._cond:
            self._await(lambda: state.has_all(keys), "multi_get", keys, timeout)
            return [state.data[k] for k in keys]

    def _multi_set(self, keys: list[str], values: list[bytes]) -> None:
        with self._cond:
            self._state.data.update(zip(keys, values))
            self._cond.notify_all()

    def _append(self, key: str, value: bytes) -> None:
        with self._cond:
            self._state.append(key, value)
            self._cond.notify_all()

    def _queue_push(self, key: str, value: bytes) -> None:
        with self._cond:
            self._state.queue_push(key, value)
            self._cond.notify_all()

    def _queue_pop(self, key: str, block: bool, timeout: float) -> bytes:
        state = self._state
        with self._cond:
            if not block:
                value = state.queue_pop(key)
                if value is None:
                    raise QueueEmptyError(f"queue_pop: queue {key!r} is empty (block=False)")
                return value
            self._await(lambda: state.queue_len(key) > 0, "queue_pop", [key], timeout)
            value = state.queue_pop(key)
            assert value is not None
            return value

    def _queue_len(self, key: str) -> int:
        with self._cond:
            return self._state.queue_len(key)
