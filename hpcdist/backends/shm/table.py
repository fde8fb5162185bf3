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

**Oversubscribed nodes.** Where more ranks share the node than it has CPUs,
the table does not apply: MPI's waits spin, and the spinning ranks take the
CPUs from the ones with work (on the 2-CPU machine below, 4 ranks: a 64 KiB
all_reduce took 24 ms through MPI, 80 µs through shared memory, whose waits
give the CPU away), so every operation of the engine takes the shared-memory
path at every size (:func:`window`'s ``oversubscribed``).
"""

from __future__ import annotations

__all__ = ["DATE", "MACHINE", "NEVER", "OPS", "TABLE", "describe", "window"]

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


def window(op: str, nranks: int, mode: str = "auto", oversubscribed: bool = False) -> tuple[int, int]:
    """The ``[lo, hi)`` byte range in which ``op`` on ``nranks`` ranks takes the shared-memory path.

    ``mode``: ``auto`` (the table), ``on`` (always) or ``off`` (never);
    ``oversubscribed``: the node has more ranks than CPUs (always, in ``auto``).
    """
    if mode == "on":
        return ALWAYS
    if mode == "off" or nranks < 2:
        return NEVER
    if oversubscribed and op in OPS:
        return ALWAYS
    rows = TABLE.get(op)
    if not rows:
        return NEVER
    sizes = sorted(rows)
    for s in sizes:
        if s >= nranks:
            return rows[s]
    return rows[sizes[-1]]


def _size(n: int) -> str:
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f} {unit}"
    return f"{n} B"


def describe(op: str, nranks: int, mode: str = "auto", oversubscribed: bool = False) -> str:
    """Which path ``op`` takes on ``nranks`` ranks of one node, in words (for ``hpcdist info``)."""
    lo, hi = window(op, nranks, mode, oversubscribed)
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
