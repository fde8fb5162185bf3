"""Where a small blocking ``hpcdist.all_reduce`` of a CuPy array spends its time, on NCCL and on staged MPI.

Run (one GPU is enough):  python examples/benchmarks/profile_gpu_path.py [--iters N] [--bytes B]

For a float32 CuPy array of ``--bytes`` bytes (SUM) it prints, per path:

* the time per call of the raw binding (``cupy.cuda.nccl`` allReduce; for
  staged MPI the hand-written copy down, ``Allreduce``, copy up) and of
  ``hpcdist.all_reduce``, each the best of 20 rounds of ``--iters`` calls
  followed by a stream sync, and their difference (what hpcdist adds);
* a cProfile of ``--iters`` hpcdist calls: the functions with the most time of
  their own (cProfile's own cost inflates them; read them as shares, not as
  times).

Exits 0 with a message where there is no GPU or no CuPy.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections.abc import Callable


def _best(fn: Callable[[], object], sync: Callable[[], object], iters: int, rounds: int = 20) -> float:
    """Seconds per call: the best of ``rounds`` rounds of ``iters`` calls and a sync."""
    fn()
    sync()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.perf_counter()
        for _ in range(iters):
            fn()
        sync()
        best = min(best, (time.perf_counter() - t0) / iters)
    return best


def _profile(fn: Callable[[], object], iters: int, top: int) -> str:
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(iters):
        fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return "\n".join(line for line in out.getvalue().splitlines() if line.strip())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--bytes", type=int, default=4096)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args()
    try:
        import cupy as cp

        if cp.cuda.runtime.getDeviceCount() == 0:
            raise RuntimeError("no CUDA device")
    except Exception as exc:
        print(f"profile_gpu_path: skipped, no GPU or no CuPy ({type(exc).__name__}: {exc})")
        return 0
    import numpy as np
    from mpi4py import MPI

    import hpcdist as dist
    from hpcdist.backends import is_backend_available

    use_nccl = is_backend_available("nccl") and MPI.COMM_WORLD.Get_size() == 1
    dist.init_process_group("cpu:mpi,cuda:nccl" if use_nccl else "mpi")
    mpi_pg = dist.new_group(backend="mpi")
    stream = cp.cuda.get_current_stream()
    count = max(1, args.bytes // 4)
    x = cp.ones(count, dtype=cp.float32)
    rows: list[tuple[str, float, float, str]] = []
    if use_nccl:
        from cupy.cuda import nccl

        raw = nccl.NcclCommunicator(1, nccl.get_unique_id(), 0)
        t_raw = _best(
            lambda: raw.allReduce(x.data.ptr, x.data.ptr, count, nccl.NCCL_FLOAT32, nccl.NCCL_SUM, stream.ptr),
            stream.synchronize,
            args.iters,
        )
        t_ours = _best(lambda: dist.all_reduce(x), stream.synchronize, args.iters)
        rows.append(("nccl", t_raw, t_ours, _profile(lambda: dist.all_reduce(x), args.iters, args.top)))
    comm = MPI.COMM_WORLD.Dup()
    host = np.frombuffer(cp.cuda.alloc_pinned_memory(x.nbytes), np.float32, count)

    def raw_staged() -> None:
        x.get(out=host, stream=stream)
        comm.Allreduce(MPI.IN_PLACE, [host, MPI.FLOAT])
        x.set(host, stream=stream)
        stream.synchronize()

    t_raw = _best(raw_staged, stream.synchronize, args.iters)
    t_ours = _best(lambda: dist.all_reduce(x, group=mpi_pg), stream.synchronize, args.iters)
    prof = _profile(lambda: dist.all_reduce(x, group=mpi_pg), args.iters, args.top)
    rows.append(("staged mpi", t_raw, t_ours, prof))
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(f"# all_reduce SUM of {x.nbytes} B float32 CuPy, {MPI.COMM_WORLD.Get_size()} rank(s), best of 20")
        print("| path | raw us | hpcdist us | added us |\n|---|---|---|---|")
        for name, r, o, _ in rows:
            print(f"| {name} | {r * 1e6:.1f} | {o * 1e6:.1f} | {(o - r) * 1e6:+.1f} |")
        for name, _, _, p in rows:
            print(f"\n## cProfile, {name}, {args.iters} calls\n{p}")
    comm.Free()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
