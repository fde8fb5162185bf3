"""Bucketing: 1000 arrays of 4 KiB all-reduced one by one, coalesced, and bucketed.

Run:  mpiexec -n 2 python examples/benchmarks/bench_bucketing.py [--count 1000] [--bytes 4096] [--rounds 5]

Times, on the same float32 arrays (SUM, in place), interleaved in rounds
(best round kept):

* ``loop``: one ``hpcdist.all_reduce`` per array;
* ``bucketed``: ``hpcdist.all_reduce_bucketed`` (25 MiB buckets, torch DDP's default);
* ``coalesced``: ``hpcdist.all_reduce_coalesced`` (one packed call);
* ``views``: the same arrays made as views of one buffer (``hpcdist.bucket_views``, torch DDP's
  ``gradient_as_bucket_view``), all-reduced with one ``hpcdist.all_reduce`` of the buffer: nothing
  to pack, the bound that packing approaches;
* ``symmetric views``: the same with the buffer in symmetric memory
  (``bucket_views(..., symmetric=True)``): the node's ranks read it where it lies;
* ``raw loop``: one mpi4py ``Allreduce`` per array, for scale.

Rank 0 prints a Markdown table with the speed-up over the loop.
"""

from __future__ import annotations

import argparse
import os
import socket
import time

import numpy as np
from mpi4py import MPI

import hpcdist as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--count", type=int, default=1000)
    ap.add_argument("--bytes", type=int, default=4096)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    dist.init_process_group("mpi")
    raw = MPI.COMM_WORLD.Dup()
    xs = [np.zeros(args.bytes // 4, np.float32) for _ in range(args.count)]

    def loop() -> None:
        for x in xs:
            dist.all_reduce(x)

    flat, _ = dist.bucket_views([x.shape for x in xs])
    sym, _ = dist.bucket_views([x.shape for x in xs], symmetric=True)

    def raw_loop() -> None:
        for x in xs:
            raw.Allreduce(MPI.IN_PLACE, x)

    variants = {
        "loop": loop,
        "bucketed": lambda: dist.all_reduce_bucketed(xs),
        "coalesced": lambda: dist.all_reduce_coalesced(xs),
        "views": lambda: dist.all_reduce(flat),
        "symmetric views": lambda: dist.all_reduce(sym),
        "raw loop": raw_loop,
    }
    best = dict.fromkeys(variants, float("inf"))
    for _ in range(args.rounds):
        for name, fn in variants.items():
            raw.Barrier()
            t0 = time.perf_counter()
            fn()
            best[name] = min(best[name], raw.allreduce(time.perf_counter() - t0, op=MPI.MAX))
    if raw.Get_rank() == 0:
        print(
            f"# {args.count} x {args.bytes} B float32 all_reduce, {raw.Get_size()} ranks, best of {args.rounds}; "
            f"host {socket.gethostname()}, {os.cpu_count()} cpus, load {os.getloadavg()[0]:.1f}, "
            f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}"
        )
        print("| variant | ms per step | speed-up over loop |")
        print("|---|---|---|")
        for name, t in best.items():
            print(f"| {name} | {t * 1e3:.2f} | {best['loop'] / t:.1f}x |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
