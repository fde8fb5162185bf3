"""Hierarchical vs flat all_reduce on the simulated 2-node cluster (docs/benchmarks/hierarchical.md).

Run as root (it makes network, UTS and mount namespaces with ``scripts/cluster-up``)::

    python examples/benchmarks/bench_hier.py [--sizes 1M:64M:4] [--rounds 5]

It starts a 2 x 2 cluster (ranks 0,1 on node1 and 2,3 on node2, each node with
its own host name, address and ``/dev/shm``), launches 4 ranks of itself
without an MPI launcher, joined through ``env://`` with MPI over TCP
(``UCX_TLS=tcp,self``), and removes the cluster afterwards. Each rank times,
interleaved in rounds (best round kept), float32 SUM all_reduce on:

* ``hier``: a group on the hierarchical engine (node-local steps in shared
  memory, MPI among the two node leaders);
* ``flat``: a group on the flat MPI engine (``HPCDIST_HIER=0``);
* ``raw``: ``MPI_Allreduce`` through mpi4py on the same world.

All three cross the same TCP links between the namespaces. Rank 0 prints a
Markdown table (time, bus bandwidth, hier/flat).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PLACEMENT = ["node1", "node1", "node2", "node2"]


def driver(argv: list[str]) -> int:
    name = f"hpcbh{os.getpid() % 100000}"
    env = dict(os.environ, HPCDIST_CLUSTER=name)
    up = subprocess.run([str(ROOT / "scripts" / "cluster-up"), "2"], env=env, capture_output=True, text=True)
    if up.returncode:
        print(f"cannot start the simulated cluster (root and namespaces needed): {up.stderr.strip()}", file=sys.stderr)
        return 2
    procs = []
    try:
        for rank, node in enumerate(PLACEMENT):
            renv = dict(
                env,
                RANK=str(rank),
                WORLD_SIZE=str(len(PLACEMENT)),
                MASTER_ADDR="10.77.0.1",
                MASTER_PORT="29611",
                UCX_TLS="tcp,self",
                HPCDIST_STORE_SECRET=f"bench-{name}",
                PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""),
            )
            for var in ("LOCAL_RANK", "LOCAL_WORLD_SIZE", "HPCDIST_HIER", "HPCDIST_SHM"):
                renv.pop(var, None)
            cmd = [str(ROOT / "scripts" / "cluster-exec"), node, sys.executable, __file__, *argv]
            out = None if rank == 0 else subprocess.DEVNULL
            procs.append(subprocess.Popen(cmd, env=renv, stdout=out, start_new_session=True))
        rc = 0
        for p in procs:
            try:
                rc = max(rc, p.wait(timeout=900))
            except subprocess.TimeoutExpired:
                rc = 124
        return rc
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, 9)
                p.wait()
        subprocess.run([str(ROOT / "scripts" / "cluster-down")], env=env, capture_output=True)


def _group(hier: str) -> object:
    import hpcdist as dist

    os.environ["HPCDIST_HIER"] = hier
    try:
        g = dist.new_group()
        g.engine("cpu")  # built now, while the knob is set
    finally:
        os.environ.pop("HPCDIST_HIER", None)
    return g


def worker(argv: list[str]) -> int:
    import numpy as np
    from mpi4py import MPI

    import hpcdist as dist
    from hpcdist.bench import parse_sizes

    p = argparse.ArgumentParser()
    p.add_argument("--sizes", default="1M:64M:4")
    p.add_argument("--rounds", type=int, default=5)
    args = p.parse_args(argv)
    dist.init_process_group("mpi", init_method="env://")
    n = dist.get_world_size()
    hier, flat = _group("1"), _group("0")
    comm = dist.group.WORLD.comm
    engines = (type(hier.engine("cpu")).__name__, type(flat.engine("cpu")).__name__)
    variants = {
        "hier": lambda x: dist.all_reduce(x, group=hier),
        "flat": lambda x: dist.all_reduce(x, group=flat),
        "raw": lambda x: comm.Allreduce(MPI.IN_PLACE, x, MPI.SUM),
    }
    rows = []
    for nb in parse_sizes(args.sizes):
        x = np.zeros(nb // 4, np.float32)
        iters = max(2, min(50, (16 << 20) // nb))
        best = dict.fromkeys(variants, float("inf"))
        for _ in range(args.rounds):
            for k, f in variants.items():
                f(x)  # warm: segments and communicators set up outside the timing
                comm.Barrier()
                t0 = time.perf_counter()
                for _ in range(iters):
                    f(x)
                best[k] = min(best[k], comm.allreduce((time.perf_counter() - t0) / iters, MPI.MAX))
        rows.append((nb, best))
    if dist.get_rank() == 0:
        bus = 2 * (n - 1) / n
        load = os.getloadavg()[0]
        print(f"# 2 nodes x 2 ranks (namespaces), env:// join, UCX_TLS=tcp,self; engines {engines}; load {load:.1f}")
        print("| bytes | hier µs | flat µs | raw µs | hier busbw GB/s | flat busbw GB/s | raw busbw GB/s | hier/flat |")
        print("|---|---|---|---|---|---|---|---|")
        for nb, b in rows:
            bw = {k: bus * nb / t / 1e9 for k, t in b.items()}
            print(
                f"| {nb} | {b['hier'] * 1e6:.1f} | {b['flat'] * 1e6:.1f} | {b['raw'] * 1e6:.1f} | {bw['hier']:.2f} | "
                f"{bw['flat']:.2f} | {bw['raw']:.2f} | {b['flat'] / b['hier']:.2f}x |",
                flush=True,
            )
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(worker(sys.argv[1:]) if "RANK" in os.environ else driver(sys.argv[1:]))
