"""The data model every store shares: a key -> bytes map plus named FIFO queues.

:class:`KVState` holds no lock and never blocks; HashStore wraps it in a
condition variable, the TCP server in its event loop, FileStore replays its
log into one. One implementation means one set of semantics (torch's):

- ``add`` treats a missing key as 0 and stores the result as ASCII decimal;
- ``compare_set`` sets ``desired`` when the current value equals ``expected``,
  or when the key is missing and ``expected`` is empty; it returns the value
  the key holds afterwards, or ``expected`` when the key is missing;
- queues live in their own namespace: ``num_keys``, ``list_keys``, ``check``
  and ``get`` see only plain keys.
"""

from __future__ import annotations

from collections import deque
from typing import Generic, TypeVar

__all__ = ["KVState", "parse_int"]

K = TypeVar("K", str, bytes)


def parse_int(value: bytes, key: object) -> int:
    """The integer a counter key holds; ValueError naming the key otherwise."""
    try:
        return int(value)
    except ValueError:
        shown = value[:40] + (b"..." if len(value) > 40 else b"")
        raise ValueError(f"add: key {key!r} holds {shown!r}, which is not an integer counter") from None


class KVState(Generic[K]):
    """Plain keys and FIFO queues, without locking or waiting."""

    __slots__ = ("data", "queues")

    def __init__(self) -> None:
        self.data: dict[K, bytes] = {}
        self.queues: dict[K, deque[bytes]] = {}

    def set(self, key: K, value: bytes) -> None:
        self.data[key] = value

    def add(self, key: K, amount: int) -> int:
        cur = self.data.get(key)
        total = amount if cur is None else parse_int(cur, key) + amount
        self.data[key] = str(total).encode()
        return total

    def compare_set(self, key: K, expected: bytes, desired: bytes) -> bytes:
        cur = self.data.get(key)
        if cur is None:
            if expected == b"":
                self.data[key] = desired
                return desired
            return expected
        if cur == expected:
            self.data[key] = desired
            return desired
        return cur

    def append(self, key: K, value: bytes) -> None:
        cur = self.data.get(key)
        self.data[key] = value if cur is None else cur + value

    def delete(self, key: K) -> bool:
        return self.data.pop(key, None) is not None

    def has_all(self, keys: list[K]) -> bool:
        data = self.data
        return all(k in data for k in keys)

    def missing(self, keys: list[K]) -> list[K]:
        data = self.data
        return [k for k in keys if k not in data]

    def queue_push(self, key: K, value: bytes) -> None:
        q = self.queues.get(key)
        if q is None:
            q = self.queues[key] = deque()
        q.append(value)

    def queue_pop(self, key: K) -> bytes | None:
        """The oldest item of queue ``key``, or None when it is empty."""
        q = self.queues.get(key)
        if not q:
            return None
        value = q.popleft()
        if not q:
            del self.queues[key]
        return value

    def queue_len(self, key: K) -> int:
        q = self.queues.get(key)
        return len(q) if q else 0
