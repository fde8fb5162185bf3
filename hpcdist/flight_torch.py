"""``hpcdist debug export-torch DIR OUT``: hpcdist's flight recorder dumps in torch's dump format.

PyTorch's own analyzer, ``python -m torch.distributed.flight_recorder.fr_trace``
(``torchfrtrace``), reads one pickle per rank, as torch's NCCL flight recorder
writes them. :func:`export` reads hpcdist's dumps (``rank-<R>.json``, through
:func:`hpcdist.debug_analyze.load_dumps`, which names a damaged file) and writes
``hpcdist_trace_rank_<R>`` files that torch's loader reads (it infers the
prefix from the names). :func:`to_torch` converts one dump, without I/O.

The mapping (torch's key: what it holds here):

- ``version``: ``"2.10"``, the version torch 2.13's NCCL recorder writes (its
  analyzer takes its newest branches for it);
- ``pg_config``: each group of the dump: its name, its description, its
  global ranks (``"[0, 1, 2]"``); ``pg_status``: the group's last entered,
  started and completed collective sequence numbers;
- one entry per recorded operation, in the order they started on the rank:
  ``collective_seq_id`` is hpcdist's ``seq`` (numbered alike on every rank of
  the group), ``p2p_seq_id`` the point-to-point ``seq``; each entry carries
  the other counter's latest value, as torch's recorder does;
  ``op_id`` their sum; ``record_id`` the entry's position on the rank
  (plus the entries the rings overwrote); ``pg_id`` the group's index;
  ``time_created_ns`` and ``time_discovered_started_ns`` hpcdist's
  ``started_at``; ``time_discovered_completed_ns`` its ``completed_at``
  (object operations only; null otherwise); ``timeout_ms`` the group's
  timeout; ``is_p2p``, ``retired`` (completed);
- ``profiling_name``: ``<backend>:<op>`` with torch's names (:data:`TORCH_OPS`;
  ``all_gather_into_tensor`` is ``_all_gather_base``, ``reduce_scatter_tensor``
  ``_reduce_scatter_base``, ``all_to_all_single`` ``all_to_all``,
  ``all_reduce_coalesced`` ``allreduce_coalesced``; object
  collectives take the name of the collective torch runs them with), and for
  point-to-point the group ranks torch's ``Op`` parses: ``send 0->1`` (this rank
  to its peer), ``recv 1<-0``. The backend is the group's where torch's analyzer
  knows it (``nccl``, ``gloo``), else ``nccl`` (it refuses ``mpi``);
- ``state``: ``started`` and ``completed`` as recorded; ``failed`` (an async
  Work that raised: it never completed) is ``started``; ``unknown`` (an async
  Work dropped before anyone saw it finish) is ``scheduled``, torch's weakest
  state;
- ``input_dtypes``/``output_dtypes``: torch's scalar type names (``Float``,
  ``Long``, ...), one per size; none for object operations and ``barrier``.

What hpcdist does not record, and what is written instead:

- **shapes**: hpcdist records one element count per call. Sizes are 1-D
  shapes of counts: ``[[count]]`` for each side; the gathered side of
  ``all_gather``/``gather`` and the scattered side of
  ``reduce_scatter``/``scatter`` hold ``group size x count`` (at the root
  only for ``gather``/``scatter``: ``[]`` elsewhere), so torch's numel checks
  hold. ``all_to_all`` records the first chunk's count, ``all_to_all_single``
  the input's, on both sides (torch compares only their totals, equal here). Object
  operations and ``barrier`` record no count: ``[[0]]``.
- **roots**: torch's entries have none, and its analyzer does not compare
  them (a broadcast from different roots passes there; ``hpcdist debug
  analyze`` reports it).
- **stacks**: hpcdist keeps no stack per call. ``frames`` holds the main
  thread's stack at dump time (innermost first) on the rank's newest blocking
  call still in flight, when that stack is inside hpcdist (the call it is
  blocked in); every other entry has ``[]``.
- **left out**: receives from any source (torch's ``recv`` needs a peer),
  operations torch's analyzer does not know, and dumps of processes without a
  process group (``rank-pid<PID>.json``). :func:`to_torch` lists what it left
  out.
"""

from __future__ import annotations

import itertools
import os
import pickle
import re
from dataclasses import dataclass, field
from typing import Any

from .debug_analyze import load_dumps

__all__ = ["PREFIX", "TORCH_OPS", "TORCH_VERSION", "Export", "export", "to_torch", "traps"]

#: the dump format version written (torch 2.13's NCCL recorder writes "2.10")
TORCH_VERSION = "2.10"

#: the file name of rank R's export: ``PREFIX + str(R)``
PREFIX = "hpcdist_trace_rank_"

#: hpcdist's recorded op -> torch's operation type (the part of ``profiling_name`` after ``nccl:``)
TORCH_OPS: dict[str, str] = {
    "all_reduce": "all_reduce",
    "all_reduce_bucketed": "all_reduce",
    "all_reduce_coalesced": "allreduce_coalesced",
    "broadcast": "broadcast",
    "reduce": "reduce",
    "all_gather": "all_gather",
    "all_gather_into": "_all_gather_base",
    "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor": "_reduce_scatter_base",
    "gather": "gather",
    "scatter": "scatter",
    "all_to_all": "all_to_all",
    "all_to_all_single": "all_to_all",
    "barrier": "barrier",
    "broadcast_object_list": "broadcast",
    "all_gather_object": "all_gather",
    "gather_object": "gather",
    "scatter_object_list": "scatter",
    "send": "send",
    "isend": "send",
    "send_object_list": "send",
    "recv": "recv",
    "irecv": "recv",
    "recv_object_list": "recv",
}

#: torch's backends its analyzer accepts in ``profiling_name`` (of those hpcdist groups may name)
_BACKENDS = ("nccl", "gloo")

#: dtype name (numpy's, or torch's without ``torch.``) -> torch's scalar type name
_SCALAR: dict[str, str] = {
    "float64": "Double",
    "double": "Double",
    "float32": "Float",
    "float": "Float",
    "float16": "Half",
    "half": "Half",
    "bfloat16": "BFloat16",
    "int64": "Long",
    "long": "Long",
    "int32": "Int",
    "int": "Int",
    "int16": "Short",
    "short": "Short",
    "int8": "Char",
    "uint8": "Byte",
    "bool": "Bool",
    "complex64": "ComplexFloat",
    "complex128": "ComplexDouble",
    "uint16": "UInt16",
    "uint32": "UInt32",
    "uint64": "UInt64",
    "float8_e4m3fn": "Float8_e4m3fn",
    "float8_e5m2": "Float8_e5m2",
}

_STATE = {"started": "started", "completed": "completed", "failed": "started", "unknown": "scheduled"}

_FRAME = re.compile(r'^\s*File "(?P<filename>[^"]*)", line (?P<line>\d+), in (?P<name>.*)$')
_PACKAGE = os.path.dirname(os.path.abspath(__file__))


def _scalar(dtype: Any) -> str:
    name = str(dtype)
    name = name[6:] if name.startswith("torch.") else name
    return _SCALAR.get(name, name)


def _frames(stack: str) -> list[dict[str, str]]:
    """A ``traceback.format_list`` text as torch's frames (``name``, ``filename``, ``line``), innermost first."""
    out = []
    for line in stack.splitlines():
        m = _FRAME.match(line)
        if m:
            out.append({"name": m["name"], "filename": m["filename"], "line": m["line"]})
    return out[::-1]


def _sizes(op: str, entry: dict[str, Any], size: int, at_root: bool) -> tuple[list[list[int]], list[list[int]]]:
    """(input_sizes, output_sizes) of an entry: 1-D shapes of its element count (see the module docstring)."""
    count = int(entry.get("count") or 0)
    one, all_ = [[count]], [[count * size]]
    if op in ("all_gather", "_all_gather_base"):
        return one, all_
    if op in ("reduce_scatter", "_reduce_scatter_base"):
        return all_, one
    if op == "gather":
        return one, all_ if at_root else []
    if op == "scatter":
        return all_ if at_root else [], one
    return one, one


def _group_entries(
    group: dict[str, Any], pg_id: int, rank: int, backend: str, p2p: bool, skipped: list[str]
) -> list[tuple[float, dict[str, Any], dict[str, Any]]]:
    """(start time, torch entry, hpcdist entry) for each of ``group``'s entries torch can read."""
    name, desc = group["name"], group.get("desc") or "undefined"
    ranks = list(group["ranks"])
    local = {g: i for i, g in enumerate(sorted(ranks))}  # torch maps group ranks to global ones through sorted ranks
    me = local.get(rank, -1)
    size = len(ranks)
    entries = sorted(group["entries"], key=lambda e: (e["started_at"], e["p2p"], e["seq"]))
    colls = [e["seq"] for e in entries if not e["p2p"]]
    p2ps = [e["seq"] for e in entries if e["p2p"]]
    last_coll = min(colls) - 1 if colls else int(group["collectives"])
    last_p2p = min(p2ps) - 1 if p2ps else int(group["p2p_ops"])
    out = []
    for e in entries:
        op = TORCH_OPS.get(e["op"])
        if e["p2p"]:
            last_p2p = e["seq"]
        else:
            last_coll = e["seq"]
        where = f"{e['op']} ({'p2p' if e['p2p'] else 'collective'} #{e['seq']} on group {name!r})"
        if op is None:
            skipped.append(f"{where}: an operation torch's analyzer does not know")
            continue
        if e["p2p"] and not p2p:
            continue
        title = op
        if e["p2p"]:
            peer = local.get(e.get("peer"))
            if peer is None or me < 0:
                skipped.append(f"{where}: a receive from any source (torch's recv needs its peer)")
                continue
            title = f"send {me}->{peer}" if op == "send" else f"recv {me}<-{peer}"
        root = e.get("root")
        inputs, outputs = _sizes(op, e, size, root == rank)
        dtypes = [] if e.get("dtype") is None else [_scalar(e["dtype"])]
        state = _STATE.get(e["state"], "scheduled")
        started_ns = int(e["started_at"] * 1e9)
        done = e.get("completed_at")
        out.append(
            (
                e["started_at"],
                {
                    "record_id": 0,  # set once the rank's entries are merged
                    "pg_id": pg_id,
                    "process_group": (name, desc),
                    "collective_seq_id": last_coll,
                    "p2p_seq_id": last_p2p,
                    "op_id": last_coll + last_p2p,
                    "profiling_name": f"{backend}:{title}",
                    "time_created_ns": started_ns,
                    "input_sizes": inputs,
                    "input_dtypes": dtypes * len(inputs),
                    "output_sizes": outputs,
                    "output_dtypes": dtypes * len(outputs),
                    "state": state,
                    "time_discovered_started_ns": started_ns if state != "scheduled" else None,
                    "time_discovered_completed_ns": int(done * 1e9) if isinstance(done, (int, float)) else None,
                    "retired": state == "completed",
                    "timeout_ms": int(float(group.get("timeout_s") or 0) * 1000),
                    "is_p2p": bool(e["p2p"]),
                    "frames": [],
                },
                e,
            )
        )
    return out


def _pg_status(group: dict[str, Any]) -> dict[str, int]:
    colls = [e for e in group["entries"] if not e["p2p"]]
    started = [e["seq"] for e in colls if e["state"] != "unknown"]
    completed = [e["seq"] for e in colls if e["state"] == "completed"]
    return {
        "last_enqueued_collective": int(group["collectives"]),
        "last_started_collective": max(started, default=-1),
        "last_completed_collective": max(completed, default=-1),
    }


def to_torch(dump: dict[str, Any], p2p: bool = True) -> tuple[dict[str, Any], list[str]]:
    """One rank's hpcdist dump as the dict torch's NCCL flight recorder pickles, and what was left out.

    Args:
        dump: a dump as :func:`hpcdist.debug_analyze.load_dumps` returns it
            (format version 1, checked there).
        p2p: False leaves the point-to-point entries out (see :func:`traps`).

    Returns:
        ``(torch_dump, left_out)``: the dict (``version``, ``comm_lib_version``,
        ``pg_config``, ``pg_status``, ``entries``; see the module docstring for
        each field) and one line per entry not carried over, saying why.
    """
    from ._version import __version__

    rank = int(dump["rank"])
    skipped: list[str] = []
    merged: list[tuple[float, dict[str, Any], dict[str, Any]]] = []
    pg_config: dict[str, dict[str, str]] = {}
    pg_status: dict[str, dict[str, int]] = {}
    dropped = 0  # entries the rings overwrote: torch's record ids count every entry ever recorded
    for pg_id, group in enumerate(dump["groups"]):
        name = group["name"]
        backend = str(group.get("backend") or "")
        backend = backend if backend in _BACKENDS else "nccl"
        pg_config[name] = {"name": name, "desc": group.get("desc") or "undefined", "ranks": str(list(group["ranks"]))}
        pg_status[name] = _pg_status(group)
        dropped += max(0, int(group["collectives"]) - int(group["capacity"]))
        dropped += max(0, int(group["p2p_ops"]) - int(group["capacity"]))
        merged += _group_entries(group, pg_id, rank, backend, p2p, skipped)
    merged.sort(key=lambda item: item[0])
    entries = [t for _, t, _ in merged]
    for i, t in enumerate(entries):
        t["record_id"] = dropped + i
    in_flight = [t for t, (_, _, e) in zip(entries, merged) if e["state"] == "started" and not e.get("async")]
    stack = dump.get("stacks", {}).get("MainThread", "")
    frames = _frames(stack) if isinstance(stack, str) else []
    if in_flight and any(f["filename"].startswith(_PACKAGE + os.sep) for f in frames):
        in_flight[-1]["frames"] = frames
    return {
        "version": TORCH_VERSION,
        "comm_lib_version": f"hpcdist {dump.get('hpcdist', __version__)}",
        "pg_config": pg_config,
        "pg_status": pg_status,
        "entries": entries,
    }, skipped


def traps(dump: dict[str, Any]) -> list[str]:
    """Where torch's analyzer (2.13) stops on this rank's export: a collective and a point-to-point operation
    of one group that follow each other with the same sequence number (collective #N, then p2p #N, or the
    reverse).

    Its ``find_coalesced_group_with_non_p2p`` reads two such entries as one coalesced group and then raises
    ``AssertionError: can't get dst of non-p2p op``; torch's own NCCL traces number the two kinds the same
    way. ``hpcdist debug export-torch --no-p2p`` (``p2p=False``) avoids it.
    """
    out = []
    for group in dump["groups"]:
        entries = sorted(group["entries"], key=lambda e: (e["started_at"], e["p2p"], e["seq"]))
        for a, b in itertools.pairwise(entries):
            if a["p2p"] != b["p2p"] and a["seq"] == b["seq"]:
                first, then = ("p2p", "collective") if a["p2p"] else ("collective", "p2p")
                out.append(
                    f"rank {dump['rank']}, group {group['name']!r}: {first} #{a['seq']} ({a['op']}) "
                    f"then {then} #{b['seq']} ({b['op']})"
                )
    return out


@dataclass
class Export:
    """What :func:`export` wrote."""

    paths: list[str]  # one file per rank: out/hpcdist_trace_rank_<R>
    left_out: list[str] = field(default_factory=list)  # one line per entry not carried over ("rank R: ...")
    traps: list[str] = field(default_factory=list)  # where torch's analyzer will stop (:func:`traps`)


def export(directory: str, out: str, p2p: bool = True) -> Export:
    """Convert every rank's dump in ``directory`` into torch's format, one file per rank in ``out``.

    Args:
        directory: the flight recorder's dump directory (``rank-<R>.json``).
        out: a directory to create, or an empty one: torch's analyzer reads
            every file under it.
        p2p: False leaves the point-to-point entries out (see :func:`traps`).

    Returns:
        The files written, the entries not carried over and the places where
        torch's analyzer will stop (:class:`Export`).

    Raises:
        ValueError: no dumps, a damaged dump (named), dumps of different jobs,
            or ``out`` exists and is not an empty directory.
    """
    dumps = load_dumps(directory)
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        what = "a directory that is not empty" if os.path.isdir(out) else "a file"
        raise ValueError(
            f"{out!r} is {what}; torch's analyzer reads every file under its directory: name a new or empty directory"
        )
    os.makedirs(out, exist_ok=True)
    done = Export([])
    for rank in sorted(r for r in dumps if r >= 0):  # negative keys: processes without a process group
        data, skipped = to_torch(dumps[rank], p2p)
        done.left_out += [f"rank {rank}: {line}" for line in skipped]
        if p2p:
            done.traps += traps(dumps[rank])
        path = os.path.join(out, f"{PREFIX}{rank}")
        with open(path, "wb") as f:
            pickle.dump(data, f)
        done.paths.append(path)
    done.left_out += [
        f"process {dumps[r].get('pid', '?')}: its dump, of a process without a process group" for r in dumps if r < 0
    ]
    return done
