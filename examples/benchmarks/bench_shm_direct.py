"""Single-copy reads (``HPCDIST_SHM_DIRECT=1``) against the segment path and raw mpi4py: docs/benchmarks/shm.md.

Run:  mpiexec -n 2 python examples/benchmarks/bench_shm_direct.py [--ops all_reduce,broadcast] [--sizes 1M,4M]

First the bandwidth of one rank reading another's array with ``process_vm_readv`` (whole, and in
256 KiB calls) beside a local ``memcpy`` of the same size; then every collective three ways in one
process, interleaved round by round: raw mpi4py, hpcdist through the segment (``HPCDIST_SHM=1
HPCDIST_SHM_DIRECT=0``) and hpcdist with direct reads (``HPCDIST_SHM=1 HPCDIST_SHM_DIRECT=1``).
"""

from __future__ import annotations

import argparse
import functools
import os
import time
from collections.abc import Callable

import numpy as np
from _timing import iterations, per_call
from mpi4py import MPI

import hpcdist as dist
from hpcdist.backends.shm import cma
from hpcdist.bench import parse_sizes


def group(direct: str) -> object:
    os.environ.update(HPCDIST_SHM="1", HPCDIST_SHM_DIRECT=direct)
    g = dist.new_group()
    g.engine("cpu")  # built now, with the knobs above
    return g


def copy_bandwidth(comm: MPI.Comm, sizes: list[int]) -> None:
    """Rank 1 reads rank 0's array by address; GB/s of the whole read, of 256 KiB reads, of a local copy."""
    fn = cma._call()
    for nbytes in sizes:
        a = np.arange(nbytes // 8, dtype=np.int64)
        posted = comm.allgather((os.getpid(), a.ctypes.data))
        if comm.rank == 1 and fn is not None:
            res = _read_times(cma.Reader(fn, [p for p, _ in posted]), posted[0][1], a)
            print(f"    {nbytes / 2**20:6g} MiB  " + "  ".join(f"{nbytes / t / 1e9:6.2f} GB/s" for t in res))
        comm.Barrier()


def _read_times(rd: cma.Reader, addr: int, a: np.ndarray, step: int = 256 << 10) -> list[float]:
    """Best seconds of: reading rank 0's ``a`` (at ``addr``) whole, in ``step``-byte reads, a local copy."""
    dst = np.zeros_like(a)

    def whole() -> None:
        rd.read(0, addr, dst.ctypes.data, a.nbytes)

    def pieces() -> None:
        for lo in range(0, a.nbytes, step):
            rd.read(0, addr + lo, dst.ctypes.data + lo, min(step, a.nbytes - lo))

    res = [min(_timed(f) for _ in range(20)) for f in (whole, pieces, lambda: np.copyto(dst, a))]
    assert np.array_equal(dst, a)
    return res


def _timed(f: Callable[[], object]) -> float:
    t = time.perf_counter()
    f()
    return time.perf_counter() - t


def calls(op: str, nbytes: int, comm: MPI.Comm, groups: dict[str, object]) -> dict[str, Callable[[], object]]:
    n = comm.size
    x = np.ones(nbytes // 4, np.float32)
    big, small = np.ones(nbytes // 4, np.float32), np.ones(nbytes // 4 // n, np.float32)
    table = {
        "all_reduce": (lambda g: dist.all_reduce(x, group=g), lambda: comm.Allreduce(MPI.IN_PLACE, x)),
        "broadcast": (lambda g: dist.broadcast(x, 0, group=g), lambda: comm.Bcast(x, 0)),
        "all_gather": (lambda g: dist.all_gather_into_tensor(big, small, group=g), lambda: comm.Allgather(small, big)),
        "reduce_scatter": (
            lambda g: dist.reduce_scatter_tensor(small, big, group=g),
            lambda: comm.Reduce_scatter_block(big, small),
        ),
    }
    ours, raw = table[op]
    out: dict[str, Callable[[], object]] = {"raw": raw}
    for name, g in groups.items():
        out[name] = functools.partial(ours, g)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ops", default="all_reduce,reduce_scatter,broadcast,all_gather")
    ap.add_argument("--sizes", default="1M,4M,16M,64M")
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    dist.init_process_group("mpi")
    comm = MPI.COMM_WORLD
    sizes = parse_sizes(args.sizes)
    if comm.rank == 1:
        print("process_vm_readv (whole), (256 KiB calls), memcpy (local):")
    if comm.size >= 2:
        copy_bandwidth(comm, sizes)
    groups = {"segment": group("0"), "direct": group("1")}
    if comm.rank == 0:
        print(f"\n{'op':15s} {'size':>8s} {'raw µs':>9s} {'segment µs (raw/x)':>21s} {'direct µs (raw/x)':>21s}")
    for op in args.ops.split(","):
        for nbytes in sizes:
            fns = calls(op, nbytes, comm, groups)
            iters = iterations(nbytes, 200)
            best = {k: float("inf") for k in fns}
            for _ in range(args.rounds):  # interleaved: a change of the machine's speed hits every column
                for k, f in fns.items():
                    best[k] = min(best[k], per_call(f, iters, comm))
            if comm.rank == 0:
                cols = "".join(f"{best[k] * 1e6:12.1f} ({best['raw'] / best[k]:.2f}x)" for k in groups)
                print(f"{op:15s} {nbytes / 2**20:7g}M {best['raw'] * 1e6:9.1f} {cols}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
