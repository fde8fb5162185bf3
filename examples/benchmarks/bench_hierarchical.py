"""Hierarchical vs flat all_reduce on the simulated multi-node cluster (scripts/cluster-up).

Starts ``--nodes`` x ``--per-node`` ranks, each on its node of the cluster
(``scripts/cluster-exec``), joined without a launcher through ``env://``
over MPI on TCP (``UCX_TLS=tcp,self``: MPI crosses the namespaces through the
kernel's TCP stack, as between hosts). For each size it times, in one run and
interleaved: raw mpi4py ``Allreduce`` on the group's communicator, hpcdist's
flat MPI path (``HPCDIST_HIER=0``) and the hierarchical path
(``HPCDIST_HIER=1``), float32 SUM, blocking. A time is the slowest rank's
mean over the iterations; the table shows the best of ``--repeat`` such
measurements and the hierarchical path's speed-up over the flat one.

Usage (as root; the cluster must be up):
    scripts/cluster-up 2
    python examples/benchmarks/bench_hierarchical.py [--sizes 4K,64K,1M,4M,16M,64M] [--repeat 5]
    scripts/cluster-down
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from datetime import date, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_size(text: str) -> int:
    text = text.strip().upper().rstrip("B").rstrip("I")
    if text and text[-1] in UNITS:
        return int(float(text[:-1]) * UNITS[text[-1]])
    return int(text)


def fmt_size(n: int) -> str:
    for unit, mult in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= mult:
            return f"{n / mult:g} {unit}"
    return f"{n} B"


# ---------------------------------------------------------------------------------------- one rank


def rank_main(sizes: list[int], repeat: int) -> None:
    import numpy as np
    from mpi4py import MPI

    import hpcdist as dist

    os.environ["HPCDIST_HIER"] = "1"
    os.environ["HPCDIST_HIER_ALGO"] = "auto"
    dist.init_process_group("mpi", timeout=timedelta(seconds=300))
    hier = dist.group.WORLD
    hier.engine("cpu")  # engines are built on first use and read HPCDIST_HIER(_ALGO) then: build this one now
    everyone = list(range(dist.get_world_size()))
    os.environ["HPCDIST_HIER_ALGO"] = "leaders"
    leaders = dist.new_group(everyone)
    leaders.engine("cpu")
    os.environ["HPCDIST_HIER"] = "0"
    flat = dist.new_group(everyone)
    flat.engine("cpu")
    engines = [g.engine("cpu") for g in (hier, leaders, flat)]
    got = [(type(e).__name__, getattr(e, "algorithm", None)) for e in engines]
    want = [("HierarchicalEngine", "auto"), ("HierarchicalEngine", "leaders")]
    if got[:2] != want or got[2][0] == "HierarchicalEngine":
        raise SystemExit(f"expected the hierarchical engine (auto, then leaders) and a flat one, got {got}")
    comm = hier.comm
    n = comm.Get_size()
    rows = []
    for nbytes in sizes:
        x = np.ones(max(1, nbytes // 4), dtype=np.float32)
        iters = max(5, min(200, (64 << 20) // max(nbytes, 1) // 4))

        cases = {
            "mpi4py": lambda x=x: comm.Allreduce(MPI.IN_PLACE, [x, MPI.FLOAT], MPI.SUM),
            "flat": lambda x=x: dist.all_reduce(x, group=flat),
            "hier": lambda x=x: dist.all_reduce(x, group=hier),
            "leaders": lambda x=x: dist.all_reduce(x, group=leaders),
        }
        times: dict[str, list[float]] = {k: [] for k in cases}
        for fn in cases.values():  # warm up: engines, topology, connections
            fn()
        for _ in range(repeat):
            for name, fn in cases.items():
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    fn()
                dt = (time.perf_counter() - t0) / iters
                times[name].append(comm.allreduce(dt, op=MPI.MAX))
        for g in (hier, leaders):
            x[:] = 1
            dist.all_reduce(x, group=g)
            if not np.all(x == n):
                raise SystemExit(f"wrong hierarchical result at {nbytes} bytes")
        rows.append({"bytes": x.nbytes, **{k: min(v) for k, v in times.items()}})
    dist.destroy_process_group()
    if int(os.environ["RANK"]) == 0:
        print("RESULT " + json.dumps(rows), flush=True)


# ---------------------------------------------------------------------------------------- driver


def _shared_cpus_env(world: int) -> dict[str, str]:
    """The simulated nodes share this host's CPUs: with more ranks than CPUs, MPICH's waits must yield the CPU.

    hpcdist sets this itself where it can tell (hpcdist/rendezvous/mpi_env.py), but each simulated node
    sees all of the host's CPUs and only its own ranks, so it cannot; a real node has CPUs of its own.
    Both paths measured here run in the same processes, with the same setting.
    """
    if world > (os.cpu_count() or 1) and "MPIR_CVAR_ENABLE_HEAVY_YIELD" not in os.environ:
        return {"MPIR_CVAR_ENABLE_HEAVY_YIELD": "1"}
    return {}


def launch(args: argparse.Namespace) -> list[dict]:
    nodes, per = args.nodes, args.per_node
    world = nodes * per
    procs = []
    for rank in range(world):
        node = f"node{rank // per + 1}"
        env = dict(
            os.environ,
            RANK=str(rank),
            WORLD_SIZE=str(world),
            MASTER_ADDR="10.77.0.1",
            MASTER_PORT=str(args.port),
            UCX_TLS="tcp,self",
            HPCDIST_STORE_SECRET="bench-hierarchical",
            **_shared_cpus_env(world),
            PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""),
        )
        for var in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "HPCDIST_HIER", "HPCDIST_HIER_ALGO"):
            env.pop(var, None)
        cmd = [
            str(ROOT / "scripts" / "cluster-exec"),
            node,
            sys.executable,
            str(Path(__file__).resolve()),
            "--rank-main",
            "--sizes",
            args.sizes,
            "--repeat",
            str(args.repeat),
        ]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, start_new_session=True))
    out = ""
    try:
        for rank, p in enumerate(procs):
            text, _ = p.communicate(timeout=args.limit)
            if p.returncode != 0:
                raise SystemExit(f"rank {rank} failed (rc {p.returncode}); is the cluster up (scripts/cluster-up)?")
            if rank == 0:
                out = text
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
    line = next(ln for ln in out.splitlines() if ln.startswith("RESULT "))
    return list(json.loads(line[len("RESULT ") :]))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4K,64K,256K,1M,4M,16M,64M")
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--per-node", type=int, default=2)
    ap.add_argument("--port", type=int, default=29600)
    ap.add_argument("--limit", type=float, default=600.0, help="seconds allowed for the whole run")
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    sizes = [parse_size(s) for s in args.sizes.split(",") if s]
    if args.rank_main:
        rank_main(sizes, args.repeat)
        return 0
    rows = launch(args)
    n = args.nodes * args.per_node
    print(
        f"# all_reduce float32 SUM, {args.nodes} nodes x {args.per_node} ranks (scripts/cluster-up), MPI over TCP; {date.today()}"
    )
    print(
        f"# {platform.node()}: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; best of {args.repeat} interleaved rounds"
    )
    print(
        "# busbw = 2 (n-1)/n x bytes / time; speed-up = flat time / hierarchical time; "
        "hierarchical: HPCDIST_HIER_ALGO=auto (rails: equal ranks per node), leaders: HPCDIST_HIER_ALGO=leaders"
    )
    shared = _shared_cpus_env(n)
    if shared:
        print(
            f"# {n} ranks share {os.cpu_count()} CPUs: ranks run with "
            + " ".join(f"{k}={v}" for k, v in shared.items())
        )
    print(
        "| size | mpi4py Allreduce (ms) | hpcdist flat (ms) | hierarchical (ms) | leaders (ms) "
        "| flat busbw (GB/s) | hier busbw (GB/s) | speed-up | leaders speed-up |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        bw = 2 * (n - 1) / n * r["bytes"] / 1e9
        print(
            f"| {fmt_size(r['bytes'])} | {1e3 * r['mpi4py']:.3f} | {1e3 * r['flat']:.3f} | {1e3 * r['hier']:.3f} "
            f"| {1e3 * r['leaders']:.3f} | {bw / r['flat']:.2f} | {bw / r['hier']:.2f} | {r['flat'] / r['hier']:.2f}x "
            f"| {r['flat'] / r['leaders']:.2f}x |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
