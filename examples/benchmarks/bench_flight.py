"""What the flight recorder costs per call: hpcdist calls with the recorder on and off.

Run:  mpiexec -n 2 python examples/benchmarks/bench_flight.py [--iters N] [--rounds R]

Two groups over the same ranks, one with the flight recorder (the default
``HPCDIST_FLIGHT_RECORDER=2000`` entries) and one without (``0``); each row
times the same small operation on both, interleaved in rounds, and keeps the
best round of each (noise on a shared machine only ever adds time). Rank 0
prints a Markdown table: µs per call on and off and the difference, which is
what recording costs. The first row times the recorder alone (``Ring.coll``
plus the completion store, no MPI), the floor of the difference.
"""

from __future__ import annotations

import argparse
import os
from functools import partial

import numpy as np
from _timing import per_call  # this folder
from mpi4py import MPI

import hpcdist as dist
from hpcdist.flight import END, Ring


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--rounds", type=int, default=7)
    args = ap.parse_args()
    os.environ.setdefault("HPCDIST_WAIT", "block")
    dist.init_process_group("mpi")
    os.environ["HPCDIST_FLIGHT_RECORDER"] = "0"  # read when a group is created
    off = dist.new_group()
    os.environ["HPCDIST_FLIGHT_RECORDER"] = "2000"
    on = dist.new_group()
    assert off._flight is None and on._flight is not None
    comm = MPI.COMM_WORLD
    me, n = comm.Get_rank(), comm.Get_size()
    x = np.ones(1)
    peer = (me + 1) % n

    ring = Ring(2000)

    def alone() -> None:
        ring.coll("all_reduce", "float64", 1, -1)[END] = True

    def nothing() -> None:
        pass

    rows = [
        (
            "recorder alone (no MPI)",
            1e6 * per_call(alone, args.iters, comm, args.rounds),
            1e6 * per_call(nothing, args.iters, comm, args.rounds),
        )
    ]
    cases = {
        "all_reduce 8 B": lambda g: dist.all_reduce(x, group=g),
        "broadcast 8 B": lambda g: dist.broadcast(x, src=0, group=g),
        "all_reduce 8 B async + wait": lambda g: dist.all_reduce(x, group=g, async_op=True).wait(),
        "barrier": lambda g: dist.barrier(group=g),
    }
    if n > 1 and n % 2 == 0:

        def sendrecv(g):
            if me % 2 == 0:
                dist.send(x, dst=peer, group=g)
                dist.recv(x, src=peer, group=g)
            else:
                dist.recv(x, src=(me - 1) % n, group=g)
                dist.send(x, dst=(me - 1) % n, group=g)

        cases["send+recv 8 B (one each)"] = sendrecv
    for name, fn in cases.items():
        t_on = t_off = float("inf")
        for _ in range(3):  # interleave the two groups to share the machine's noise
            t_on = min(t_on, 1e6 * per_call(partial(fn, on), args.iters // 4, comm, args.rounds))
            t_off = min(t_off, 1e6 * per_call(partial(fn, off), args.iters // 4, comm, args.rounds))
        rows.append((name, t_on, t_off))
    if me == 0:
        print(f"flight recorder overhead, {n} rank(s), HPCDIST_WAIT={os.environ['HPCDIST_WAIT']}")
        print("| operation | recorder on (µs) | recorder off (µs) | cost (µs) |")
        print("|---|---:|---:|---:|")
        for name, t_on, t_off in rows:
            print(f"| {name} | {t_on:.3f} | {t_off:.3f} | {t_on - t_off:+.3f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
