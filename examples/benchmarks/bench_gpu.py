"""hpcdist vs raw ``cupy.cuda.nccl`` and vs raw mpi4py, all_reduce(SUM) of float32 CuPy buffers.

Prints one table, 4 B to 256 MiB: time per call (median of repeats), bus
bandwidth (2(n-1)/n x bytes / time) and hpcdist's ratio to the raw binding.
The MPI columns use device pointers when the MPI is CUDA-aware, else the
raw baseline stages through a pinned host buffer by hand (as hpcdist does).

    mpiexec -n 2 python examples/benchmarks/bench_gpu.py [--max-mib 256] [--repeats 5]

Exits 0 with a message where there is no GPU or no CuPy.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from typing import Any


def _gpu_problem() -> str | None:
    try:
        import cupy
    except Exception as exc:
        return f"CuPy is not importable ({type(exc).__name__})"
    try:
        if cupy.cuda.runtime.getDeviceCount() == 0:
            return "no CUDA device"
    except Exception as exc:
        return f"no CUDA device ({type(exc).__name__})"
    return None


def _time(fn: Any, sync: Any, iters: int, repeats: int, comm: Any) -> float:
    """Median over repeats of the per-call time, the slowest rank's."""
    fn()
    sync()
    out = []
    for _ in range(repeats):
        comm.Barrier()
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        dt = (time.perf_counter() - t0) / iters
        out.append(comm.allreduce(dt, op=_max()))
    return statistics.median(out)


def _max() -> Any:
    from mpi4py import MPI

    return MPI.MAX


def _us(row: dict[str, float], key: str) -> str:
    return f"{row[key] * 1e6:.1f}" if key in row else "-"


def _ratio(row: dict[str, float], raw: str, ours: str) -> str:
    """raw time / hpcdist time: 1.0 is parity, above 0.95 is the target from 1 MiB."""
    return f"{row[raw] / row[ours]:.2f}" if raw in row and ours in row else "-"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-mib", type=int, default=256)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    why = _gpu_problem()
    if why is not None:
        print(f"bench_gpu: skipped, {why}: nothing to measure on this machine")
        return 0
    import cupy as cp
    from mpi4py import MPI

    import hpcdist as dist
    from hpcdist.backends import is_backend_available
    from hpcdist.gpu import cuda_aware_mpi, set_device_for_local_rank
    from hpcdist.topology import split_shared

    comm = MPI.COMM_WORLD
    rank, n = comm.Get_rank(), comm.Get_size()
    node = split_shared(comm, 60.0, "bench_gpu setup", "every rank runs this script")  # ranks on this node
    one_gpu_each = comm.allreduce(int(node.Get_size() <= cp.cuda.runtime.getDeviceCount()), op=MPI.MIN) == 1
    node.Free()
    use_nccl = is_backend_available("nccl") and one_gpu_each  # NCCL refuses two ranks on one GPU
    dist.init_process_group("cpu:mpi,cuda:nccl" if use_nccl else "mpi")
    dev = set_device_for_local_rank()
    aware = cuda_aware_mpi()
    mpi_pg = dist.new_group(backend="mpi")  # device arrays over MPI (CUDA-aware or staged)
    stream = cp.cuda.get_current_stream()
    nccl_raw = None
    if use_nccl:
        from cupy.cuda import nccl

        uid = comm.bcast(nccl.get_unique_id() if rank == 0 else None, root=0)
        nccl_raw = nccl.NcclCommunicator(n, uid, rank)
    pinned = cp.cuda.alloc_pinned_memory(args.max_mib << 20)
    import numpy as np

    host = np.frombuffer(pinned, np.float32, (args.max_mib << 20) // 4)
    if rank == 0:
        print(
            f"# {n} rank(s), GPU {cp.cuda.runtime.getDeviceProperties(dev)['name'].decode()}, "
            f"{MPI.Get_library_version().splitlines()[0]}; CUDA-aware MPI: {aware.enabled} ({aware.reason})"
        )
        print(
            f"{'bytes':>11} | {'raw nccl us':>11} {'hpcdist':>9} {'ratio':>6} {'busBW GB/s':>10} | "
            f"{'raw mpi us':>10} {'hpcdist':>9} {'ratio':>6}"
        )
    nbytes = 4
    while nbytes <= args.max_mib << 20:
        count = nbytes // 4
        x = cp.ones(count, dtype=cp.float32)
        iters = max(3, min(200, (64 << 20) // nbytes))
        row: dict[str, float] = {}
        if nccl_raw is not None:
            row["raw_nccl"] = _time(
                lambda x=x, c=count: nccl_raw.allReduce(
                    x.data.ptr, x.data.ptr, c, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr
                ),
                stream.synchronize,
                iters,
                args.repeats,
                comm,
            )
            row["hp_nccl"] = _time(lambda x=x: dist.all_reduce(x), stream.synchronize, iters, args.repeats, comm)
        h = host[:count]
        if aware.enabled:

            def raw_mpi(x: Any = x) -> None:
                stream.synchronize()
                comm.Allreduce(MPI.IN_PLACE, [x, MPI.FLOAT])
        else:

            def raw_mpi(x: Any = x, h: Any = h) -> None:
                x.get(out=h, stream=stream)
                comm.Allreduce(MPI.IN_PLACE, [h, MPI.FLOAT])
                x.set(h, stream=stream)
                stream.synchronize()

        row["raw_mpi"] = _time(raw_mpi, stream.synchronize, iters, args.repeats, comm)
        row["hp_mpi"] = _time(
            lambda x=x: dist.all_reduce(x, group=mpi_pg), stream.synchronize, iters, args.repeats, comm
        )
        if rank == 0:
            bw = f"{2 * (n - 1) / n * nbytes / row['hp_nccl'] / 1e9:.1f}" if "hp_nccl" in row and n > 1 else "-"
            print(
                f"{nbytes:>11} | {_us(row, 'raw_nccl'):>11} {_us(row, 'hp_nccl'):>9} "
                f"{_ratio(row, 'raw_nccl', 'hp_nccl'):>6} {bw:>10} | {_us(row, 'raw_mpi'):>10} "
                f"{_us(row, 'hp_mpi'):>9} {_ratio(row, 'raw_mpi', 'hp_mpi'):>6}",
                flush=True,
            )
        nbytes *= 4
    if nccl_raw is not None:
        nccl_raw.destroy()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
