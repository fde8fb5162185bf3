"""What MIN/MAX of floats costs now that a NaN on any rank wins (docs/sharp-bits.md, "MIN and MAX with NaN").

A blocking float all_reduce with MAX first learns whether any rank holds a NaN (one more item on a small
call, a one-byte all-reduce before a larger one) and, where none does, lets MPI reduce the floats. This
prints, per size, hpcdist's float64 MAX beside raw mpi4py's ``Allreduce(MAX)`` on the same floats (which
can lose a NaN), hpcdist's int64 MAX (MPI's op alone: the plain lane) and, with ``--nan``, hpcdist's float64
MAX where one rank holds a NaN (the ordered keys), and ``torch.distributed``'s gloo MAX with ``--gloo``.

    mpiexec -n 2 python examples/benchmarks/bench_minmax.py [--sizes 1,1024,4096,8192,262144] [--nan] [--gloo]
"""

from __future__ import annotations

import argparse
import os
from typing import Any

import numpy as np
from _timing import iterations, per_call, vs_raw

import hpcdist as dist
from hpcdist._launchenv import free_port


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="1,1024,4096,8192,262144", help="float64 items per rank, comma-separated")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--nan", action="store_true", help="also time MAX with a NaN on the last rank")
    ap.add_argument("--gloo", action="store_true", help="also time torch.distributed's gloo MAX (needs torch)")
    args = ap.parse_args()
    dist.init_process_group("mpi")
    from mpi4py import MPI

    raw = MPI.COMM_WORLD.Dup()
    n, rank = dist.get_world_size(), dist.get_rank()
    gloo = None
    if args.gloo:
        import torch.distributed as tdist

        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(raw.bcast(free_port() if rank == 0 else None)))
        tdist.init_process_group("gloo", rank=rank, world_size=n)
        gloo = tdist
    header = (
        "| float64 items | raw mpi4py µs | hpcdist float MAX µs | added µs | raw / hpcdist | hpcdist int64 MAX µs |"
    )
    if args.nan:
        header += " hpcdist float MAX, a NaN on one rank µs |"
    if gloo is not None:
        header += " torch gloo MAX µs |"
    if rank == 0:
        wait, shm = os.environ.get("HPCDIST_WAIT", "block"), os.environ.get("HPCDIST_SHM", "auto")
        print(f"{n} ranks, HPCDIST_WAIT={wait}, HPCDIST_SHM={shm}\n")
        print(header)
        print("|" + "---|" * (header.count("|") - 1))
    for size in [int(s) for s in args.sizes.split(",")]:
        row = _row(size, raw, args.rounds, args.nan, gloo)
        if rank == 0:
            print(row, flush=True)
    if gloo is not None:
        gloo.destroy_process_group()
    raw.Free()
    dist.destroy_process_group()


def _row(size: int, raw: Any, rounds: int, nan: bool, gloo: Any) -> str:
    """One table row: the calls on ``size`` float64 (and int64) items per rank."""
    from mpi4py import MPI

    n, rank = dist.get_world_size(), dist.get_rank()
    MAX = dist.ReduceOp.MAX
    x, xi, y = np.ones(size), np.ones(size, np.int64), np.ones(size)
    iters = iterations(x.nbytes, 2000)

    def time_of(fn: Any) -> float:
        for _ in range(10):
            fn()
        return per_call(fn, iters, raw, rounds)

    def with_nan() -> None:
        y[:] = 1.0
        if rank == n - 1:
            y[-1] = np.nan
        dist.all_reduce(y, op=MAX)

    t_raw = time_of(lambda: raw.Allreduce(MPI.IN_PLACE, [x, MPI.DOUBLE], MPI.MAX))
    t_max = time_of(lambda: dist.all_reduce(x, op=MAX))
    t_int = time_of(lambda: dist.all_reduce(xi, op=MAX))
    row = f"| {size} | {t_raw * 1e6:.2f} |{vs_raw(t_max, t_raw)} {t_int * 1e6:.2f} |"
    if nan:
        row += f" {time_of(with_nan) * 1e6:.2f} |"
    if gloo is not None:
        import torch

        t = torch.ones(size, dtype=torch.float64)
        row += f" {time_of(lambda: gloo.all_reduce(t, op=gloo.ReduceOp.MAX)) * 1e6:.2f} |"
    return row


if __name__ == "__main__":
    main()
