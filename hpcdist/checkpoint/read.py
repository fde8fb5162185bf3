"""Reading with resharding: each rank reads only the parts of the saved pieces its boxes need.

For every array leaf, the box this rank wants (the whole array, or its shard)
is intersected with each saved piece; each non-empty intersection is one
hyperslab read (``read_direct``) into place. With ``verify`` the read is widened
to whole checksum blocks (rows along dimension 0 of the piece, all columns) so
every block touched is checked against its CRC-32: a piece split along a later
dimension costs extra reads then; ``verify=False`` reads the exact hyperslabs.
The pieces tile the array (checked at save, and again on the metadata at
load, :mod:`.schema`), each dataset read must hold the box the metadata names
(its shape and ``hpcdist_offsets`` attribute), and the read volume is counted:
an uncovered element is an error, never left as it was.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from . import arrays, values
from .errors import CheckpointError, ChecksumError, StructureError
from .layout import Leaf, crc32

__all__ = ["Files", "check_structure", "read_leaf", "read_leaf_named"]

#: checksum blocks read at a time when verifying (about 64 MiB with the default block size)
_CHUNK_BLOCKS = 16


class Files:
    """Open HDF5 files of one checkpoint, opened on first use, closed together."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._open: dict[str, Any] = {}
        self.current: str | None = None  # the file last used (named in errors)

    def dataset(self, file: str, name: str) -> Any:
        import h5py

        self.current = file
        f = self._open.get(file)
        if f is None:
            f = self._open[file] = h5py.File(self.root / file, "r")
        return f[name]

    def close(self) -> None:
        for f in self._open.values():
            f.close()
        self._open.clear()


def _target_dtype(leaf: Leaf) -> str:
    return arrays.logical_dtype(leaf.value)


def check_structure(leaves: list[Leaf], meta: dict[str, Any], strict: bool, path: Path) -> list[tuple[Leaf, dict]]:
    """Pair each leaf with its metadata entry; raise StructureError listing every mismatch."""
    saved = {e["name"]: e for e in meta["entries"]}
    mine = {leaf.name: leaf for leaf in leaves}
    missing = sorted(set(mine) - set(saved))
    extra = sorted(set(saved) - set(mine))
    problems = []
    if missing:
        problems.append(f"keys in the state but not in the checkpoint: {missing}")
    if extra and strict:
        problems.append(f"keys in the checkpoint but not in the state: {extra}")
    pairs = []
    for name, leaf in mine.items():
        e = saved.get(name)
        if e is None:
            continue
        if isinstance(leaf.value, np.ndarray) and not leaf.value.flags.writeable:
            problems.append(f"{name!r}: the state's NumPy array is read-only; pass a writable array to load into")
            continue
        if (leaf.kind == "object") != (e["kind"] == "object"):
            what = "a value" if e["kind"] == "object" else "an array"
            problems.append(
                f"{name!r}: the checkpoint holds {what}, the state {'an array' if what == 'a value' else 'a value'}"
            )
            continue
        if leaf.kind != "object":
            shard = leaf.shard
            assert shard is not None
            if list(shard.global_shape) != e["shape"]:
                problems.append(
                    f"{name!r}: shape {tuple(e['shape'])} in the checkpoint, {shard.global_shape} in the state"
                )
                continue
            dt = _target_dtype(leaf)
            if dt != e["dtype"]:
                problems.append(
                    f"{name!r}: dtype {e['dtype']} in the checkpoint, {dt} in the state (load into a {e['dtype']} "
                    "array and cast)"
                )
                continue
        pairs.append((leaf, e))
    if missing and not strict:
        problems.insert(0, "(strict=False allows extra keys in the checkpoint, not missing ones)")
    if problems:
        raise StructureError(f"checkpoint {str(path)!r} does not match the state: " + "; ".join(problems))
    return pairs


def _verify(block: Any, crc: int, file: str, name: str, index: int) -> None:
    got = crc32(block)
    if got != crc:
        raise ChecksumError(
            f"checksum mismatch in file {file!r}, key {name!r} (block {index}: stored crc32 {crc:#010x}, read "
            f"{got:#010x}): the data on disk is corrupt; load an older checkpoint (see checkpoint.latest)"
        )


def _read_object(files: Files, e: dict[str, Any], verify: bool, trusted: bool) -> Any:
    (piece,) = e["pieces"]
    d = files.dataset(piece["file"], piece["dataset"])
    buf = np.empty(d.shape, dtype=np.dtype(e["stored_dtype"]))
    if buf.size:
        d.read_direct(buf)
    if verify:
        flat = buf.reshape(-1)
        if len(piece["crc32"]) != (1 if flat.size else 0):  # the writer stores one for any non-empty value
            raise ChecksumError(
                f"file {piece['file']!r}, key {e['name']!r}: the metadata lists {len(piece['crc32'])} checksums for a "
                f"value of {flat.size} elements; the metadata is damaged: load an older checkpoint (see checkpoint.latest)"
            )
        if flat.size:
            _verify(flat.view(np.uint8), piece["crc32"][0], piece["file"], e["name"], 0)
    return values.decode(e["encoding"], buf, trusted)


def _ints_attr(attrs: Any, name: str) -> list[int] | None:
    return [int(x) for x in np.asarray(attrs[name]).reshape(-1)] if name in attrs else None


def _dataset_problem(d: Any, piece: dict, e: dict[str, Any]) -> str | None:
    """How the dataset disagrees with the piece the metadata describes (shape, offsets attributes), or None."""
    offsets = _ints_attr(d.attrs, "hpcdist_offsets")
    gshape = _ints_attr(d.attrs, "hpcdist_global_shape")
    if gshape is not None and gshape != e["shape"]:
        return f"its hpcdist_global_shape is {gshape}, the metadata's shape {e['shape']}"
    if offsets is None:  # single-file layout: the dataset is the whole array, the piece sits at its offsets
        want, at = list(e["shape"]), piece["offsets"]
    else:  # per-rank layout: the dataset is the piece
        want, at = piece["sizes"], [0] * len(piece["sizes"])
        if offsets != piece["offsets"]:
            return f"its hpcdist_offsets are {offsets}, the metadata's offsets {piece['offsets']}"
    if piece["at"] != at:
        return f"the metadata places the piece at {piece['at']} in the dataset, not at {at}"
    if list(d.shape) != want:
        return f"it has shape {list(d.shape)}, not {want}"
    return None


def _check_dataset(d: Any, piece: dict, e: dict[str, Any]) -> None:
    problem = _dataset_problem(d, piece, e)
    if problem is not None:
        raise CheckpointError(
            f"file {piece['file']!r}, key {e['name']!r}: dataset {piece['dataset']!r} does not hold the piece at "
            f"offsets {piece['offsets']} the metadata names: {problem}; the checkpoint is damaged: load an older "
            "checkpoint (see checkpoint.latest)"
        )


def _intersect(
    a_off: list[int], a_size: list[int], b_off: list[int], b_size: list[int]
) -> list[tuple[int, int]] | None:
    out = []
    for ao, asz, bo, bsz in zip(a_off, a_size, b_off, b_size):
        lo, hi = max(ao, bo), min(ao + asz, bo + bsz)
        if lo >= hi:
            return None
        out.append((lo, hi))
    return out


def _read_piece(
    files: Files,
    e: dict[str, Any],
    piece: dict,
    box: list[tuple[int, int]],
    want_off: tuple[int, ...],
    out: np.ndarray,
    verify: bool,
) -> None:
    """Read the part ``box`` (global coordinates) of one saved piece into ``out`` (the wanted box)."""
    name = e["name"]
    d = files.dataset(piece["file"], piece["dataset"])
    _check_dataset(d, piece, e)
    p_off, at = piece["offsets"], piece["at"]
    dest = tuple(slice(lo - w, hi - w) for (lo, hi), w in zip(box, want_off))
    if out.ndim == 0:
        tmp = np.empty((), dtype=out.dtype)
        d.read_direct(tmp)
        if verify:
            _verify(tmp.reshape(1).view(np.uint8), piece["crc32"][0], piece["file"], name, 0)
        out[()] = tmp
        return
    if not verify:
        src = tuple(slice(lo - po + a, hi - po + a) for (lo, hi), po, a in zip(box, p_off, at))
        d.read_direct(out, source_sel=src, dest_sel=dest)
        return
    rows, sizes = piece["block_rows"], piece["sizes"]
    r0, r1 = box[0][0] - p_off[0], box[0][1] - p_off[0]  # the rows wanted, in the piece's coordinates
    b0, b1 = r0 // rows, -(-r1 // rows)  # the checksum blocks they touch
    cols = tuple(slice(a, a + s) for a, s in zip(at[1:], sizes[1:]))
    pick = tuple(slice(lo - po, hi - po) for (lo, hi), po in zip(box[1:], p_off[1:]))
    whole_rows = all(p.start == 0 and p.stop == s for p, s in zip(pick, sizes[1:]))
    direct_ok = whole_rows and tuple(out.shape[1:]) == tuple(sizes[1:])
    for c0 in range(b0, b1, _CHUNK_BLOCKS):  # a bounded staging buffer for big pieces
        c1 = min(c0 + _CHUNK_BLOCKS, b1)
        lo_row, hi_row = c0 * rows, min(c1 * rows, sizes[0])  # whole blocks are read
        w0, w1 = max(lo_row, r0), min(hi_row, r1)  # of which these rows are wanted
        at_row = w0 + p_off[0] - want_off[0]  # where they go in out
        src = (slice(lo_row + at[0], hi_row + at[0]), *cols)
        direct = direct_ok and (lo_row, hi_row) == (w0, w1)
        if direct:  # the blocks land in out as they are: no staging copy
            region = out[at_row : at_row + (hi_row - lo_row)]
            if region.size:
                d.read_direct(out, source_sel=src, dest_sel=(slice(at_row, at_row + hi_row - lo_row), *dest[1:]))
        else:
            region = np.empty((hi_row - lo_row, *sizes[1:]), dtype=out.dtype)
            if region.size:
                d.read_direct(region, source_sel=src)
        flat = region.reshape(region.shape[0], -1).view(np.uint8) if region.size else None
        for b in range(c0, c1):
            i0 = b * rows - lo_row
            _verify(flat[i0 : i0 + rows] if flat is not None else b"", piece["crc32"][b], piece["file"], name, b)
        if not direct:
            out[(slice(at_row, at_row + w1 - w0), *dest[1:])] = region[(slice(w0 - lo_row, w1 - lo_row), *pick)]


def read_leaf(files: Files, leaf: Leaf, e: dict[str, Any], verify: bool, trusted: bool) -> None:
    """Load one leaf: replace a value in its dict, or fill an array (its shard) in place."""
    if leaf.kind == "object":
        assert leaf.parent is not None
        leaf.parent[leaf.key[-1]] = _read_object(files, e, verify, trusted)
        return
    shard = leaf.shard
    assert shard is not None
    stored = np.dtype(e["stored_dtype"])
    target = leaf.value
    direct = isinstance(target, np.ndarray) and target.flags.c_contiguous and target.flags.writeable
    if direct and target.dtype.name == "bfloat16":
        out = target.view(np.uint16)
    elif direct and target.dtype == stored:
        out = target
    else:
        out = np.empty(shard.sizes, dtype=stored)
    covered = 0
    for piece in e["pieces"]:
        box = _intersect(list(shard.offsets), list(shard.sizes), piece["offsets"], piece["sizes"])
        if box is None:
            continue
        _read_piece(files, e, piece, box, shard.offsets, out, verify)
        covered += int(np.prod([hi - lo for lo, hi in box], dtype=np.int64))
    want = int(np.prod(shard.sizes, dtype=np.int64))
    if out.ndim == 0:
        covered = 1
    if covered != want:
        raise CheckpointError(
            f"key {e['name']!r}: the checkpoint's pieces cover {covered} of the {want} elements this rank needs; "
            "its metadata is damaged"
        )
    if out is not target and not (direct and target.dtype.name == "bfloat16"):
        arrays.fill(target, out)


def read_leaf_named(files: Files, leaf: Leaf, e: dict[str, Any], verify: bool, trusted: bool, rank: int) -> None:
    """:func:`read_leaf`; any error that is not a CheckpointError comes back as one naming the key, file and rank."""
    files.current = None
    try:
        read_leaf(files, leaf, e, verify, trusted)
    except CheckpointError:
        raise
    except Exception as exc:
        where = f"file {files.current!r}" if files.current else "no file opened yet"
        raise CheckpointError(f"group rank {rank}: key {e['name']!r}, {where}: {type(exc).__name__}: {exc}") from exc
