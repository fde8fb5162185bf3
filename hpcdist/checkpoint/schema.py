"""The metadata of a checkpoint, checked once after it is read and before any data is.

A damaged ``hpcdist-checkpoint.json`` (a field missing or of the wrong type, a
box outside the array, pieces that overlap or leave a gap, fewer checksums
than blocks) raises :class:`CheckpointError` naming the metadata file and the
field, instead of a bare ``KeyError``/``IndexError`` later or, worse, a load
that fills the arrays with the wrong elements. Pure functions: tested without MPI.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from . import values
from .errors import CheckpointError
from .plan import tiling_problem

__all__ = ["expected_crcs", "validate"]

_KINDS = ("array", "sharded", "object")


class _Bad(Exception):
    """One field of the metadata is wrong (the message names it)."""


def _need(cond: bool, field: str, expected: str, got: Any) -> None:
    if not cond:
        raise _Bad(f"{field} must be {expected}, got {got!r}")


def _ints(v: Any, field: str, n: int | None, minimum: int = 0) -> list[int]:
    ok = isinstance(v, list) and all(type(x) is int and x >= minimum for x in v) and (n is None or len(v) == n)
    _need(ok, field, f"a list of {'' if n is None else n} ints >= {minimum}", v)
    return v


def _dtype(v: Any, field: str) -> None:
    try:
        ok = isinstance(v, str) and np.dtype(v).kind in "biufcS"
    except TypeError:
        ok = False
    _need(ok, field, "a NumPy dtype string of a stored dtype", v)


def _file_name(v: Any, field: str) -> None:
    _need(isinstance(v, str) and v not in ("", ".", "..") and "/" not in v, field, "a file name in the checkpoint", v)


def expected_crcs(sizes: list[int], rows: int) -> int:
    """How many CRC-32s the writer stores for a piece of ``sizes`` with ``rows`` rows per block."""
    return 1 if not sizes else -(-sizes[0] // rows)


def _piece(p: Any, field: str, shape: list[int]) -> tuple[tuple[int, ...], tuple[int, ...]]:
    _need(isinstance(p, dict), field, "an object", p)
    _file_name(p.get("file"), f"{field}.file")
    _need(isinstance(p.get("dataset"), str), f"{field}.dataset", "a dataset name", p.get("dataset"))
    n = len(shape)
    off = _ints(p.get("offsets"), f"{field}.offsets", n)
    sizes = _ints(p.get("sizes"), f"{field}.sizes", n)
    _ints(p.get("at"), f"{field}.at", n)
    for d, (o, s, g) in enumerate(zip(off, sizes, shape)):
        _need(o + s <= g, f"{field}.offsets/sizes", f"a box inside the shape {shape} (dimension {d})", [off, sizes])
    rows = p.get("block_rows")
    _need(type(rows) is int and rows >= 1, f"{field}.block_rows", "an int >= 1", rows)
    want = expected_crcs(sizes, rows)
    _ints(p.get("crc32"), f"{field}.crc32", want)
    return tuple(off), tuple(sizes)


def _array_entry(e: dict[str, Any], field: str) -> None:
    _need(isinstance(e.get("dtype"), str), f"{field}.dtype", "a dtype name", e.get("dtype"))
    _dtype(e.get("stored_dtype"), f"{field}.stored_dtype")
    shape = _ints(e.get("shape"), f"{field}.shape", None)
    pieces = e["pieces"]
    boxes = [_piece(p, f"{field}.pieces[{i}]", shape) for i, p in enumerate(pieces)]
    problem = tiling_problem(tuple(shape), boxes)
    if problem is not None:
        raise _Bad(f"{field}.pieces do not tile the array of shape {tuple(shape)}: {problem}")


def _object_entry(e: dict[str, Any], field: str) -> None:
    enc = e.get("encoding")
    _need(enc in values.ENCODINGS, f"{field}.encoding", f"one of {sorted(values.ENCODINGS)}", enc)
    _dtype(e.get("stored_dtype"), f"{field}.stored_dtype")
    pieces = e["pieces"]
    _need(len(pieces) == 1, f"{field}.pieces", "a list of one piece", pieces)
    p = pieces[0]
    _need(isinstance(p, dict), f"{field}.pieces[0]", "an object", p)
    _file_name(p.get("file"), f"{field}.pieces[0].file")
    _need(isinstance(p.get("dataset"), str), f"{field}.pieces[0].dataset", "a dataset name", p.get("dataset"))
    crcs = p.get("crc32")
    _need(isinstance(crcs, list) and len(crcs) <= 1, f"{field}.pieces[0].crc32", "a list of at most one int", crcs)
    _ints(crcs, f"{field}.pieces[0].crc32", None)


def _entry(e: Any, field: str) -> None:
    _need(isinstance(e, dict), field, "an object", e)
    _need(isinstance(e.get("name"), str) and e["name"] != "", f"{field}.name", "a key name", e.get("name"))
    _need(isinstance(e.get("key"), list), f"{field}.key", "a list", e.get("key"))
    _need(e.get("kind") in _KINDS, f"{field}.kind", f"one of {_KINDS}", e.get("kind"))
    pieces = e.get("pieces")
    _need(isinstance(pieces, list) and len(pieces) > 0, f"{field}.pieces", "a non-empty list", pieces)
    if e["kind"] == "object":
        _object_entry(e, field)
    else:
        _array_entry(e, field)


def validate(meta: Any, where: str) -> dict[str, Any]:
    """``meta`` if it is a well-formed metadata document, else CheckpointError naming ``where`` and the field."""
    try:
        _need(isinstance(meta, dict), "the document", "a JSON object", type(meta).__name__)
        entries = meta.get("entries")
        _need(isinstance(entries, list), "entries", "a list", entries)
        names = set()
        for i, e in enumerate(entries):
            _entry(e, f"entries[{i}]")
            _need(e["name"] not in names, f"entries[{i}].name", "unique", e["name"])
            names.add(e["name"])
    except _Bad as exc:
        raise CheckpointError(
            f"the checkpoint's metadata {where!r} is damaged: {exc}; load an older checkpoint (see checkpoint.latest)"
        ) from None
    return meta
