"""PrefixStore: a namespace inside another store (torch's ``PrefixStore``)."""

from __future__ import annotations

from datetime import timedelta

from .base import Store, check_key

__all__ = ["PrefixStore"]


class PrefixStore(Store):
    """Every key ``k`` becomes ``prefix + "/" + k`` in ``store``.

    The timeout is the underlying store's (``set_timeout`` changes it there).
    :meth:`num_keys` and :meth:`list_keys` count and list only this prefix's
    keys, with the prefix removed (as torch's ``list_keys``; torch's
    ``num_keys`` counts the whole underlying store). Timeout errors name the
    full (prefixed) keys.

    Args:
        prefix: put before every key, with a ``/`` between.
        store: the store that holds the keys (an :class:`~hpcdist.store.Store`).
    """

    def __init__(self, prefix: str, store: Store) -> None:
        check_key(prefix, "prefix")
        if not isinstance(store, Store):
            raise TypeError(f"store must be an hpcdist.store.Store, got {type(store).__name__}")
        self._prefix = prefix + "/"
        self._store = store

    @property
    def prefix(self) -> str:
        """The prefix, without the trailing ``/``."""
        return self._prefix[:-1]

    @property
    def underlying_store(self) -> Store:
        """The store the prefixed keys live in."""
        return self._store

    @property
    def timeout(self) -> timedelta:
        return self._store.timeout

    def set_timeout(self, timeout: timedelta) -> None:
        self._store.set_timeout(timeout)

    def clone(self) -> PrefixStore:
        return PrefixStore(self.prefix, self._store.clone())

    def _k(self, key: str) -> str:
        return self._prefix + key

    def _ks(self, keys: list[str]) -> list[str]:
        p = self._prefix
        return [p + k for k in keys]

    def _set(self, key: str, value: bytes) -> None:
        self._store._set(self._k(key), value)

    def _get(self, key: str, timeout: float) -> bytes:
        return self._store._get(self._k(key), timeout)

    def _add(self, key: str, amount: int) -> int:
        return self._store._add(self._k(key), amount)

    def _compare_set(self, key: str, expected: bytes, desired: bytes) -> bytes:
        return self._store._compare_set(self._k(key), expected, desired)

    def _wait(self, keys: list[str], timeout: float) -> None:
        self._store._wait(self._ks(keys), timeout)

    def _check(self, keys: list[str]) -> bool:
        return self._store._check(self._ks(keys))

    def _delete_key(self, key: str) -> bool:
        return self._store._delete_key(self._k(key))

    def _list_keys(self) -> list[str]:
        p = self._prefix
        n = len(p)
        return [k[n:] for k in self._store._list_keys() if k.startswith(p)]

    def _multi_get(self, keys: list[str], timeout: float) -> list[bytes]:
        return self._store._multi_get(self._ks(keys), timeout)

    def _multi_set(self, keys: list[str], values: list[bytes]) -> None:
        self._store._multi_set(self._ks(keys), values)

    def _append(self, key: str, value: bytes) -> None:
        self._store._append(self._k(key), value)

    def _queue_push(self, key: str, value: bytes) -> None:
        self._store._queue_push(self._k(key), value)

    def _queue_pop(self, key: str, block: bool, timeout: float) -> bytes:
        return self._store._queue_pop(self._k(key), block, timeout)

    def _queue_len(self, key: str) -> int:
        return self._store._queue_len(self._k(key))
