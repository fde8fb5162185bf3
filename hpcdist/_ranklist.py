"""Rank lists for messages: a job of thousands of ranks must not print thousands of numbers per line.

:func:`ranks_text` is the reverse of a Slurm hostlist's expansion
(:func:`hpcdist.launch.hostlist.expand_hostlist`) for bare rank numbers.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["MESSAGE_LIMIT", "ranks_text"]

#: at most about this many characters of a rank list in an error message (``ranks_text(..., MESSAGE_LIMIT)``)
MESSAGE_LIMIT = 200


def ranks_text(ranks: Iterable[int], limit: int | None = None) -> str:
    """Ranks for a message, the other way round from :func:`expand_hostlist`: sorted, each run of three or more
    consecutive ranks as ``lo-hi`` (``[0, 1, 2, 3, 5, 7, 8]`` -> ``"0-3, 5, 7, 8"``), so that a line naming
    most of a thousand ranks stays one line. With ``limit``, a text longer than ``limit`` characters is cut after
    a whole part and ends with how many ranks there are in all: ``"0, 2, 4, ... (2048 ranks)"``."""
    values = sorted(set(ranks))
    parts: list[str] = []
    i = 0
    while i < len(values):
        j = i
        while j + 1 < len(values) and values[j + 1] == values[j] + 1:
            j += 1
        if j - i >= 2:
            parts.append(f"{values[i]}-{values[j]}")
        else:
            parts.extend(str(v) for v in values[i : j + 1])
        i = j + 1
    text = ", ".join(parts)
    if limit is None or len(text) <= limit:
        return text
    shown, size = [], 0
    for part in parts:
        size += len(part) + 2
        if size > limit:
            break
        shown.append(part)
    return ", ".join([*shown, f"... ({len(values)} ranks)"])
