"""Writing a checkpoint: host copies, the HDF5 files of one rank, and the commit on rank 0.

Two layouts, one metadata format:

* ``per-rank``: each rank writes ``rank-NNNNN.h5`` holding the datasets it was
  assigned (its boxes of sharded arrays, some replicated arrays, and on rank 0
  the values); plain h5py, no MPI in the I/O.
* ``single-file``: all ranks open ``data.h5`` with the ``mpio`` driver
  (h5py built with parallel HDF5), create every dataset at its global shape
  collectively, and each writes its boxes with independent I/O.

Files are flushed, closed and fsynced before a rank reports its checksums; rank
0 then writes the metadata, fsyncs it and the directory, and renames the
temporary directory to the checkpoint's name (:func:`commit`).
"""

from __future__ import annotations

import os
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from .._version import __version__
from . import arrays, swap, values
from .errors import CheckpointError
from .layout import FORMAT, FORMAT_VERSION, META_NAME, Leaf, block_rows, checksums, fsync_path, write_json
from .plan import Entry, Plan

__all__ = ["HostLeaf", "check_target", "commit", "new_tmp", "prepare", "write_rank"]

DATA_FILE = "data.h5"


def rank_file(rank: int) -> str:
    return f"rank-{rank:05d}.h5"


@dataclass
class HostLeaf:
    """A leaf ready to write: its summary entry and its host data (stored dtype)."""

    entry: Entry
    data: np.ndarray


def prepare(leaves: list[Leaf], copy: bool, is_root: bool) -> list[HostLeaf]:
    """Host copies (``copy``: never views of the caller's arrays) and summary entries of the leaves."""
    out: list[HostLeaf] = []
    for leaf in leaves:
        if leaf.kind == "object":
            enc, payload = values.encode(leaf.value)
            e = Entry(leaf.name, leaf.key, "object", enc, payload.dtype.str, payload.shape, (), (), None)
            if is_root:
                e.payload = payload
            out.append(HostLeaf(e, payload))
            continue
        host, dtype = arrays.to_host(leaf.value, copy)
        shard = leaf.shard
        assert shard is not None
        if tuple(host.shape) != shard.sizes:
            raise ValueError(f"state{leaf.label}: local array shape {tuple(host.shape)} != its shard's {shard.sizes}")
        e = Entry(leaf.name, leaf.key, leaf.kind, dtype, host.dtype.str, shard.global_shape, shard.offsets, shard.sizes)
        out.append(HostLeaf(e, host))
    return out


def _attrs(e: Entry) -> dict[str, Any]:
    if e.kind == "object":
        return {"hpcdist_encoding": e.dtype}
    return {"hpcdist_dtype": e.dtype, "hpcdist_global_shape": np.asarray(e.shape, dtype=np.int64)}


def _crcs(h: HostLeaf) -> list[int]:
    if h.entry.kind == "object":
        return checksums(np.ascontiguousarray(h.data).reshape(-1), 1 << 62)
    return checksums(h.data, block_rows(tuple(h.entry.sizes), h.data.dtype.itemsize))


def _piece_record(file: str, h: HostLeaf, at: tuple[int, ...], crcs: list[int]) -> dict[str, Any]:
    e = h.entry
    if e.kind == "object":
        return {"file": file, "dataset": e.name, "crc32": crcs}
    return {
        "file": file,
        "dataset": e.name,
        "offsets": list(e.offsets),
        "sizes": list(e.sizes),
        "at": list(at),
        "block_rows": block_rows(tuple(e.sizes), h.data.dtype.itemsize),
        "crc32": crcs,
    }


def write_rank(plan: Plan, mine: list[HostLeaf], rank: int, comm: Any = None) -> list[dict[str, Any]]:
    """Write this rank's datasets; returns their piece records (with checksums)."""
    by_name = {h.entry.name: h for h in mine}
    with ThreadPoolExecutor(1, thread_name_prefix="hpcdist-crc") as pool:  # checksums overlap the writes
        crcs = {name: pool.submit(_crcs, by_name[name]) for name in plan.writes}
        return _write_files(plan, by_name, rank, comm, crcs)


def _write_files(
    plan: Plan, by_name: dict[str, HostLeaf], rank: int, comm: Any, crcs: dict[str, Any]
) -> list[dict[str, Any]]:
    import h5py

    tmp = Path(plan.tmp)
    records: list[dict[str, Any]] = []
    if plan.layout == "single-file":
        path = tmp / DATA_FILE
        with h5py.File(path, "w", driver="mpio", comm=comm, libver="latest") as f:
            dsets = {}
            for e in plan.datasets:  # collective: every rank creates every dataset in the same order
                d = f.create_dataset(e.name, shape=tuple(e.shape), dtype=np.dtype(e.stored))
                for k, v in _attrs(e).items():
                    d.attrs[k] = v
                dsets[e.name] = d
            for name in plan.writes:
                h = by_name[name]
                at = tuple(h.entry.offsets) if h.entry.kind != "object" else ()
                if h.data.size:
                    dsets[name].write_direct(h.data, dest_sel=tuple(slice(a, a + s) for a, s in zip(at, h.data.shape)))
                records.append(_piece_record(DATA_FILE, h, at, crcs[name].result()))
        return records
    if not plan.writes:
        return records
    fname = rank_file(rank)
    path = tmp / fname
    with h5py.File(path, "w", libver="latest") as f:
        for name in plan.writes:
            h = by_name[name]
            d = f.create_dataset(name, data=h.data)
            for k, v in _attrs(h.entry).items():
                d.attrs[k] = v
            if h.entry.kind != "object":
                d.attrs["hpcdist_offsets"] = np.asarray(h.entry.offsets, dtype=np.int64)
            at = (0,) * h.data.ndim if h.entry.kind != "object" else ()
            records.append(_piece_record(fname, h, at, crcs[name].result()))
        f.flush()
    fsync_path(path)
    return records


def metadata(
    datasets: list[Entry], records: list[dict[str, Any]], world: int, layout: str, token: str
) -> dict[str, Any]:
    """The metadata document of a checkpoint (rank 0)."""
    pieces: dict[str, list[dict[str, Any]]] = {}
    for rec in records:
        pieces.setdefault(rec["dataset"], []).append(rec)
    entries = []
    for e in datasets:
        item: dict[str, Any] = {"key": list(e.key), "name": e.name, "kind": e.kind}
        if e.kind == "object":
            item.update(encoding=e.dtype, stored_dtype=e.stored)
        else:
            item.update(dtype=e.dtype, stored_dtype=e.stored, shape=list(e.shape))
        found = pieces.get(e.name, [])
        if not found:
            raise CheckpointError(f"internal: no rank wrote {e.name!r}")
        item["pieces"] = sorted(found, key=lambda p: p.get("offsets", []))
        entries.append(item)
    return {
        "format": FORMAT,
        "version": FORMAT_VERSION,
        "hpcdist_version": __version__,
        "world_size": world,
        "layout": layout,
        "token": token,
        "entries": entries,
    }


def commit(plan: Plan, final: Path, records: list[dict[str, Any]], world: int, overwrite: bool) -> None:
    """Rank 0, after every rank wrote and synced: metadata, fsync, atomic rename of the temporary directory."""
    tmp = Path(plan.tmp)
    if plan.layout == "single-file":
        fsync_path(tmp / DATA_FILE)
    write_json(tmp / META_NAME, metadata(plan.datasets, records, world, plan.layout, plan.token))
    fsync_path(tmp, directory=True)
    check_target(final, overwrite)  # again: something may have appeared during the save
    if not final.exists():
        os.rename(tmp, final)
        fsync_path(final.parent, directory=True)
        return
    if swap.exchange(tmp, final):  # atomic: final holds the new checkpoint, tmp the old one
        fsync_path(final.parent, directory=True)
        shutil.rmtree(tmp, ignore_errors=True)
        return
    old = final.parent / f".{final.name}.old-{plan.token}"
    os.rename(final, old)  # a crash from here to the next rename is repaired by swap.recover
    os.rename(tmp, final)
    fsync_path(final.parent, directory=True)
    shutil.rmtree(old, ignore_errors=True)


def _holds(path: Path) -> str:
    names = sorted(p.name for p in path.iterdir())
    return f"{names[:5]}{' and more' if len(names) > 5 else ''}"


def check_target(final: Path, overwrite: bool) -> None:
    """Refuse to replace anything but an hpcdist checkpoint or an empty directory (and anything without overwrite)."""
    if not final.exists() and not final.is_symlink():
        return
    if not overwrite:
        raise CheckpointError(
            f"{str(final)!r} exists already; pass overwrite=True to replace it, or save under a new name"
        )
    fix = "overwrite=True replaces only an hpcdist checkpoint or an empty directory: move it away or save under another name"
    if final.is_symlink() or not final.is_dir():
        what = "a symbolic link" if final.is_symlink() else "a file"
        raise CheckpointError(f"{str(final)!r} exists and is {what}, not a checkpoint; {fix}")
    if not (final / META_NAME).is_file() and any(final.iterdir()):
        raise CheckpointError(
            f"{str(final)!r} exists and is a directory but not an hpcdist checkpoint (no {META_NAME}; it holds "
            f"{_holds(final)}); {fix}"
        )


def new_tmp(final: Path, token: str) -> Path:
    """Create the temporary directory of a save of ``final`` (group rank 0).

    First a previous checkpoint that a crash during an overwrite left hidden is
    put back (:func:`swap.recover`), then what earlier killed saves of that name
    left is removed.
    """
    final.parent.mkdir(parents=True, exist_ok=True)
    swap.recover(final)
    swap.remove_leftovers(final)
    tmp = final.parent / f".{final.name}.tmp-{token}"
    tmp.mkdir()
    return tmp
