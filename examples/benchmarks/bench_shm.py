"""The shared-memory tables of docs/benchmarks/shm.md: a thin wrapper of ``hpcdist bench``.

Run:  mpiexec -n 4 python examples/benchmarks/bench_shm.py [more hpcdist bench options]

Same as ``mpiexec -n 4 hpcdist bench --ops ... --sizes 4K:64M:4 --ranks 2,4 --table --csv shm.csv``:
every shared-memory collective at 2 and 4 ranks from 4 KiB to 64 MiB, hpcdist (auto path), forced
shared memory, raw mpi4py and gloo; ``--table`` prints the selection table's rows from the crossovers.
Add ``--table-file PATH`` to write them as a table file that ``HPCDIST_SHM_TABLE=PATH`` makes this
machine's groups use (docs/performance.md, "A table for your machine").
"""

from __future__ import annotations

import sys

from hpcdist.bench import main

DEFAULTS = [
    "--ops",
    "all_reduce,reduce,broadcast,all_gather_into_tensor,reduce_scatter_tensor,barrier",
    "--sizes",
    "4K:64M:4",
    "--ranks",
    "2,4",
    "--table",
    "--csv",
    "shm.csv",
]

if __name__ == "__main__":
    sys.exit(main(DEFAULTS + sys.argv[1:]))
