"""Hierarchical vs flat collectives on the simulated multi-node cluster (scripts/cluster-up).

Starts ``--nodes`` x ``--per-node`` ranks, each on its node of the cluster
(``scripts/cluster-exec``), joined without a launcher through ``env://``
over MPI on TCP (``UCX_TLS=tcp,self``: MPI crosses the namespaces through the
kernel's TCP stack, as between hosts). For each operation (``--ops``:
all_reduce, all_gather_into_tensor, reduce_scatter_tensor) and size it times,
in one run and interleaved: the raw mpi4py call on the group's communicator
(``Allreduce``, ``Allgather``, ``Reduce_scatter_block``), hpcdist's flat MPI
path (``HPCDIST_HIER=0``), the hierarchical path as chosen
(``HPCDIST_HIER_ALGO=auto``), and forced onto rails and onto the leaders
(``HPCDIST_HIER_ALGO=rails`` / ``leaders``), float32 (SUM), blocking. A
time is the slowest rank's mean over the iterations; each round runs the
cases in a new order (shuffled, seeded by the round: the case that always
followed flat MPI's large transfers ran up to 20% slower); the table shows
the best of ``--repeat`` such measurements and each hierarchical path's speed-up
over the flat one. Every path's result is checked after the timing.

``--async`` adds two cases to the same run: ``async_op=True`` followed by
``wait()`` on the flat group (MPI's non-blocking call) and on the
hierarchical one (its steps on the engine's thread), the shape of DDP's
gradient buckets.

Usage (as root; the cluster must be up):
    scripts/cluster-up 2
    python examples/benchmarks/bench_hierarchical.py [--sizes 4K,64K,1M,4M,16M,64M] [--repeat 5]
        [--ops all_reduce,all_gather_into_tensor,reduce_scatter_tensor] [--async]
    scripts/cluster-down
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import subprocess
import sys
import time
from datetime import date, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


# ---------------------------------------------------------------------------------------- one rank


#: the operations timed (each beside its raw mpi4py call)
OPS = ("all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor")


def _time_op(op: str, nbytes: int, repeat: int, comm, groups: dict, asynchronous: bool = False) -> dict:
    """Best-of-``repeat`` times of ``op`` on ``nbytes`` (the whole array: all_reduce's, the gathered output,
    the scattered input) for raw mpi4py and each group, interleaved; checks each group's result."""
    import numpy as np
    from mpi4py import MPI

    import hpcdist as dist

    n, me = comm.Get_size(), comm.Get_rank()
    m = max(1, nbytes // 4 // n)  # items per rank's block
    whole = np.ones(m * n, dtype=np.float32)
    block = np.ones(m, dtype=np.float32)
    raw = {
        "all_reduce": lambda: comm.Allreduce(MPI.IN_PLACE, [whole, MPI.FLOAT], MPI.SUM),
        "all_gather_into_tensor": lambda: comm.Allgather([block, MPI.FLOAT], [whole, MPI.FLOAT]),
        "reduce_scatter_tensor": lambda: comm.Reduce_scatter_block([whole, MPI.FLOAT], [block, MPI.FLOAT], MPI.SUM),
    }[op]
    call = {
        "all_reduce": lambda g, a=False: dist.all_reduce(whole, group=g, async_op=a),
        "all_gather_into_tensor": lambda g, a=False: dist.all_gather_into_tensor(whole, block, group=g, async_op=a),
        "reduce_scatter_tensor": lambda g, a=False: dist.reduce_scatter_tensor(block, whole, group=g, async_op=a),
    }[op]
    cases = {"mpi4py": raw, **{name: (lambda g=g: call(g)) for name, g in groups.items()}}
    if asynchronous:  # async_op=True, then wait(): flat MPI's non-blocking call, the hierarchical engine's thread
        cases["flat_async"] = lambda: call(groups["flat"], True).wait()
        cases["hier_async"] = lambda: call(groups["hier"], True).wait()
    iters = max(5, min(200, (64 << 20) // max(nbytes, 1) // 4))
    times: dict[str, list[float]] = {k: [] for k in cases}
    for fn in cases.values():  # warm up: engines, topology, connections
        fn()
    order = list(cases.items())
    for round_ in range(repeat):
        # a new order each round, the same on every rank (seeded): in a fixed order (or a rotated one, which is
        # the same sequence in time) the case that always follows flat MPI's large transfers ran up to 20% slower
        random.Random(round_).shuffle(order)
        for name, fn in order:
            comm.Barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                fn()
            dt = (time.perf_counter() - t0) / iters
            times[name].append(comm.allreduce(dt, op=MPI.MAX))
    total = n * (n + 1) / 2  # inputs of rank r: r + 1
    for name, g in groups.items():
        block[:] = me + 1
        whole[:] = me + 1
        call(g)
        if op == "all_gather_into_tensor":
            ok = np.array_equal(whole, np.repeat(np.arange(1, n + 1, dtype=np.float32), m))
        else:
            ok = bool(np.all((block if op == "reduce_scatter_tensor" else whole) == total))
        if not ok:
            raise SystemExit(f"wrong {name} {op} result at {nbytes} bytes")
    return {"bytes": whole.nbytes, **{k: min(v) for k, v in times.items()}}


def rank_main(sizes: list[int], repeat: int, ops: list[str], asynchronous: bool) -> None:
    import hpcdist as dist

    os.environ["HPCDIST_HIER"] = "1"
    os.environ["HPCDIST_HIER_ALGO"] = "auto"
    dist.init_process_group("mpi", timeout=timedelta(seconds=300))
    hier = dist.group.WORLD
    hier.engine("cpu")  # engines are built on first use and read HPCDIST_HIER(_ALGO) then: build this one now
    everyone = list(range(dist.get_world_size()))
    algos = {}
    for algo in ("rails", "leaders"):
        os.environ["HPCDIST_HIER_ALGO"] = algo
        algos[algo] = dist.new_group(everyone)
        algos[algo].engine("cpu")
    os.environ["HPCDIST_HIER"] = "0"
    flat = dist.new_group(everyone)
    flat.engine("cpu")
    engines = [g.engine("cpu") for g in (hier, algos["rails"], algos["leaders"], flat)]
    got = [(type(e).__name__, getattr(e, "algorithm", None)) for e in engines]
    want = [("HierarchicalEngine", a) for a in ("auto", "rails", "leaders")]
    if got[:3] != want or got[3][0] == "HierarchicalEngine":
        raise SystemExit(f"expected the hierarchical engine (auto, rails, leaders) and a flat one, got {got}")
    comm = hier.comm
    rows = []
    for op in ops:
        for nbytes in sizes:
            groups = {"flat": flat, "hier": hier, **algos}
            rows.append({"op": op, **_time_op(op, nbytes, repeat, comm, groups, asynchronous)})
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
            "--ops",
            args.ops,
            *(["--async"] if args.asynchronous else []),
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
    ap.add_argument("--ops", default="all_reduce", help=f"comma-separated, of {', '.join(OPS)}")
    ap.add_argument("--nodes", type=int, default=2)
    ap.add_argument("--per-node", type=int, default=2)
    ap.add_argument("--port", type=int, default=29600)
    ap.add_argument("--limit", type=float, default=600.0, help="seconds allowed for the whole run")
    ap.add_argument(
        "--async",
        dest="asynchronous",
        action="store_true",
        help="also time async_op=True + wait() (flat, hierarchical)",
    )
    ap.add_argument("--rank-main", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    from hpcdist.bench import parse_sizes

    sizes = parse_sizes(args.sizes)
    ops = [o for o in args.ops.split(",") if o]
    bad = [o for o in ops if o not in OPS]
    if bad:
        ap.error(f"--ops: {bad} not among {', '.join(OPS)}")
    if args.rank_main:
        rank_main(sizes, args.repeat, ops, args.asynchronous)
        return 0
    from hpcdist.bench import BUS, human_size

    rows = launch(args)
    n = args.nodes * args.per_node
    print(
        f"# float32 (SUM), {args.nodes} nodes x {args.per_node} ranks (scripts/cluster-up), MPI over TCP; {date.today()}"
    )
    print(
        f"# {platform.node()}: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs; best of {args.repeat} interleaved rounds"
    )
    print(
        "# size: the whole array (all_reduce's, all_gather's output, reduce_scatter's input); busbw as nccl-tests; "
        "speed-up = flat time / hierarchical time; hierarchical: HPCDIST_HIER_ALGO=auto (as chosen), rails and "
        "leaders: HPCDIST_HIER_ALGO=rails / leaders"
    )
    shared = _shared_cpus_env(n)
    if shared:
        print(
            f"# {n} ranks share {os.cpu_count()} CPUs: ranks run with "
            + " ".join(f"{k}={v}" for k, v in shared.items())
        )
    extra = " | flat async (ms) | hier async (ms) | async speed-up" if args.asynchronous else ""
    print(
        "| op | size | mpi4py (ms) | hpcdist flat (ms) | hierarchical (ms) | rails (ms) | leaders (ms) "
        f"| flat busbw (GB/s) | hier busbw (GB/s) | speed-up | rails speed-up | leaders speed-up{extra} |"
    )
    print("|---" * (15 if args.asynchronous else 12) + "|")
    for r in rows:
        bw = BUS[r["op"]](n) * r["bytes"] / 1e9  # nccl-tests' bus bandwidth, as hpcdist bench
        cells = (
            f" | {1e3 * r['flat_async']:.3f} | {1e3 * r['hier_async']:.3f} | {r['flat_async'] / r['hier_async']:.2f}x"
            if args.asynchronous
            else ""
        )
        print(
            f"| {r['op']} | {human_size(r['bytes'])} | {1e3 * r['mpi4py']:.3f} | {1e3 * r['flat']:.3f} "
            f"| {1e3 * r['hier']:.3f} | {1e3 * r['rails']:.3f} | {1e3 * r['leaders']:.3f} | {bw / r['flat']:.2f} "
            f"| {bw / r['hier']:.2f} | {r['flat'] / r['hier']:.2f}x | {r['flat'] / r['rails']:.2f}x "
            f"| {r['flat'] / r['leaders']:.2f}x{cells} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
