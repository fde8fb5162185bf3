"""The data model every store shares: a key -> bytes map plus named FIFO queues.

:class:`KVState` holds no lock and never blocks; HashStore wraps it in a
condition variable, the TCP server in its event loop, FileStore replays its
log into one. One implementation means one set of semantics (torch's):

- ``add`` treats a missing key (or an empty value) as 0 and stores the result
  as ASCII decimal; counters are int64, as torch's: a value that is not wholly a
  decimal integer in that range, or a sum outside it, raises ValueError;
- ``compare_set`` sets ``desired`` when the current value equals ``expected``,
  or when the key is missing and ``expected`` is empty; it returns the value
  the key holds afterwards, or ``expected`` when the key is missing;
- queues live in their own namespace: ``num_keys``, ``list_keys``, ``check``
  and ``get`` see only plain keys.
"""

from __future__ import annotations

import re
from collections import deque
from typing import Generic, TypeVar

__all__ = ["INT64_MAX", "INT64_MIN", "KVState", "add_counter", "parse_int"]

K = TypeVar("K", str, bytes)

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
#: a counter's text: optional blanks and sign, ASCII digits (no "1_0", "0x10", "7abc")
_DECIMAL = re.compile(rb"[ \t\n\r\f\v]*[+-]?[0-9]+[ \t\n\r\f\v]*")


def _name(key: object) -> str:
    return repr(key.decode("utf-8", "replace") if isinstance(key, bytes) else key)


def parse_int(value: bytes, key: object) -> int:
    """The int64 a counter key holds (an empty value is 0, as in torch); ValueError naming the key otherwise."""
    if not value:
        return 0
    n = int(value) if _DECIMAL.fullmatch(value) else None
    if n is None or not INT64_MIN <= n <= INT64_MAX:
        shown = value[:40] + (b"..." if len(value) > 40 else b"")
        raise ValueError(
            f"add: key {_name(key)} holds {shown!r}, which is not an integer counter (a decimal int64); "
            "set it to a number or use another key"
        )
    return n


def add_counter(current: bytes | None, key: object, amount: int) -> int:
    """``current`` (None: missing, counts as 0) plus ``amount``; ValueError if the sum leaves int64."""
    total = (0 if current is None else parse_int(current, key)) + amount
    if not INT64_MIN <= total <= INT64_MAX:
        raise ValueError(
            f"add: key {_name(key)} would reach {total}, outside the int64 range of a counter; it keeps its value"
        )
    return total


class KVState(Generic[K]):
    """Plain keys and FIFO queues, without locking or waiting."""

    __slots__ = ("data", "queues")

    def __init__(self) -> None:
        self.data: dict[K, bytes] = {}
        self.queues: dict[K, deque[bytes]] = {}

    def set(self, key: K, value: bytes) -> None:
        self.data[key] = value

    def add(self, key: K, amount: int) -> int:
        total = add_counter(self.data.get(key), key, amount)
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
