"""OSU-style all_reduce latency/bandwidth: hpcdist beside raw mpi4py (and torch's gloo).

Run:  mpiexec -n 2 python examples/benchmarks/bench_allreduce.py [--max-bytes N] [--gloo]

For each message size from 8 B to 64 MiB (float64 arrays, SUM) it times, on
the same buffers, raw ``Comm.Allreduce(IN_PLACE, ...)`` on a Dup of
COMM_WORLD and ``hpcdist.all_reduce`` in both wait modes (``HPCDIST_WAIT=block``:
the blocking MPI call under the watchdog; ``poll``: the non-blocking call
polled against the timeout); they are interleaved in rounds and
the best round of each is kept, to take noise from a shared machine out.
With ``--gloo`` (torch installed) it also times ``torch.distributed`` with
the gloo backend on the same ranks (its own TCP rendezvous). Rank 0 prints a
Markdown table: time per call in µs, the overhead hpcdist adds, and the
throughput ratio hpcdist / raw.
"""

from __future__ import annotations

import argparse
import os
import socket

import numpy as np
from _timing import iterations, per_call, vs_raw  # this folder
from mpi4py import MPI

import hpcdist as dist
from hpcdist._launchenv import free_port


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--gloo", action="store_true", help="also time torch.distributed gloo")
    args = ap.parse_args()

    dist.init_process_group("mpi")
    groups = {}
    for mode in ("poll", "block"):  # HPCDIST_WAIT is read when a group is created
        os.environ["HPCDIST_WAIT"] = mode
        groups[mode] = dist.new_group()
    raw = MPI.COMM_WORLD.Dup()
    rank, size = raw.Get_rank(), raw.Get_size()
    tdist = None
    if args.gloo:
        try:
            import torch
            import torch.distributed as tdist

            port = raw.bcast(free_port("127.0.0.1") if rank == 0 else None, root=0)
            tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
        except ImportError:
            tdist = None
    rows = []
    nbytes = 8
    while nbytes <= args.max_bytes:
        n = nbytes // 8
        a = np.ones(n)
        it = iterations(nbytes, 2000)
        best = {"raw": float("inf"), "poll": float("inf"), "block": float("inf"), "gloo": float("inf")}

        def f_raw(a=a):
            raw.Allreduce(MPI.IN_PLACE, a)

        gp, gb = groups["poll"], groups["block"]

        def f_poll(a=a, gp=gp):
            dist.all_reduce(a, group=gp)

        def f_block(a=a, gb=gb):
            dist.all_reduce(a, group=gb)

        tt = torch.from_numpy(np.ones(n)) if tdist is not None else None

        def f_gloo(tt=tt):
            tdist.all_reduce(tt)

        for _ in range(args.rounds):
            best["raw"] = min(best["raw"], per_call(f_raw, it, raw))
            best["poll"] = min(best["poll"], per_call(f_poll, it, raw))
            best["block"] = min(best["block"], per_call(f_block, it, raw))
            if tdist is not None:
                best["gloo"] = min(best["gloo"], per_call(f_gloo, max(it // 10, 3), raw))
        rows.append((nbytes, best))
        nbytes *= 2 if nbytes < 1024 else 4
    if rank == 0:
        print(f"# all_reduce (SUM, float64), {size} ranks, best of {args.rounds} rounds")
        print(
            f"# {MPI.Get_library_version().splitlines()[0].strip()}; mpi4py {__import__('mpi4py').__version__}; "
            f"hpcdist {dist.__version__}; host {socket.gethostname()}, {os.cpu_count()} cpus"
        )
        head = (
            "| bytes | raw mpi4py µs | hpcdist block µs | added µs | hpcdist/raw throughput | hpcdist poll µs "
            "| added µs | hpcdist/raw throughput |"
        )
        if tdist is not None:
            head += " torch gloo µs |"
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for nb, b in rows:
            line = f"| {nb} | {b['raw'] * 1e6:.2f} |"
            for mode in ("block", "poll"):
                line += vs_raw(b[mode], b["raw"], 3)
            if tdist is not None:
                line += f" {b['gloo'] * 1e6:.1f} |"
            print(line)
    if tdist is not None:
        tdist.destroy_process_group()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
