"""``save``, ``load`` and ``async_save``: the collective entry points.

SPMD contract: every rank of ``group`` calls ``save``/``load``/``async_save``
with the same ``path`` and a state of the same keys, kinds, dtypes and global
shapes (sharded arrays may be sliced differently on each rank; a load may use
any slicing, on any number of ranks). A save takes four collectives on the
group: the summaries (with each rank's path) gathered to group rank 0 and the
plans scattered back, then (after the writes) the checksums gathered and the
outcome broadcast. A load takes three: the paths gathered, the metadata
broadcast and the outcome all-gathered. Ranks that pass different paths get a
:class:`CheckpointError` naming them, before anything is written or read. An error
on one rank (bad state, full disk, corrupt file) reaches every rank as a
:class:`CheckpointError`: no rank is left waiting in a collective.
"""

from __future__ import annotations

import os
import shutil
import threading
import uuid
import weakref
from pathlib import Path
from typing import Any

from .._ranklist import MESSAGE_LIMIT, ranks_text
from ..group import GroupMember, ProcessGroup, resolve_group
from ..objects import all_gather_object, broadcast_object_list, gather_object, scatter_object_list
from . import layout as _layout
from . import read as _read
from . import swap as _swap
from . import write as _write
from .errors import CheckpointError
from .plan import Plan, make_plans

__all__ = ["load", "save"]

_LAYOUTS = ("auto", "per-rank", "single-file")
#: the save in flight per group (async_save); a later save/load of the group waits for it first
_INFLIGHT: weakref.WeakKeyDictionary[ProcessGroup, Any] = weakref.WeakKeyDictionary()
_INFLIGHT_LOCK = threading.Lock()


def group_of(group: Any, what: str) -> ProcessGroup:
    """The ProcessGroup of ``group``; ValueError (no warning first) when this rank is not one of its members."""
    if group is GroupMember.NON_GROUP_MEMBER:
        raise ValueError(
            f"{what}: group is GroupMember.NON_GROUP_MEMBER (new_group's result on a rank outside it): this rank "
            "is not a member; only the group's members call it"
        )
    pg = resolve_group(group, what)
    assert pg is not None  # resolve_group returns None only for NON_GROUP_MEMBER
    return pg


def wait_inflight(pg: ProcessGroup) -> None:
    """Finish the async save in flight on ``pg`` (if any); an error not yet seen through its SaveWork surfaces here."""
    with _INFLIGHT_LOCK:
        work = _INFLIGHT.pop(pg, None)
    if work is not None:
        work.settle()


def _h5py_mpi() -> bool:
    import h5py

    return bool(h5py.get_config().mpi)


def resolve_layout(layout: str, pg: ProcessGroup) -> str:
    if layout not in _LAYOUTS:
        raise ValueError(f"layout must be one of {_LAYOUTS}, got {layout!r}")
    if layout == "auto":
        return "single-file" if pg.size() > 1 and _h5py_mpi() else "per-rank"
    if layout == "single-file" and not _h5py_mpi():
        raise ValueError(
            "layout='single-file' needs h5py built with parallel HDF5 (h5py.get_config().mpi is False here); "
            "use layout='per-rank' or install an MPI-enabled h5py (see docs/checkpoint.md)"
        )
    return layout


def _fail(exc: BaseException) -> str:
    return str(exc) if isinstance(exc, CheckpointError) else f"{type(exc).__name__}: {exc}"


def _raise_first(outcomes: list[Any], what: str) -> None:
    bad = [(r, o) for r, o in enumerate(outcomes) if o is not None]
    if not bad:
        return
    msgs: dict[str, list[int]] = {}
    for r, o in bad:
        msgs.setdefault(o, []).append(r)
    text = "; ".join(f"on group rank(s) {ranks_text(rs, MESSAGE_LIMIT)}: {m}" for m, rs in msgs.items())
    raise CheckpointError(f"{what} failed {text}")


def same_paths(paths: list[str]) -> None:
    """Raise (group rank 0) when the ranks passed different paths, naming the ranks and the paths."""
    others = [r for r, p in enumerate(paths) if p != paths[0]]
    if others:
        raise CheckpointError(
            f"the ranks passed different paths: group rank(s) {ranks_text(others, MESSAGE_LIMIT)} passed "
            f"{paths[others[0]]!r}, group "
            f"rank 0 {paths[0]!r}; every rank must pass the same path (build it from a step all ranks share)"
        )


def _plans_on_root(gathered: list[Any], final: Path, layout: str, overwrite: bool) -> list[Plan]:
    """Group rank 0: check the paths, the target and the summaries; the temporary directory and every plan."""
    same_paths([g[0] for g in gathered])
    token = uuid.uuid4().hex[:12]
    tmp = _write.new_tmp(final, token)
    try:
        _write.check_target(final, overwrite)
        return make_plans([g[1] for g in gathered], str(tmp), token, layout)
    except Exception:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def agree(pg: ProcessGroup, host: list, final: Path, layout: str, overwrite: bool) -> Plan:
    """Summaries (with the path) to rank 0, plans back; returns this rank's plan. Collective."""
    rank, size = pg.rank(), pg.size()
    summary = (str(final), [h.entry for h in host])
    gathered: list[Any] = [None] * size if rank == 0 else []
    gather_object(summary, gathered if rank == 0 else None, group=pg, group_dst=0)
    plans: list[Any] = [None] * size
    if rank == 0:
        try:
            plans = _plans_on_root(gathered, final, layout, overwrite)
        except Exception as exc:
            plans = [f"save to {str(final)!r}: {_fail(exc)}"] * size
    mine: list[Any] = [None]
    scatter_object_list(mine, plans if rank == 0 else None, group=pg, group_src=0)
    if isinstance(mine[0], str):
        raise CheckpointError(mine[0])
    return mine[0]


def prepare(pg: ProcessGroup, state: Any, copy: bool) -> list:
    """Flatten and copy to host: argument errors raise here, on this rank, before any message moves."""
    return _write.prepare(_layout.flatten(state), copy, pg.rank() == 0)


def finish_sync(pg: ProcessGroup, plan: Plan, host: list, final: Path, overwrite: bool) -> None:
    """Write this rank's files, gather checksums, rank 0 commits, outcome broadcast. Collective."""
    rank, size = pg.rank(), pg.size()
    try:
        result: Any = _write.write_rank(plan, host, rank, pg.comm)
    except Exception as exc:
        result = _fail(exc)
    gathered: list[Any] = [None] * size if rank == 0 else []
    gather_object(result, gathered if rank == 0 else None, group=pg, group_dst=0)
    outcome: list[Any] = [None]
    if rank == 0:
        failed = [g if isinstance(g, str) else None for g in gathered]
        try:
            _raise_first(failed, f"save to {str(final)!r}")  # a rank's write failed: the error names the save
            _write.commit(plan, final, [rec for g in gathered for rec in g], size, overwrite)
        except Exception as exc:
            shutil.rmtree(plan.tmp, ignore_errors=True)
            outcome[0] = str(exc) if any(failed) else f"save to {str(final)!r}: {_fail(exc)}"
    broadcast_object_list(outcome, group=pg, group_src=0)
    if outcome[0] is not None:
        raise CheckpointError(outcome[0])


def save(
    state: dict[str, Any],
    path: str | os.PathLike,
    group: Any = None,
    *,
    layout: str = "auto",
    overwrite: bool = False,
) -> Path:
    """Save ``state`` as the checkpoint directory ``path``. Collective over ``group``.

    Args:
        state: a nested dict (str or int keys) of arrays (NumPy, torch CPU/CUDA,
            CuPy), :class:`Sharded` arrays or torch DTensors, and Python values
            (numbers, strings, bytes, None, small picklable objects). Plain
            arrays are replicated: every rank holds the same array and one rank
            writes it (the copies are not compared). Values are taken from
            group rank 0.
        path: the checkpoint's directory; it must not exist unless ``overwrite``.
        group: the process group (default: the world). Every member calls.
        layout: ``"per-rank"`` (one HDF5 file per writing rank), ``"single-file"``
            (one HDF5 file written collectively through MPI-IO; needs h5py with
            parallel HDF5), or ``"auto"`` (single-file where possible).
        overwrite: replace an existing checkpoint (or empty directory) at
            ``path``; anything else there (a file, a directory of other things)
            is refused, never deleted.

    Returns:
        The checkpoint's path. It exists, complete and synced to disk, on return;
        until then a previous checkpoint is untouched.

    Raises:
        TypeError, ValueError: a key, array dtype or value that cannot be saved;
            raised on the calling rank before any message moves (a rank that
            raises leaves the others to time out, as with any collective).
        CheckpointError: on every rank, when any rank failed later (ranks that
            disagree on keys or shapes or pass different paths, shards that do
            not tile the array, an existing ``path`` that may not be replaced, a
            write error; the message names the rank).
    """
    pg = group_of(group, "checkpoint.save")
    wait_inflight(pg)
    final = Path(path).absolute()
    kind = resolve_layout(layout, pg)
    host = prepare(pg, state, copy=False)
    plan = agree(pg, host, final, kind, overwrite)
    finish_sync(pg, plan, host, final, overwrite)
    return final


def load(
    state: dict[str, Any],
    path: str | os.PathLike,
    group: Any = None,
    *,
    strict: bool = True,
    verify: bool = True,
    trusted: bool = False,
) -> dict[str, Any]:
    """Load the checkpoint at ``path`` into ``state`` in place. Collective over ``group``.

    The checkpoint may come from any number of ranks with any slicing: each
    array of ``state`` (a whole array, a :class:`Sharded` piece, a DTensor's
    local shard) gets exactly its box, read from the saved pieces it overlaps.
    Values (numbers, strings, objects) are replaced in their dicts.

    Args:
        state: the state to fill; its keys, global shapes and dtypes must match
            the checkpoint's.
        path: a checkpoint directory (see :func:`latest`).
        group: the process group (default: the world). Every member calls.
        strict: when False, keys of the checkpoint missing from ``state`` are
            skipped (keys of ``state`` missing from the checkpoint are always an error).
        verify: check the CRC-32 of every block read (reads whole blocks).
        trusted: unpickle stored objects without restriction (only for
            checkpoints you wrote); by default hpcdist's restricted unpickler is used.

    Returns:
        ``state``, filled.

    Raises:
        StructureError: keys missing/extra, shapes or dtypes that differ (all named).
        ChecksumError: corrupt data (file and key named).
        CheckpointError: on every rank when any rank failed.
    """
    pg = group_of(group, "checkpoint.load")
    wait_inflight(pg)
    root = Path(path).absolute()
    meta = metadata_of(pg, root)
    error: Any = None
    structure: BaseException | None = None
    files = _read.Files(root)
    try:
        pairs = _read.check_structure(_layout.flatten(state), meta, strict, root)
        for leaf, entry in pairs:
            _read.read_leaf_named(files, leaf, entry, verify, trusted, pg.rank())
    except Exception as exc:
        structure = exc
        error = str(exc) if isinstance(exc, CheckpointError) else _fail(exc)
    finally:
        files.close()
    outcomes: list[Any] = [None] * pg.size()
    all_gather_object(outcomes, error, group=pg)
    if isinstance(structure, CheckpointError):
        raise structure  # this rank's own error, its type kept (StructureError, ChecksumError)
    if structure is not None:
        raise CheckpointError(f"load from {str(root)!r}: {error}") from structure
    _raise_first(outcomes, f"load from {str(root)!r}")
    return state


def _metadata_on_root(paths: list[str], root: Path) -> Any:
    """Group rank 0: the checked metadata, or the error text (different paths, no checkpoint, damaged)."""
    try:
        same_paths(paths)
        _swap.recover(root)
        return _layout.read_metadata(root)
    except Exception as exc:
        return str(exc) if isinstance(exc, (FileNotFoundError, ValueError)) else _fail(exc)


def metadata_of(pg: ProcessGroup, root: Path) -> dict[str, Any]:
    """Paths gathered to group rank 0, which reads and checks the metadata once; broadcast. Collective."""
    rank, size = pg.rank(), pg.size()
    paths: list[Any] = [None] * size if rank == 0 else []
    gather_object(str(root), paths if rank == 0 else None, group=pg, group_dst=0)
    box: list[Any] = [_metadata_on_root(paths, root) if rank == 0 else None]
    broadcast_object_list(box, group=pg, group_src=0)
    if isinstance(box[0], str):
        raise CheckpointError(f"load from {str(root)!r}: {box[0]}")
    return box[0]
