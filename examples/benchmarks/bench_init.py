"""Time to ``init_process_group`` for N processes started by multiprocessing (env://).

For each N, fresh processes are spawned; each imports its library, waits at a
barrier so that all start ``init_process_group`` together, and reports how
long the call took. A run's time is the slowest rank's; the table shows the
median over ``--repeat`` runs. hpcdist's time includes ``MPI_Init`` (mpi4py is
imported inside ``init_process_group``), the TCP store and the join over MPI
ports (``hpcdist-preinit``: the same with mpi4py imported, so MPI initialised,
before the clock starts); torch's is gloo's ``init_process_group`` (TCP store, gloo
connections). Each run ends with a check all_reduce (not timed).

``--phases`` adds a second table: where hpcdist's time goes, per phase, in
the ``hpcdist`` runs (slowest rank's phase, median over runs): ``MPI_Init``
(importing mpi4py.MPI), the TCP store (rank 0 serves it, the others
connect), the rank claim and arrival round trips through the store, the
connect/accept/merge rounds over MPI ports (``ceil(log2 N)``), and the rest
of ``init_process_group`` (communicator dup, node layout, torchrun variables).

Usage: python examples/benchmarks/bench_init.py [--sizes 2,4,8] [--repeat 3] [--lib hpcdist,torch] [--phases]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import platform
import queue
import statistics
import sys
import time
from datetime import date, timedelta

from hpcdist._launchenv import free_port as _free_port

CTX = mp.get_context("spawn")


def free_port() -> int:
    """A port for MASTER_PORT, below the ephemeral range (hpcdist._launchenv.free_port)."""
    return _free_port("127.0.0.1")


PHASES = ("MPI_Init", "store", "claim+arrival", "port rounds", "rest")


def timed(phases: dict[str, float], mod, name: str, phase: str) -> None:
    """Wrap ``mod.name`` so that the seconds spent in it add up under ``phase``."""
    fn = getattr(mod, name)

    def wrapper(*args, **kwargs):
        t0 = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            phases[phase] = phases.get(phase, 0.0) + time.perf_counter() - t0

    setattr(mod, name, wrapper)


def instrument(phases: dict[str, float]) -> None:
    """Time the phases of hpcdist's init_process_group (see the module docstring)."""
    import importlib

    handlers = importlib.import_module("hpcdist.rendezvous.handlers")
    ports = importlib.import_module("hpcdist.rendezvous.ports")
    join = importlib.import_module("hpcdist.rendezvous.join")
    timed(phases, handlers, "make_tcp_store", "store")
    timed(phases, ports, "_claim_rank", "claim+arrival")
    timed(phases, ports, "arrive", "claim+arrival")
    timed(phases, ports, "_merge_round", "port rounds")
    # MPI starts (mpi4py.MPI imported: library load + MPI_Init) between join_world's launcher check and its rendezvous
    detect, rendezvous = join.detect_launcher, join.rendezvous

    def detect_then_clock(*args, **kwargs):
        out = detect(*args, **kwargs)
        phases["_mpi_start"] = time.perf_counter()
        return out

    def clock_then_rendezvous(*args, **kwargs):
        phases["MPI_Init"] = time.perf_counter() - phases.pop("_mpi_start")
        return rendezvous(*args, **kwargs)

    join.detect_launcher, join.rendezvous = detect_then_clock, clock_then_rendezvous


def child(lib: str, rank: int, n: int, port: int, barrier, out) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(n), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    phases: dict[str, float] = {}
    try:
        if lib.startswith("hpcdist"):
            import numpy as np

            import hpcdist as dist

            if lib == "hpcdist-preinit":
                from hpcdist.rendezvous import mpi_env

                mpi_env.apply()  # the settings init_process_group would make, then MPI started before the clock
                from mpi4py import MPI  # noqa: F401
            else:
                instrument(phases)
            x = np.ones(1)
        else:
            import torch
            import torch.distributed as dist  # type: ignore[no-redef]

            x = torch.ones(1)
        barrier.wait(timeout=120)
        t0 = time.perf_counter()
        dist.init_process_group("gloo", timeout=timedelta(seconds=120))
        elapsed = time.perf_counter() - t0
        if phases:
            phases["rest"] = elapsed - sum(phases.values())
        dist.all_reduce(x)
        ok = float(x[0]) == n
        dist.destroy_process_group()
        out.put((rank, elapsed, ok, "", phases))
    except BaseException as exc:
        out.put((rank, float("nan"), False, f"{type(exc).__name__}: {exc}", {}))


def one_run(lib: str, n: int, limit: float) -> tuple[float, dict[str, float]]:
    """Seconds the slowest rank spent in init_process_group, and the slowest rank's time per phase."""
    out = CTX.Queue()
    barrier = CTX.Barrier(n)
    port = free_port()
    procs = [CTX.Process(target=child, args=(lib, r, n, port, barrier, out), daemon=True) for r in range(n)]
    for p in procs:
        p.start()
    times = []
    phases: dict[str, float] = {}
    try:
        for _ in range(n):
            rank, elapsed, ok, err, ph = out.get(timeout=limit)
            if not ok:
                raise RuntimeError(f"{lib} rank {rank} of {n}: {err or 'wrong all_reduce result'}")
            times.append(elapsed)
            for k, v in ph.items():
                phases[k] = max(phases.get(k, 0.0), v)
    except queue.Empty:
        raise RuntimeError(f"{lib} with {n} processes did not finish within {limit:g} s") from None
    finally:
        for p in procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
    return max(times), phases


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="2,4,8")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--lib", default="hpcdist,hpcdist-preinit,torch")
    ap.add_argument("--limit", type=float, default=180.0, help="seconds allowed per run")
    ap.add_argument("--phases", action="store_true", help="also print where hpcdist's time goes")
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
    per_phase: dict[int, dict[str, list[float]]] = {}
    for n in sizes:
        runs: dict[str, list[float]] = {lib: [] for lib in libs}
        per_phase[n] = {p: [] for p in PHASES}
        for _ in range(args.repeat):  # interleaved, so that load from elsewhere hits every library alike
            for lib in libs:
                elapsed, phases = one_run(lib, n, args.limit)
                runs[lib].append(elapsed)
                for p, v in phases.items():
                    per_phase[n][p].append(v)
        cells = [f"{1000 * statistics.median(r):.0f} ({1000 * min(r):.0f}-{1000 * max(r):.0f})" for r in runs.values()]
        print(f"| {n} | " + " | ".join(cells) + " |", flush=True)
    if args.phases and "hpcdist" in libs:
        print("\n# where hpcdist's time goes (ms; slowest rank per phase, median of the runs)")
        print("| processes | " + " | ".join(PHASES) + " |")
        print("|" + "---|" * (len(PHASES) + 1))
        for n in sizes:
            cells = [f"{1000 * statistics.median(v):.1f}" if v else "-" for v in per_phase[n].values()]
            print(f"| {n} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
