"""The fixed cost of small blocking calls: hpcdist beside raw mpi4py (and torch's gloo), per collective.

Run:  mpiexec -n 2 python examples/benchmarks/bench_small_calls.py [--rounds R] [--iters N] [--gloo]

For ``all_reduce`` (SUM), ``broadcast`` (from rank 0), ``reduce`` (SUM, to rank 0),
``all_gather_into_tensor``, ``all_gather`` (into a list), ``gather`` and ``scatter`` (rank 0 the
root), ``reduce_scatter_tensor`` (SUM),
``all_to_all_single`` (even splits) and ``barrier`` on one float64 element per rank (8 bytes),
``HPCDIST_WAIT=block``, it times:

* **raw mpi4py**: the MPI routine on a Dup of COMM_WORLD, with the datatype
  given (``[a, MPI.DOUBLE]``), as hpcdist passes it;
* **hpcdist NumPy**: the hpcdist call on NumPy arrays, which after the first
  call of a dtype on a group takes the group's lane (docs/performance.md);
* **hpcdist torch**: the same on torch CPU tensors (torch installed), which
  take the same lanes through ``tensor.numpy()``;
* **torch gloo** (``--gloo``): ``torch.distributed`` with the gloo backend on
  the same ranks.

The variants run interleaved, in rounds; each keeps its best round (the
slowest rank's time). Rank 0 prints a Markdown table of µs per call, the time
hpcdist adds and raw / hpcdist (1.0: as fast as raw mpi4py).
"""

from __future__ import annotations

import argparse
import os
import socket
from collections.abc import Callable
from typing import Any

import numpy as np
from _timing import per_call, vs_raw  # this folder
from mpi4py import MPI

import hpcdist as dist
from hpcdist._launchenv import free_port

OPS = [
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather_into_tensor",
    "all_gather",
    "gather",
    "scatter",
    "reduce_scatter_tensor",
    "all_to_all_single",
    "barrier",
]


def raw_calls(raw: Any, a: np.ndarray, out: np.ndarray, big: np.ndarray) -> dict[str, Callable[[], object]]:
    d = MPI.DOUBLE
    root = raw.Get_rank() == 0
    send, recv = (MPI.IN_PLACE, [a, d]) if root else ([a, d], None)  # the root reduces in place
    return {
        "all_reduce": lambda: raw.Allreduce(MPI.IN_PLACE, [a, d], MPI.SUM),
        "broadcast": lambda: raw.Bcast([a, d], 0),
        "reduce": lambda: raw.Reduce(send, recv, MPI.SUM, 0),
        "all_gather_into_tensor": lambda: raw.Allgather([a, d], [out, d]),
        "all_gather": lambda: raw.Allgather([a, d], [out, d]),  # (into the memory the list's views show)
        "gather": lambda: raw.Gather([a, d], [out, d] if root else None, 0),
        "scatter": lambda: raw.Scatter([big, d] if root else None, [a, d], 0),
        "reduce_scatter_tensor": lambda: raw.Reduce_scatter_block([big, d], [a, d], MPI.SUM),
        "all_to_all_single": lambda: raw.Alltoall([big, d], [out, d]),
        "barrier": raw.Barrier,
    }


def api_calls(api: Any, a: Any, out: Any, big: Any, group: Any = None) -> dict[str, Callable[[], object]]:
    """The calls through ``api`` (hpcdist or torch.distributed) on ``a`` (one element), ``out`` (the gathered
    output, the all-to-all's output) and ``big`` (the scattered input, the all-to-all's input), both group size
    x ``a``; the list all_gather's outputs are views of ``out``'s elements)."""
    parts = [out[i : i + 1] for i in range(out.shape[0])]
    ins = [big[i : i + 1] for i in range(big.shape[0])]
    root = (group.rank() if group is not None else api.get_rank()) == 0
    return {
        "all_reduce": lambda: api.all_reduce(a, group=group),
        "broadcast": lambda: api.broadcast(a, src=0, group=group),
        "reduce": lambda: api.reduce(a, dst=0, group=group),
        "all_gather_into_tensor": lambda: api.all_gather_into_tensor(out, a, group=group),
        "all_gather": lambda: api.all_gather(parts, a, group=group),
        "gather": lambda: api.gather(a, parts if root else None, dst=0, group=group),
        "scatter": lambda: api.scatter(a, ins if root else None, src=0, group=group),
        "reduce_scatter_tensor": lambda: api.reduce_scatter_tensor(a, big, group=group),
        "all_to_all_single": lambda: api.all_to_all_single(out, big, group=group),
        "barrier": lambda: api.barrier(group=group),
    }


def tensors(torch: Any, size: int) -> tuple[Any, Any, Any]:
    """The torch tensors of :func:`api_calls`: one element, the gathered output, the scattered input."""
    f64 = torch.float64
    return torch.ones(1, dtype=f64), torch.zeros(size, dtype=f64), torch.ones(size, dtype=f64)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--iters", type=int, default=2000)
    ap.add_argument("--gloo", action="store_true", help="also time torch.distributed gloo")
    args = ap.parse_args()
    os.environ["HPCDIST_WAIT"] = "block"
    dist.init_process_group("mpi")
    pg = dist.new_group()
    raw = MPI.COMM_WORLD.Dup()
    rank, size = raw.Get_rank(), raw.Get_size()
    a, out, big = np.ones(1), np.zeros(size), np.ones(size)
    variants: dict[str, dict[str, Callable[[], object]]] = {
        "raw": raw_calls(raw, a, out, big),
        "numpy": api_calls(dist, a, out, big, pg),
    }
    tdist = None
    try:
        import torch

        variants["torch"] = api_calls(dist, *tensors(torch, size), pg)
        if args.gloo:
            import torch.distributed as tdist

            port = raw.bcast(free_port("127.0.0.1") if rank == 0 else None, root=0)
            tdist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
            variants["gloo"] = api_calls(tdist, *tensors(torch, size))
    except ImportError:
        pass
    best = {(v, op): float("inf") for v in variants for op in OPS}
    for calls in variants.values():  # the first calls learn the lanes and build the engines
        for fn in calls.values():
            fn()
    for _ in range(args.rounds):
        for op in OPS:
            for v, calls in variants.items():
                iters = max(args.iters // 20, 10) if v == "gloo" else args.iters
                best[v, op] = min(best[v, op], per_call(calls[op], iters, raw))
    if rank == 0:
        print(f"# small blocking calls (8 bytes, float64), {size} ranks, HPCDIST_WAIT=block, best of {args.rounds}")
        print(
            f"# {MPI.Get_library_version().splitlines()[0].strip()}; mpi4py {__import__('mpi4py').__version__}; "
            f"hpcdist {dist.__version__}; host {socket.gethostname()}, {os.cpu_count()} cpus; "
            f"load average {os.getloadavg()[0]:.2f}"
        )
        head = "| call | raw mpi4py µs | hpcdist NumPy µs | added µs | raw / hpcdist |"
        if "torch" in variants:
            head += " hpcdist torch µs | added µs | raw / hpcdist |"
        if "gloo" in variants:
            head += " torch gloo µs |"
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for op in OPS:
            r = best["raw", op]
            line = f"| `{op}` | {r * 1e6:.2f} |"
            for v in ("numpy", "torch"):
                if v in variants:
                    line += vs_raw(best[v, op], r)
            if "gloo" in variants:
                line += f" {best['gloo', op] * 1e6:.1f} |"
            print(line)
    if tdist is not None:
        tdist.destroy_process_group()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
