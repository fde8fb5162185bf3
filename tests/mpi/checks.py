"""Assertions shared by the MPI tests."""

from __future__ import annotations

from collections.abc import Callable

import pytest


def raises_naming(name: str, call: Callable[[], object], exc: type[BaseException], words: list[str]) -> None:
    """``call()`` raises ``exc`` whose message holds every one of ``words`` (``name``: the case, in failures)."""
    with pytest.raises(exc) as info:
        call()
    msg = str(info.value)
    for w in words:
        assert w in msg, f"{name}: {w!r} not in {msg!r}"
