"""Time to ``init_process_group`` for N processes started by multiprocessing (env://).

For each N, fresh processes are spawned; each imports its library, waits at a
barrier so that all start ``init_process_group`` together, and reports how
long the call took. A run's time is the slowest rank's; the table shows the
median over ``--repeat`` runs. hpcdist's time includes ``MPI_Init`` (mpi4py is
imported inside ``init_process_group``), the TCP store and the join over MPI
ports (``hpcdist-preinit``: the same with mpi4py imported, so MPI initialised,
before the clock starts); torch's is gloo's ``init_process_group`` (TCP store, gloo
connections). Each run ends with a check all_reduce (not timed).

Usage: python examples/benchmarks/bench_init.py [--sizes 2,4,8] [--repeat 3] [--lib hpcdist,torch]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import queue
import socket
import statistics
import sys
import time
from datetime import date, timedelta

CTX = mp.get_context("spawn")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def child(lib: str, rank: int, n: int, port: int, barrier, out) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    try:
        if lib.startswith("hpcdist"):
            import numpy as np

            import hpcdist as dist

            if lib == "hpcdist-preinit":
                from mpi4py import MPI  # noqa: F401  (MPI_Init before the clock starts)
            x = np.ones(1)
        else:
            import torch
            import torch.distributed as dist  # type: ignore[no-redef]

            x = torch.ones(1)
        barrier.wait(timeout=120)
        t0 = time.perf_counter()
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
        elapsed = time.perf_counter() - t0
        dist.all_reduce(x)
        ok = float(x[0]) == n
        dist.destroy_process_group()
        out.put((rank, elapsed, ok, ""))
    except BaseException as exc:
        out.put((rank, float("nan"), False, f"{type(exc).__name__}: {exc}"))


def one_run(lib: str, n: int, limit: float) -> float:
    """Seconds the slowest rank spent in init_process_group."""
    out = CTX.Queue()
    barrier = CTX.Barrier(n)
    port = free_port()
    procs = [CTX.Process(target=child, args=(lib, r, n, port, barrier, out), daemon=True) for r in range(n)]
    for p in procs:
        p.start()
    times = []
    try:
        for _ in range(n):
            rank, elapsed, ok, err = out.get(timeout=limit)
            if not ok:
                raise RuntimeError(f"{lib} rank {rank} of {n}: {err or 'wrong all_reduce result'}")
            times.append(elapsed)
    except queue.Empty:
        raise RuntimeError(f"{lib} with {n} processes did not finish within {limit:g} s") from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return max(times)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2,4,8")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--lib", default="hpcdist,hpcdist-preinit,torch")
    ap.add_argument("--limit", type=float, default=180.0, help="seconds allowed per run")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    libs = [s for s in args.lib.split(",") if s]
    if "torch" in libs:
        try:
            import torch.distributed  # noqa: F401
        except ImportError:
            libs.remove("torch")
    import mpi4py

    mpi4py.rc.initialize = False  # the version line only: no MPI_Init in this process
    from mpi4py import MPI

    print(f"# init_process_group, env://, multiprocessing spawn; {date.today()}")
    print(
        f"# {platform.node()}: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}"
    )
    print(
        f"# {MPI.Get_library_version().splitlines()[0].strip()}; median (min-max) of {args.repeat} runs, slowest rank per run"
    )
    header = "| processes | " + " | ".join(f"{lib} (ms)" for lib in libs) + " |"
    print(header)
    print("|" + "---|" * (len(libs) + 1))
    for n in sizes:
        runs: dict[str, list[float]] = {lib: [] for lib in libs}
        for _ in range(args.repeat):  # interleaved, so that load from elsewhere hits every library alike
            for lib in libs:
                runs[lib].append(one_run(lib, n, args.limit))
        cells = [f"{1000 * statistics.median(r):.0f} ({1000 * min(r):.0f}-{1000 * max(r):.0f})" for r in runs.values()]
        print(f"| {n} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
