"""The :class:`Store` base class: torch's key-value store API, validated once.

Public methods check and normalise their arguments (keys are ``str``; values
are ``bytes``-like or ``str``, which is encoded as UTF-8; timeouts are
:class:`~datetime.timedelta`) and call one private primitive per operation
that a concrete store implements. Blocking primitives get the timeout in
seconds and raise :class:`~hpcdist.errors.DistTimeoutError` (via
:func:`timeout_error`) naming the keys they waited for.
"""

from __future__ import annotations

import operator
from collections.abc import Sequence
from datetime import timedelta

from ..config import check_timeout
from ..errors import DistStoreError, DistStoreTimeoutError, DistTimeoutError
from ._state import INT64_MAX, INT64_MIN

__all__ = ["DEFAULT_STORE_TIMEOUT", "Store", "timeout_error"]

#: torch's default store timeout.
DEFAULT_STORE_TIMEOUT = timedelta(seconds=300)

Value = bytes | bytearray | memoryview | str


def check_key(key: object, arg: str = "key") -> str:
    """``key`` if it is a str, else a TypeError naming the argument."""
    if type(key) is str or isinstance(key, str):
        return key
    raise TypeError(f"{arg} must be a str, got {type(key).__name__} ({key!r:.60})")


def check_int(value: object, arg: str) -> int:
    """``value`` as an int (any integer type, not a bool), else a TypeError naming the argument."""
    if not isinstance(value, bool):
        try:
            return operator.index(value)  # type: ignore[arg-type]
        except TypeError:
            pass
    raise TypeError(f"{arg} must be an int, got {type(value).__name__} ({value!r:.60})")


def check_bool(value: object, arg: str, convert: bool = False) -> bool:
    """``value`` as a bool, else a TypeError naming the argument; torch's (pybind11's) rule.

    A bool or numpy bool always; with ``convert``, also None (False) and any object with
    ``__bool__`` (numbers), but never a str or a container.
    """
    if isinstance(value, bool) or (type(value).__name__ == "bool_" and type(value).__module__ == "numpy"):
        return bool(value)
    if convert and (value is None or hasattr(type(value), "__bool__")):
        return bool(value)
    raise TypeError(f"{arg} must be a bool, got {type(value).__name__} ({value!r:.60})")


def check_keys(keys: object, arg: str = "keys") -> list[str]:
    """A list of str keys; rejects a bare str (a common slip: ``wait("k")``)."""
    if isinstance(keys, (str, bytes)):
        raise TypeError(
            f"{arg} must be a sequence of str keys, got a single {type(keys).__name__} {keys!r:.60}; wrap it in a list"
        )
    try:
        out = list(keys)  # type: ignore[call-overload]
    except TypeError:
        raise TypeError(f"{arg} must be a sequence of str keys, got {type(keys).__name__}") from None
    for i, k in enumerate(out):
        check_key(k, f"{arg}[{i}]")
    return out


def to_bytes(value: object, arg: str = "value") -> bytes:
    """``value`` as bytes: bytes-like objects as they are, str encoded as UTF-8."""
    if type(value) is bytes:
        return value
    if isinstance(value, str):
        return value.encode("utf-8")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return bytes(value)
    raise TypeError(f"{arg} must be bytes, bytearray, memoryview or str, got {type(value).__name__}")


def timeout_error(op: str, keys: Sequence[object], seconds: float) -> DistStoreTimeoutError:
    """The error a blocking operation raises when ``keys`` did not appear in time."""
    shown = ", ".join(repr(k) for k in list(keys)[:8])
    more = f" and {len(keys) - 8} more" if len(keys) > 8 else ""
    return DistStoreTimeoutError(
        f"{op} timed out after {seconds:g} s waiting for key(s) {shown}{more}; they were never set "
        "(raise the timeout with set_timeout() or check that the writer runs)"
    )


class Store:
    """Base class of the key-value stores (torch's ``torch.distributed.Store``).

    Every method may be called from any thread. Blocking calls (``get``,
    ``wait``, ``multi_get``, blocking ``queue_pop``, ``barrier``) give up after
    the store's :attr:`timeout` (or the ``timeout`` given) with
    :class:`~hpcdist.errors.DistTimeoutError`.
    """

    def __init__(self, timeout: timedelta = DEFAULT_STORE_TIMEOUT) -> None:
        self._timeout = check_timeout(timeout)

    # --- timeout --------------------------------------------------------------
    @property
    def timeout(self) -> timedelta:
        """The default timeout of blocking operations."""
        return self._timeout

    def set_timeout(self, timeout: timedelta) -> None:
        """Set the default timeout of blocking operations."""
        self._timeout = check_timeout(timeout)

    def _seconds(self, timeout: timedelta | None) -> float:
        if timeout is None:
            return self.timeout.total_seconds()
        return check_timeout(timeout).total_seconds()

    # --- public API -----------------------------------------------------------
    def set(self, key: str, value: Value) -> None:
        """Store ``value`` under ``key``, replacing any previous value."""
        self._set(check_key(key), to_bytes(value))

    def get(self, key: str) -> bytes:
        """The value of ``key``; blocks until it exists, up to the store timeout."""
        return self._get(check_key(key), self.timeout.total_seconds())

    def add(self, key: str, amount: int) -> int:
        """Add ``amount`` to the integer counter ``key`` (0 when missing or empty); return the new value.

        Counters are int64, as in torch: an ``amount`` outside that range is a TypeError (torch's),
        a value that is not a decimal int64, or a sum outside the range, a ValueError.
        """
        n = check_int(amount, "amount")
        if not INT64_MIN <= n <= INT64_MAX:
            raise TypeError(f"amount must be an int in the int64 range -2**63..2**63-1, got {n}")
        return self._add(check_key(key), n)

    def compare_set(self, key: str, expected_value: Value, desired_value: Value) -> bytes:
        """Set ``key`` to ``desired_value`` if it holds ``expected_value``; return what it holds then.

        Args:
            key: the key.
            expected_value: the value ``key`` must hold for the swap (empty: ``key`` must be missing).
            desired_value: the value to store.

        Returns:
            The value ``key`` holds afterwards; ``expected_value`` when the key is missing and
            nothing was set.
        """
        return self._compare_set(
            check_key(key), to_bytes(expected_value, "expected_value"), to_bytes(desired_value, "desired_value")
        )

    def wait(self, keys: Sequence[str], timeout: timedelta | None = None) -> None:
        """Block until every key in ``keys`` exists, or raise DistTimeoutError.

        Args:
            keys: the keys to wait for (a list, not a single str).
            timeout: how long to wait (default: the store's timeout).
        """
        self._wait(check_keys(keys), self._seconds(timeout))

    def check(self, keys: Sequence[str]) -> bool:
        """True when every key in ``keys`` exists (never blocks)."""
        return self._check(check_keys(keys))

    def delete_key(self, key: str) -> bool:
        """Delete ``key``; True when it existed."""
        return self._delete_key(check_key(key))

    def num_keys(self) -> int:
        """The number of plain keys (queues are not counted)."""
        return self._num_keys()

    def list_keys(self) -> list[str]:
        """The plain keys of the store (queues are not listed)."""
        return self._list_keys()

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        """The values of ``keys``, in order; blocks until all exist."""
        return self._multi_get(check_keys(keys), self.timeout.total_seconds())

    def multi_set(self, keys: Sequence[str], values: Sequence[Value]) -> None:
        """Set each ``keys[i]`` to ``values[i]``."""
        ks = check_keys(keys)
        if isinstance(values, (str, bytes)):
            raise TypeError(f"values must be a sequence of values, got a single {type(values).__name__}")
        vs = [to_bytes(v, f"values[{i}]") for i, v in enumerate(values)]
        if len(ks) != len(vs):
            raise ValueError(f"keys and values must have the same length, got {len(ks)} keys and {len(vs)} values")
        self._multi_set(ks, vs)

    def append(self, key: str, value: Value) -> None:
        """Append ``value`` to the value of ``key`` (set it when missing)."""
        self._append(check_key(key), to_bytes(value))

    def queue_push(self, key: str, value: Value) -> None:
        """Push ``value`` onto the FIFO queue ``key``."""
        self._queue_push(check_key(key), to_bytes(value))

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        """Pop the oldest item of queue ``key``.

        With ``block=True`` wait for an item up to the store timeout
        (DistTimeoutError); with ``block=False`` raise
        :class:`~hpcdist.errors.QueueEmptyError` on an empty queue.
        """
        if not isinstance(block, bool):
            raise TypeError(f"block must be a bool, got {type(block).__name__}")
        return self._queue_pop(check_key(key), block, self.timeout.total_seconds())

    def queue_len(self, key: str) -> int:
        """The number of items in queue ``key`` (0 when it does not exist)."""
        return self._queue_len(check_key(key))

    def barrier(self, key: str, world_size: int, timeout: timedelta | None = None) -> None:
        """Block until ``world_size`` callers have called ``barrier`` with this ``key``.

        Every one of the ``world_size`` participants must call it once with the
        same ``key``; use a fresh key per barrier. If fewer arrive, all callers
        raise DistTimeoutError after ``timeout`` (default: the store timeout).
        Leaves the keys ``key`` (the arrival count) and ``key + "/done"``.
        """
        check_key(key)
        n = check_int(world_size, "world_size")
        if n < 1:
            raise ValueError(f"world_size must be >= 1, got {n}")
        seconds = self._seconds(timeout)
        arrived = self.add(key, 1)
        done = key + "/done"
        if arrived == n:
            self.set(done, b"1")
        elif arrived > n:
            raise DistStoreError(
                f"barrier {key!r}: {arrived} callers arrived for world_size={n}; the key was reused, give each barrier a fresh key"
            )
        try:
            self._wait([done], seconds)
        except DistTimeoutError:
            count = self._get_now(key)
            raise DistStoreTimeoutError(
                f"barrier {key!r} timed out after {seconds:g} s: {count} of {n} participants arrived"
            ) from None

    def _get_now(self, key: str) -> str:
        try:
            return self._multi_get([key], 0.001)[0].decode(errors="replace")
        except Exception:
            return "?"

    def clone(self) -> Store:
        """A new handle on the same store, safe to use from another thread."""
        raise NotImplementedError

    def has_extended_api(self) -> bool:
        """True: every store here implements the extended API (append, multi_*, queues)."""
        return True

    # --- primitives for subclasses -------------------------------------------------
    def _set(self, key: str, value: bytes) -> None:
        raise NotImplementedError

    def _get(self, key: str, timeout: float) -> bytes:
        return self._multi_get([key], timeout)[0]

    def _add(self, key: str, amount: int) -> int:
        raise NotImplementedError

    def _compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        raise NotImplementedError

    def _wait(self, keys: list[str], timeout: float) -> None:
        raise NotImplementedError

    def _check(self, keys: list[str]) -> bool:
        raise NotImplementedError

    def _delete_key(self, key: str) -> bool:
        raise NotImplementedError

    def _num_keys(self) -> int:
        return len(self._list_keys())

    def _list_keys(self) -> list[str]:
        raise NotImplementedError

    def _multi_get(self, keys: list[str], timeout: float) -> list[bytes]:
        raise NotImplementedError

    def _multi_set(self, keys: list[str], values: list[bytes]) -> None:
        for k, v in zip(keys, values):
            self._set(k, v)

    def _append(self, key: str, value: bytes) -> None:
        raise NotImplementedError

    def _queue_push(self, key: str, value: bytes) -> None:
        raise NotImplementedError

    def _queue_pop(self, key: str, block: bool, timeout: float) -> bytes:
        raise NotImplementedError

    def _queue_len(self, key: str) -> int:
        raise NotImplementedError
