"""What each step of a blocking 8-byte ``hpcdist.all_reduce`` costs, beside the raw MPI call.

Run:  mpiexec -n 2 python examples/benchmarks/profile_hot_path.py [--iters N] [--rounds R]

It times, on a float64 array of one element (SUM, ``HPCDIST_WAIT=block``):

* each step of the call on its own, in a loop without any message (group
  resolution, the array adapter for a NumPy array and for a torch CPU
  tensor, op resolution, the engine lookup, the flight-recorder and DETAIL
  checks, the watchdog's guard (claiming the group's call slot and arming
  the watchdog in one step), building the MPI arguments) — the steps of the
  general path, which the first call of a dtype and op takes; later calls
  take the lane (docs/architecture.md), which skips the adapter, the op
  check and the engine lookup;
* raw mpi4py ``Allreduce(IN_PLACE, [a, DOUBLE], SUM)`` on a Dup of COMM_WORLD;
* the whole ``hpcdist.all_reduce`` on the NumPy array and on the torch tensor
  (which takes the lane through the NumPy view ``tensor.numpy()`` gives).

Each is the best of ``--rounds`` rounds of ``--iters`` calls (many short
rounds take most of the noise of a shared machine out). Rank 0 prints a
Markdown table: ns per call of each step, their sum (without the engine's
whole all_reduce, which contains the lock, the watchdog and the MPI
arguments), and the measured added time (whole call - raw call).
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable

import numpy as np
from _timing import per_call  # this folder
from mpi4py import MPI

import hpcdist as dist
from hpcdist._watchdog import WATCHDOG
from hpcdist.buffers.adapters import adapt, tensor_array
from hpcdist.buffers.dtypes import mpi_datatype
from hpcdist.debug import DETAIL
from hpcdist.group import resolve_group
from hpcdist.ops import ReduceOp, resolve_op


def _best(fn: Callable[[], object], iters: int, rounds: int, comm: MPI.Intracomm) -> float:
    """ns per call: the best round on this rank, the slowest rank's best."""
    return 1e9 * per_call(fn, iters, comm, rounds)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=500)
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    os.environ["HPCDIST_WAIT"] = "block"
    dist.init_process_group("mpi")
    pg = dist.new_group()
    raw = MPI.COMM_WORLD.Dup()
    a = np.ones(1)
    try:
        import torch

        t: object = torch.ones(1, dtype=torch.float64)
    except ImportError:
        t = None
    SUM = ReduceOp.SUM
    eng = pg.engine("cpu")
    buf, rop = adapt(a, "tensor", True), resolve_op(ReduceOp.SUM, "float64")
    in_place, dt, op = MPI.IN_PLACE, MPI.DOUBLE, MPI.SUM
    what = ("all_reduce", pg)
    dist.all_reduce(a, group=pg)  # build the engine, warm the caches

    def noop_args(*args: object) -> None:
        pass

    guarded = WATCHDOG.guard(noop_args, what, object(), pg.busy_error, pg)

    def watchdog() -> None:
        guarded()

    def flight_detail() -> None:
        fr = pg._flight
        if fr is not None:
            fr.coll("all_reduce", "float64", 1, -1)
        if DETAIL[0]:
            raise AssertionError

    lane = pg._lanes[SUM][id(a.dtype)]  # learned by the first call above
    run = lane[3]

    def lane_checks() -> None:
        got = pg._sum_lanes.get(id(a.dtype))
        if got is None or a.nbytes >= got[2] or not a.flags.carray:
            raise AssertionError

    steps: list[tuple[str, Callable[[], object]]] = [
        ("resolve_group (group= a ProcessGroup)", lambda: resolve_group(pg, "all_reduce")),
        ("adapt (NumPy array)", lambda: adapt(a, "tensor", True)),
        ("resolve_op (SUM, float64)", lambda: resolve_op(SUM, "float64")),
        ("engine lookup (pg.engine('cpu'))", lambda: pg.engine("cpu")),
        ("flight recorder + DETAIL checks", flight_detail),
        ("guard: claim the call slot, arm the watchdog, call a no-op, free", watchdog),
        ("MPI arguments ([a, datatype], op)", lambda: (in_place, [a, mpi_datatype(a.dtype)], op)),
        ("the engine's all_reduce (guard, MPI call)", lambda: eng.all_reduce(buf, rop, True)),
        ("lane: lookup and the array's checks", lane_checks),
        ("lane: the engine's one-step all_reduce (guard, MPI call)", lambda: run(a)),
    ]
    if t is not None:
        steps.insert(2, ("adapt (torch CPU tensor)", lambda: adapt(t, "tensor", True)))
        steps.append(("lane: a tensor's NumPy view (tensor_array)", lambda: tensor_array(t)))
    rows = [(name, _best(fn, args.iters, args.rounds, raw)) for name, fn in steps]
    raw_ns = _best(lambda: raw.Allreduce(in_place, [a, dt], op), args.iters, args.rounds, raw)
    np_ns = _best(lambda: dist.all_reduce(a, group=pg), args.iters, args.rounds, raw)
    torch_ns = _best(lambda: dist.all_reduce(t, group=pg), args.iters, args.rounds, raw) if t is not None else None
    if raw.Get_rank() == 0:
        print(f"# one blocking 8-byte all_reduce (float64, SUM), {raw.Get_size()} ranks, HPCDIST_WAIT=block")
        print(
            f"# best of {args.rounds} rounds of {args.iters} calls; {MPI.Get_library_version().splitlines()[0].strip()}; "
            f"mpi4py {__import__('mpi4py').__version__}; hpcdist {dist.__version__}; host {socket.gethostname()}, "
            f"{os.cpu_count()} cpus; load average {os.getloadavg()[0]:.2f}"
        )
        print("| step | ns per call |")
        print("|---|---|")
        general = [ns for name, ns in rows if "torch" not in name and "engine's" not in name and "lane" not in name]
        for name, ns in rows:
            print(f"| {name} | {ns:.0f} |")
        print(f"| **sum of the general path's steps (NumPy, first call of a dtype and op)** | **{sum(general):.0f}** |")
        print(f"| raw mpi4py `Allreduce` | {raw_ns:.0f} |")
        print(f"| `hpcdist.all_reduce` (NumPy: the lane) | {np_ns:.0f} |")
        print(f"| added by hpcdist (NumPy) | {np_ns - raw_ns:.0f} |")
        print(f"| raw / hpcdist (NumPy) | {raw_ns / np_ns:.2f} |")
        if torch_ns is not None:
            print(f"| `hpcdist.all_reduce` (torch CPU tensor) | {torch_ns:.0f} |")
            print(f"| added by hpcdist (torch) | {torch_ns - raw_ns:.0f} |")
            print(f"| raw / hpcdist (torch) | {raw_ns / torch_ns:.2f} |")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
