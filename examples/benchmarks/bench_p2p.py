"""Ping-pong latency/bandwidth: hpcdist send/recv beside raw mpi4py Send/Recv.

Run:  mpiexec -n 2 python examples/benchmarks/bench_p2p.py [--max-bytes N] [--rounds R]

Ranks 0 and 1 bounce a float64 buffer; the time per one-way trip is half a
round trip. Raw mpi4py and hpcdist run interleaved in rounds on the same
buffers; the best round of each is kept. Rank 0 prints a Markdown table.
hpcdist's receives are always non-blocking calls polled against the timeout
(so a missing sender raises and the receive is cancelled).
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from mpi4py import MPI

import hpcdist as dist


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--max-bytes", type=int, default=16 << 20)
    ap.add_argument("--rounds", type=int, default=5)
    args = ap.parse_args()
    dist.init_process_group("mpi")
    raw = MPI.COMM_WORLD.Dup()
    rank = raw.Get_rank()
    if raw.Get_size() != 2:
        raise SystemExit("run with exactly 2 ranks")
    peer = 1 - rank
    rows = []
    nbytes = 8
    while nbytes <= args.max_bytes:
        a = np.ones(max(nbytes // 8, 1))
        it = 2000 if nbytes <= 65536 else 100 if nbytes <= 1 << 20 else 10

        def raw_pp(a=a):
            if rank == 0:
                raw.Send(a, peer)
                raw.Recv(a, peer)
            else:
                raw.Recv(a, peer)
                raw.Send(a, peer)

        def hd_pp(a=a):
            if rank == 0:
                dist.send(a, peer)
                dist.recv(a, peer)
            else:
                dist.recv(a, peer)
                dist.send(a, peer)

        best = {"raw": float("inf"), "hpcdist": float("inf")}
        for _ in range(args.rounds):
            for name, fn in (("raw", raw_pp), ("hpcdist", hd_pp)):
                raw.Barrier()
                t0 = time.perf_counter()
                for _ in range(it):
                    fn()
                best[name] = min(best[name], (time.perf_counter() - t0) / it / 2)
        rows.append((nbytes, best))
        nbytes *= 4 if nbytes < 1 << 20 else 2
    if rank == 0:
        print(
            f"# send/recv ping-pong (one-way), 2 ranks, best of {args.rounds} rounds; "
            f"{MPI.Get_library_version().splitlines()[0].strip()}"
        )
        print("| bytes | raw mpi4py µs | hpcdist µs | added µs | hpcdist/raw throughput |")
        print("|---|---|---|---|---|")
        for nb, b in rows:
            print(
                f"| {nb} | {b['raw'] * 1e6:.2f} | {b['hpcdist'] * 1e6:.2f} | {(b['hpcdist'] - b['raw']) * 1e6:+.2f} "
                f"| {b['raw'] / b['hpcdist']:.3f} |"
            )
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
