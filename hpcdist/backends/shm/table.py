"""Which path runs: the measured selection table of the shared-memory engine.

For each operation and group size, the table holds the byte range
``[lo, hi)`` of the call's size (as ``hpcdist bench`` and nccl-tests count
it: the gathered output of all_gather, the input of reduce_scatter, the
array of the others) in which the shared-memory path beat raw
MPI on the machine below; outside it the group's MPI engine runs. A group
size missing from an operation's rows uses the next larger listed size (the
largest for bigger groups). ``HPCDIST_SHM=1`` runs the shared-memory path at
every size, ``HPCDIST_SHM=0`` never.

Regenerate with ``hpcdist bench --table`` on the target machine (it prints
this table's rows from the measured crossovers) and paste them here.

**A table of one's own machine.** ``hpcdist bench --table-file PATH`` writes
the measured crossovers to a JSON file (:func:`dumps`); ``HPCDIST_SHM_TABLE=PATH``
makes every group's engine take its rows instead of the built-in ones, per
operation (an operation the file lacks keeps its built-in rows). The file is
read when a group's host engine is built (:func:`active`), checked whole, and
a wrong one raises ValueError naming the variable, the file and what is
wrong. Every rank of a node must name the same file: the ranks compare their
selections when their segment is set up and raise alike where they differ.

**Oversubscribed nodes.** Where more ranks share the node than it has CPUs,
the table does not apply: MPI's waits spin, and the spinning ranks take the
CPUs from the ones with work (on the 2-CPU machine below, 4 ranks: a 64 KiB
all_reduce took 24 ms through MPI, 80 µs through shared memory, whose waits
give the CPU away), so every operation of the engine takes the shared-memory
path at every size (:func:`window`'s ``oversubscribed``).
"""

from __future__ import annotations

import json
import os
from typing import Any, NamedTuple

__all__ = [
    "BUILTIN", "DATE", "FORMAT", "MACHINE", "NEVER", "OPS", "TABLE", "Selection", "active", "describe", "dumps", "load",
    "window",
]  # fmt: skip

INF = 1 << 62
NEVER = (INF, INF)
ALWAYS = (0, INF)

#: the operations the shared-memory engine implements
OPS = (
    "all_reduce",
    "reduce",
    "broadcast",
    "all_gather",
    "all_gather_into_tensor",
    "reduce_scatter",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "barrier",
)

MACHINE = (
    "2-core AMD EPYC VM (x86_64, Zen 4, 2 MiB L2 per core, 32 MiB L3), Linux 6.18, MPICH 4.3.2 (mpich wheel), NumPy 2.4"
)
DATE = "2026-11-24 (hpcdist bench --passes 4, best of 12 rounds; docs/benchmarks/shm.md)"

#: op -> {group size: (lo, hi) bytes where shared memory runs}. The 4-rank rows repeat the 2-rank ones: on
#: the machine above 4 ranks oversubscribe the 2 CPUs, where the oversubscription rule (module docstring)
#: sends everything to shared memory anyway; on a node with a CPU per rank the 2-rank crossovers are the guess.
TABLE: dict[str, dict[int, tuple[int, int]]] = {
    # 256 KiB measured 1.03x raw in the fast spell of 2026-11-24 and 0.74-0.81x in two slow spells of 2026-11-25,
    # 512 KiB 1.02x in a slow spell: from 512 KiB
    "all_reduce": {2: (512 << 10, INF), 4: (512 << 10, INF)},
    "reduce": {2: (256 << 10, INF), 4: (256 << 10, INF)},
    "broadcast": {2: (1 << 20, INF), 4: (1 << 20, INF)},
    # 2026-11-24 put the crossover at 4 MiB (1.03x); 2026-11-25 (a slow spell) measured 0.80x at 4 MiB, 0.99x at
    # 16 MiB, 1.08x at 64 MiB: from 16 MiB, where both runs had shared memory at least even
    "all_gather": {2: (16 << 20, INF), 4: (16 << 20, INF)},
    "all_gather_into_tensor": {2: (16 << 20, INF), 4: (16 << 20, INF)},
    "reduce_scatter": {2: (256 << 10, INF), 4: (256 << 10, INF)},
    "reduce_scatter_tensor": {2: (256 << 10, INF), 4: (256 << 10, INF)},
    # 0.6-0.8x raw MPI at every size measured (MPI_Alltoall moves each block once); HPCDIST_SHM=1 forces it
    "all_to_all_single": {2: NEVER, 4: NEVER},
    "barrier": {2: NEVER, 4: NEVER},
}


Rows = dict[str, dict[int, tuple[int, int]]]


class Selection(NamedTuple):
    """A selection table: its rows (``op -> {group size: (lo, hi)}``), the machine and date it was measured on,
    and where it came from (``"built in"`` or a file's path)."""

    rows: Rows
    machine: str
    date: str
    source: str

    def label(self) -> str:
        """Where the table came from, in words (``hpcdist info``, ``hpcdist bench``'s header)."""
        where = "" if self.source == BUILTIN_SOURCE else f" (HPCDIST_SHM_TABLE={self.source})"
        return f"{self.machine}; {self.date}{where}"


BUILTIN_SOURCE = "built in"


BUILTIN = Selection(TABLE, MACHINE, DATE, BUILTIN_SOURCE)

#: the ``format`` of a table file (``hpcdist bench --table-file``)
FORMAT = "hpcdist-shm-table/1"

#: path -> ((mtime_ns, size), the file's Selection): a file is parsed once per change, not per group
_LOADED: dict[str, tuple[tuple[int, int], Selection]] = {}


def active(mode: str = "auto") -> Selection:
    """The table that groups built now in ``mode`` (``HPCDIST_SHM``'s) use: in ``auto``, ``HPCDIST_SHM_TABLE``'s
    file (read once per change of it); elsewhere, or without the variable, :data:`BUILTIN` (the file is read, and
    checked, only where it applies). ValueError (naming the variable and the file) for a file missing or wrong."""
    from ... import config

    path = config.shm_table_path() if mode == "auto" else None
    if path is None:
        return BUILTIN
    try:
        st = os.stat(path)
    except OSError as exc:
        raise ValueError(
            f"environment variable HPCDIST_SHM_TABLE must name a table file written by hpcdist bench --table-file, "
            f"got {path!r}: {exc.strerror or exc}"
        ) from None
    stamp = (st.st_mtime_ns, st.st_size)
    hit = _LOADED.get(path)
    if hit is None or hit[0] != stamp:
        hit = _LOADED[path] = (stamp, load(path))
    return hit[1]


def load(path: str) -> Selection:
    """The selection table in the JSON file ``path`` (:func:`dumps`' format), its operations' rows replacing the
    built-in ones. ValueError naming ``HPCDIST_SHM_TABLE``, the file and the first thing wrong in it."""

    def bad(what: str) -> ValueError:
        return ValueError(f"HPCDIST_SHM_TABLE={path!r}: {what}")

    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except OSError as exc:
        raise bad(f"cannot read it: {exc.strerror or exc}") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise bad(
            f"expected a JSON table written by hpcdist bench --table-file, got a file that is not JSON ({exc})"
        ) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        got = doc.get("format") if isinstance(doc, dict) else type(doc).__name__
        raise bad(f"expected a table of format {FORMAT!r} (hpcdist bench --table-file), got format {got!r}")
    machine, date, ops = doc.get("machine"), doc.get("date", ""), doc.get("ops")
    if not isinstance(machine, str) or not machine.strip():
        raise bad(f"expected 'machine': the machine it was measured on, as text, got {machine!r}")
    if not isinstance(date, str):
        raise bad(f"expected 'date' as text, got {date!r}")
    if not isinstance(ops, dict) or not ops:
        raise bad(f"expected 'ops': an object of operation -> rows, got {ops!r}")
    rows: Rows = dict(TABLE)
    for op, per in ops.items():
        if op not in OPS:
            raise bad(f"expected operations among {', '.join(OPS)}, got {op!r}")
        if not isinstance(per, dict) or not per:
            raise bad(f"{op}: expected an object of group size -> range, got {per!r}")
        rows[op] = {_group_size(k, op, bad): _range(v, op, k, bad) for k, v in per.items()}
    return Selection(rows, machine.strip(), date, path)


def _group_size(key: str, op: str, bad: Any) -> int:
    if not (key.isdigit() and int(key) >= 2):
        raise bad(f"{op}: expected group sizes of 2 or more, got {key!r}")
    return int(key)


def _range(value: Any, op: str, key: str, bad: Any) -> tuple[int, int]:
    """``"never"``, ``"always"`` or ``[lo, hi]`` (``hi`` null: no end) -> ``(lo, hi)`` bytes."""
    if value == "never":
        return NEVER
    if value == "always":
        return ALWAYS
    if isinstance(value, list) and len(value) == 2:
        lo, hi = value[0], INF if value[1] is None else value[1]
        if all(type(x) is int for x in (lo, hi)) and 0 <= lo <= hi:
            return (lo, hi)
    raise bad(
        f'{op}, {key} ranks: expected "never", "always" or [lo, hi] bytes (0 <= lo <= hi, hi null for no end), '
        f"got {json.dumps(value)}"
    )


def dumps(rows: Rows, machine: str, date: str) -> str:
    """A table file (JSON, :data:`FORMAT`) of ``rows`` for ``HPCDIST_SHM_TABLE``."""

    def one(r: tuple[int, int]) -> Any:
        if r == NEVER or r[0] >= r[1]:
            return "never"
        return "always" if r == ALWAYS else [r[0], None if r[1] >= INF else r[1]]

    head = {"format": FORMAT, "machine": machine, "date": date}
    lines = [f" {json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
    ops = [
        f"  {json.dumps(op)}: {json.dumps({str(k): one(v) for k, v in sorted(per.items())})}"
        for op, per in rows.items()
    ]
    return "{\n" + "\n".join(lines) + '\n "ops": {\n' + ",\n".join(ops) + "\n }\n}\n"  # an op per line


def window(
    op: str, nranks: int, mode: str = "auto", oversubscribed: bool = False, rows: Rows | None = None
) -> tuple[int, int]:
    """The ``[lo, hi)`` byte range in which ``op`` on ``nranks`` ranks takes the shared-memory path.

    ``mode``: ``auto`` (the table), ``on`` (always) or ``off`` (never);
    ``oversubscribed``: the node has more ranks than CPUs (always, in ``auto``);
    ``rows``: the table's (default: the built-in :data:`TABLE`).
    """
    if mode == "on":
        return ALWAYS
    if mode == "off" or nranks < 2:
        return NEVER
    if oversubscribed and op in OPS:
        return ALWAYS
    per = (TABLE if rows is None else rows).get(op)
    if not per:
        return NEVER
    sizes = sorted(per)
    for s in sizes:
        if s >= nranks:
            return per[s]
    return per[sizes[-1]]


def _size(n: int) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"


def describe(op: str, nranks: int, mode: str = "auto", oversubscribed: bool = False, rows: Rows | None = None) -> str:
    """Which path ``op`` takes on ``nranks`` ranks of one node, in words (for ``hpcdist info``)."""
    lo, hi = window(op, nranks, mode, oversubscribed, rows)
    if lo >= hi:
        return "mpi"
    parts = []
    if lo > 0:
        parts.append(f"mpi below {_size(lo)}")
    parts.append(
        "shm" if lo == 0 and hi >= INF else f"shm from {_size(lo)}" if hi >= INF else f"shm {_size(lo)}-{_size(hi)}"
    )
    if hi < INF:
        parts.append(f"mpi from {_size(hi)}")
    return ", ".join(parts)
