"""What a checkpoint is on disk: leaves of the state, the metadata file, checksums, ``latest``.

A checkpoint is a directory. It holds HDF5 data files (``rank-NNNNN.h5``, one
per writing rank, or one ``data.h5`` written collectively through MPI-IO) and
``hpcdist-checkpoint.json``, the metadata: for every leaf its key, kind,
logical and stored dtype, global shape and the pieces that tile it (file,
dataset, box, CRC-32 per block of rows). A directory is a checkpoint only
once it has its final name, which a save gives it by one atomic rename after
every rank has written and synced its files.
"""

from __future__ import annotations

import json
import os
import re
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from . import arrays, schema
from .shard import Shard, Sharded

__all__ = ["META_NAME", "Leaf", "flatten", "latest", "publish_json", "read_metadata", "write_json"]

META_NAME = "hpcdist-checkpoint.json"
FORMAT = "hpcdist-checkpoint"
FORMAT_VERSION = 1
#: rows of a piece covered by one checksum: about this many bytes
BLOCK_BYTES = 4 << 20


@dataclass
class Leaf:
    """One leaf of a state dict: its key path, dataset name, kind and value."""

    key: tuple[Any, ...]
    name: str
    kind: str  # "array" (replicated), "sharded", "object"
    value: Any  # the array (local piece for "sharded") or the Python value
    shard: Shard | None = None
    parent: dict | None = None  # where an "object" leaf is replaced on load

    @property
    def label(self) -> str:
        """The key as the user wrote it: state['a']['b']."""
        return "".join(f"[{k!r}]" for k in self.key)


def _is_dtensor(x: Any) -> bool:
    import sys

    mod = sys.modules.get("torch.distributed.tensor")
    return mod is not None and isinstance(x, mod.DTensor)


def _key_part(k: Any, path: tuple[Any, ...]) -> str:
    where = "".join(f"[{p!r}]" for p in path)
    if isinstance(k, bool) or not isinstance(k, (str, int)):
        raise TypeError(f"state{where} has key {k!r}: keys must be str or int")
    s = str(k)
    if isinstance(k, str) and (not k or "/" in k or k.startswith(".")):
        raise ValueError(f"state{where} has key {k!r}: keys must be non-empty, without '/', not starting with '.'")
    return s


def flatten(state: Any) -> list[Leaf]:
    """The leaves of a nested dict, sorted by dataset name."""
    if not isinstance(state, dict):
        raise TypeError(f"state must be a dict (nested dicts of arrays and values), got {type(state).__name__}")
    out: list[Leaf] = []
    seen: dict[str, tuple[Any, ...]] = {}

    def walk(d: dict, path: tuple[Any, ...], prefix: str) -> None:
        for k, v in d.items():
            key = (*path, k)
            name = prefix + _key_part(k, path)
            if name in seen:
                raise ValueError(f"state keys {seen[name]!r} and {key!r} map to the same name {name!r}")
            seen[name] = key
            if isinstance(v, dict):
                walk(v, key, name + "/")
            elif isinstance(v, Sharded):
                out.append(Leaf(key, name, "sharded", v.local, v.shard))
            elif _is_dtensor(v):
                out.append(Leaf(key, name, "sharded", v.to_local(), Shard.from_dtensor(v)))
            elif arrays.is_array(v):
                out.append(Leaf(key, name, "array", v, Shard.whole(tuple(int(s) for s in v.shape))))
            else:
                out.append(Leaf(key, name, "object", v, None, d))

    walk(state, (), "")
    out.sort(key=lambda leaf: leaf.name)
    return out


# ------------------------------------------------------------------ checksums


def block_rows(sizes: tuple[int, ...], itemsize: int) -> int:
    """Rows (along dimension 0) per checksum block of a piece of shape ``sizes``."""
    if not sizes:
        return 1
    row = itemsize * int(np.prod(sizes[1:], dtype=np.int64))
    return max(1, BLOCK_BYTES // max(1, row))


_CRC32: list[Any] = []


def crc32(data: Any) -> int:
    """CRC-32 (zlib's polynomial) of a buffer: ISA-L's SIMD version when ``isal`` is installed, else zlib's.

    Both give the same values, so checkpoints do not depend on which one wrote them.
    """
    if not _CRC32:
        try:
            from isal import isal_zlib

            _CRC32.append(isal_zlib.crc32)
        except ImportError:
            _CRC32.append(zlib.crc32)
    return int(_CRC32[0](data))


def checksums(arr: np.ndarray, rows: int) -> list[int]:
    """CRC-32 of each block of ``rows`` rows of C-contiguous ``arr`` (one block for a 0-d array)."""
    if arr.ndim == 0:
        return [crc32(arr.tobytes())]
    flat = arr.reshape(arr.shape[0], -1).view(np.uint8) if arr.size else arr.reshape(arr.shape[0], 0)
    return [crc32(flat[i : i + rows].data) for i in range(0, arr.shape[0], rows)]


# ------------------------------------------------------------------ files


def fsync_path(path: Path, directory: bool = False) -> None:
    """fsync a file or directory by path."""
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_json(path: Path, obj: Any) -> None:
    """Write JSON and fsync it (the file only; the caller syncs the directory)."""
    with open(path, "w") as fh:
        json.dump(obj, fh, indent=1)
        fh.flush()
        os.fsync(fh.fileno())


def publish_json(path: Path, obj: Any) -> None:
    """Write JSON that other processes poll for: written whole as ``<name>.part``, then renamed into place.

    A reader that sees ``path`` exist reads all of it, never the empty file a
    plain write shows between its creation and its first flush.
    """
    part = path.with_name(path.name + ".part")
    write_json(part, obj)
    os.rename(part, path)


def read_metadata(path: Path) -> dict[str, Any]:
    """The metadata of the checkpoint at ``path``, checked (raises FileNotFoundError/ValueError/CheckpointError)."""
    meta_path = path / META_NAME
    if not meta_path.is_file():
        if not path.exists():
            raise FileNotFoundError(f"no checkpoint at {str(path)!r}: the directory does not exist")
        raise FileNotFoundError(
            f"{str(path)!r} is not a complete hpcdist checkpoint: it has no {META_NAME} "
            "(use checkpoint.latest(dir) to find the newest complete one)"
        )
    try:
        with open(meta_path, encoding="utf-8") as fh:
            meta = json.load(fh)
    except ValueError as exc:  # JSONDecodeError, UnicodeDecodeError
        raise ValueError(
            f"the checkpoint's metadata {str(meta_path)!r} is damaged: not valid JSON ({exc}); load an older "
            "checkpoint (see checkpoint.latest)"
        ) from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("version") != FORMAT_VERSION:
        got = (meta.get("format"), meta.get("version")) if isinstance(meta, dict) else (type(meta).__name__, None)
        raise ValueError(
            f"{str(meta_path)!r} is format {got[0]!r} version {got[1]!r}; this hpcdist "
            f"reads {FORMAT!r} version {FORMAT_VERSION}"
        )
    return schema.validate(meta, str(meta_path))


def key_from_json(key: list[Any]) -> tuple[Any, ...]:
    return tuple(key)


_NUM = re.compile(r"(\d+)")


def _natural(name: str) -> list[Any]:
    return [int(p) if p.isdigit() else p for p in _NUM.split(name)]


#: the name a commit gives the previous checkpoint while it swaps in the new one (see swap.py)
_OLD = re.compile(r"^\.(?P<name>.+)\.old-[0-9a-f]+$")


def _orphans(d: Path, taken: set[str]) -> dict[str, Path]:
    """Previous checkpoints left as ``.NAME.old-TOKEN`` by a crash during an overwrite, whose NAME is missing."""
    found: dict[str, Path] = {}
    olds = [p for p in d.iterdir() if _OLD.match(p.name) and (p / META_NAME).is_file()]
    for p in sorted(olds, key=lambda q: q.stat().st_mtime, reverse=True):  # the newest copy of a name wins
        name = _OLD.match(p.name)["name"]  # type: ignore[index]
        if name not in taken and not (d / name).exists():
            found.setdefault(name, p)
    return found


def complete_checkpoints(directory: str | os.PathLike) -> Iterator[Path]:
    """The complete checkpoints directly under ``directory``, oldest first (natural name order).

    A checkpoint whose overwrite was killed between its two renames is found
    under its hidden name ``.NAME.old-TOKEN`` (the next save or load of NAME
    renames it back).
    """
    d = Path(directory)
    if not d.is_dir():
        return iter(())
    found = {p.name: p for p in d.iterdir() if not p.name.startswith(".") and (p / META_NAME).is_file()}
    found.update(_orphans(d, set(found)))
    return iter(found[name] for name in sorted(found, key=_natural))


def latest(directory: str | os.PathLike) -> Path | None:
    """The newest complete checkpoint directly under ``directory``, or None.

    Checkpoints are ordered by name, numbers compared as numbers
    (``step_9`` < ``step_10``): name them by step. Directories of saves that
    did not finish (hidden temporaries, no metadata) are never returned.

    Args:
        directory: the directory holding checkpoint directories.

    Returns:
        The path of the newest complete checkpoint, or ``None`` when there is none.
    """
    found = list(complete_checkpoints(directory))
    return found[-1] if found else None
