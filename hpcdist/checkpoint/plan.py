"""Group rank 0 checks what every rank holds and decides who writes which dataset.

Each rank sends a summary of its leaves (name, kind, dtype, global shape, its
box); rank 0 checks that every rank has the same keys, kinds, dtypes and
global shapes, that the distinct boxes of each sharded array tile it exactly,
and assigns every dataset one writer: a replicated array to the least-loaded
rank (largest first, so their bytes spread over the ranks), each distinct box
of a sharded array to the lowest rank holding it, values to rank 0. Pure
functions of the gathered summaries: tested without MPI.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .errors import CheckpointError

__all__ = ["Entry", "Plan", "check_tiling", "make_plans", "tiling_problem"]


@dataclass
class Entry:
    """One leaf as one rank holds it (what rank 0 gets from each rank)."""

    name: str
    key: tuple[Any, ...]
    kind: str  # array | sharded | object
    dtype: str  # logical dtype ("bfloat16", "float32", ...) or the value's encoding
    stored: str  # NumPy dtype string of the stored data
    shape: tuple[int, ...]  # global shape (the payload's shape for objects)
    offsets: tuple[int, ...]
    sizes: tuple[int, ...]
    payload: Any = None  # an object's encoded array (rank 0's only)


@dataclass
class Plan:
    """What one rank does in a save."""

    tmp: str  # the temporary directory the save writes into
    token: str
    layout: str  # per-rank | single-file
    writes: list[str] = field(default_factory=list)  # dataset names this rank writes
    datasets: list[Entry] = field(default_factory=list)  # every dataset (single-file: created collectively)


def _describe(e: Entry) -> tuple[Any, ...]:
    return (e.kind, e.dtype, tuple(e.shape)) if e.kind != "object" else ("object",)


def check_same(summaries: list[list[Entry]]) -> None:
    """Raise naming the first rank whose keys, kinds, dtypes or global shapes differ from rank 0's."""
    ref = {e.name: e for e in summaries[0]}
    for r, entries in enumerate(summaries[1:], start=1):
        mine = {e.name: e for e in entries}
        missing = sorted(set(ref) - set(mine))
        extra = sorted(set(mine) - set(ref))
        if missing or extra:
            raise CheckpointError(
                f"rank {r} of the group holds a different state than rank 0: keys missing on rank {r}: "
                f"{missing[:10]}, extra on rank {r}: {extra[:10]}; every rank must pass the same keys to save()"
            )
        for name, e in mine.items():
            if _describe(e) != _describe(ref[name]):
                raise CheckpointError(
                    f"state key {name!r} is {_describe(e)} (kind, dtype, global shape) on rank {r} but "
                    f"{_describe(ref[name])} on rank 0; every rank must describe the same global arrays"
                )


Box = tuple[tuple[int, ...], tuple[int, ...]]


def _overlap(a: Box, b: Box) -> bool:
    return all(max(ao, bo) < min(ao + asz, bo + bsz) for ao, asz, bo, bsz in zip(a[0], a[1], b[0], b[1]))


def _first_overlap(boxes: list[Box]) -> tuple[Box, Box] | None:
    """Two non-empty boxes that overlap, or None: a sweep along the dimension with the most distinct starts."""
    nonempty = [b for b in boxes if all(b[1])]
    if len(nonempty) < 2:
        return None
    ndim = len(nonempty[0][0])
    d = max(range(ndim), key=lambda k: len({b[0][k] for b in nonempty})) if ndim else 0
    if ndim == 0:
        return nonempty[0], nonempty[1]  # two 0-d boxes are the same element
    ordered = sorted(nonempty, key=lambda b: b[0][d])
    for i, a in enumerate(ordered):
        end = a[0][d] + a[1][d]
        for b in ordered[i + 1 :]:
            if b[0][d] >= end:
                break  # every later box starts later still
            if _overlap(a, b):
                return a, b
    return None


def _overlap_text(pair: tuple[Box, Box]) -> str:
    a, b = pair
    return f"the boxes at offsets {a[0]} (sizes {a[1]}) and {b[0]} (sizes {b[1]}) overlap"


def _gap_text(shape: tuple[int, ...], boxes: list[Box]) -> str | None:
    """What part of the array no box holds (given no two boxes overlap), or None."""
    total = int(np.prod(shape, dtype=np.int64))
    volume = sum(int(np.prod(s, dtype=np.int64)) for _, s in boxes)
    if volume != total:
        return f"the boxes hold {volume} elements, not {total}: part of the array is in no box"
    return None


def tiling_problem(shape: tuple[int, ...], boxes: list[Box]) -> str | None:
    """What keeps ``boxes`` from tiling an array of ``shape`` exactly (an overlap or a gap), or None."""
    pair = _first_overlap(boxes)
    return _overlap_text(pair) if pair is not None else _gap_text(shape, boxes)


def check_tiling(name: str, shape: tuple[int, ...], boxes: list[Box]) -> None:
    """The distinct boxes of a sharded array must cover it exactly, without overlap (at save)."""
    pair = _first_overlap(boxes)
    if pair is not None:
        raise CheckpointError(
            f"sharded array {name!r}: {_overlap_text(pair)} but differ; ranks holding the same data must hold the "
            "same box"
        )
    gap = _gap_text(shape, boxes)
    if gap is not None:
        raise CheckpointError(
            f"sharded array {name!r} of global shape {shape}: {gap}; the shards must cover the whole array "
            "(a missing piece would be saved as garbage)"
        )


def make_plans(summaries: list[list[Entry]], tmp: str, token: str, layout: str) -> list[Plan]:
    """One Plan per rank from every rank's summary (rank 0 only)."""
    check_same(summaries)
    n = len(summaries)
    plans = [Plan(tmp, token, layout) for _ in range(n)]
    load = [0] * n
    replicated: list[Entry] = []
    datasets: list[Entry] = []
    for pos, e0 in enumerate(summaries[0]):
        if e0.kind == "object":
            plans[0].writes.append(e0.name)
            datasets.append(e0)
        elif e0.kind == "array":
            replicated.append(e0)
            datasets.append(e0)
        else:
            boxes: dict[tuple[tuple[int, ...], tuple[int, ...]], int] = {}
            for r in range(n):
                e = summaries[r][pos]
                boxes.setdefault((tuple(e.offsets), tuple(e.sizes)), r)
            check_tiling(e0.name, tuple(e0.shape), list(boxes))
            itemsize = np.dtype(e0.stored).itemsize
            for (_, sizes), r in boxes.items():
                plans[r].writes.append(e0.name)
                load[r] += itemsize * int(np.prod(sizes, dtype=np.int64))
            datasets.append(e0)
    sizes_of = {e.name: np.dtype(e.stored).itemsize * int(np.prod(e.shape, dtype=np.int64)) for e in replicated}
    for e in sorted(replicated, key=lambda x: (-sizes_of[x.name], x.name)):
        r = min(range(n), key=lambda i: (load[i], i))
        plans[r].writes.append(e.name)
        load[r] += sizes_of[e.name]
    for p in plans:
        p.writes.sort()
        if layout == "single-file":
            p.datasets = datasets
    plans[0].datasets = datasets  # rank 0 writes the metadata
    return plans
