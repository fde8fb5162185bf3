"""Run pytest on every rank of an ``mpiexec`` launch.

Rank 0 prints to the terminal; every other rank writes to a log file that is
shown (on the terminal) only when that rank failed. The exit code is the worst
over all ranks. ``--junitxml=PATH`` is honoured by rank 0 only; a failure on
another rank shows through the exit code.
"""

from __future__ import annotations

import os
import sys
import tempfile

import pytest
from mpi4py import MPI


def main() -> int:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    args = ["--with-mpi", *sys.argv[1:]]
    log = None
    terminal = None
    if rank != 0:
        args = [a for a in args if not a.startswith("--junitxml")]
        log = tempfile.NamedTemporaryFile("w+", prefix=f"hpcdist-rank{rank}-", suffix=".log", delete=False)  # noqa: SIM115
        terminal = os.dup(2)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    rc = int(pytest.main(args))
    if rc == 5:  # no tests collected is not a failure here
        rc = 0
    codes = comm.allgather(rc)
    for r in range(1, size):  # one rank's log at a time, in rank order
        comm.Barrier()
        if r == rank and rc != 0 and log is not None and terminal is not None:
            sys.stdout.flush()
            log.flush()
            with open(log.name, "rb") as fh:
                text = fh.read()[-30000:]
            os.write(terminal, f"\n===== rank {rank} of {size} failed (rc={rc}) =====\n".encode() + text)
    if log is not None:
        log.close()
        os.unlink(log.name)
    if rank == 0 and any(codes):
        print(f"exit codes by rank: {codes}", flush=True)
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
