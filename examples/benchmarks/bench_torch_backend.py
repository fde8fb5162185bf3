"""torch.distributed over hpcdist: all_reduce latency/bandwidth and DDP step time, beside gloo.

Run (one run, 2 and 4 ranks; it launches itself under ``mpiexec``)::

    python examples/benchmarks/bench_torch_backend.py [--ranks 2,4] [--max-bytes N] [--rounds R]

or one rank count directly: ``mpiexec -n 2 python examples/benchmarks/bench_torch_backend.py --worker``.

(a) all_reduce (SUM, float32, in place) of 8 B ... 64 MiB, timed on the same
tensor through four paths:

- **torch→hpcdist**: ``torch.distributed.all_reduce(t)`` on the default group,
  backend "hpcdist" (``init_process_group("hpcdist")`` under ``mpiexec``);
- **hpcdist direct**: ``hpcdist.all_reduce(t)`` on the same MPI communicator
  (the world the backend made), so the difference is torch's dispatch plus
  the backend's own work per call;
- **raw mpi4py**: ``comm.Allreduce(MPI.IN_PLACE, t.numpy())`` on a ``Dup`` of
  ``COMM_WORLD``;
- **torch→gloo**: ``torch.distributed.all_reduce(t, group=g)`` on a group made
  with ``new_group(backend="gloo")`` over the same ranks.

The paths run interleaved in rounds and the best round of each is kept (the
noise of a shared machine shows up as slow rounds). Rank 0 prints a Markdown
table: µs per call, the µs torch's dispatch adds over hpcdist direct, and
gloo's time over torch→hpcdist's.

(b) DDP training steps (forward, backward with DDP's gradient all-reduces,
SGD step) of two models, DDP on the hpcdist default group vs DDP on the gloo
group, same seeds and data: a communication-bound one (a stack of
1024x1024 Linear layers, batch 8: 16.8 M parameters, 64 MiB of gradients
per step, little compute) and a compute-bound one (four 256x256 Linear
layers, batch 8192: 1 MiB of gradients, much compute). Median step time
over the timed steps, the slowest rank's.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

SIZES = (8, 64, 512, 4096, 32768, 262144, 1 << 20, 4 << 20, 16 << 20, 64 << 20)


def _iters(nbytes: int) -> int:
    if nbytes <= 64 * 1024:
        return 1000
    if nbytes <= 1 << 20:
        return 100
    if nbytes <= 8 << 20:
        return 20
    return 5


def _time(fn, iters: int, comm, MPI) -> float:
    """Seconds per call of ``fn``, the slowest rank's."""
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    t = (time.perf_counter() - t0) / iters
    return comm.allreduce(t, op=MPI.MAX)


def bench_allreduce(args, tdist, gloo, comm, MPI) -> list[str]:
    import torch

    import hpcdist

    rows = []
    for nbytes in (n for n in SIZES if n <= args.max_bytes):
        t = torch.ones(nbytes // 4, dtype=torch.float32)
        a = t.numpy()  # the same memory
        it = _iters(nbytes)
        paths = {
            "raw": lambda a=a: comm.Allreduce(MPI.IN_PLACE, a),
            "direct": lambda t=t: hpcdist.all_reduce(t),
            "torch": lambda t=t: tdist.all_reduce(t),
            "gloo": lambda t=t: tdist.all_reduce(t, group=gloo),
        }
        best = dict.fromkeys(paths, float("inf"))
        for _ in range(args.rounds):
            for name, fn in paths.items():
                n = it if name != "gloo" else max(it // 10, 3)  # gloo is slow at small sizes: fewer calls
                best[name] = min(best[name], _time(fn, n, comm, MPI))
        rows.append((nbytes, best))
    head = (
        "| bytes | raw mpi4py µs | hpcdist direct µs | torch→hpcdist µs | dispatch adds µs | torch→gloo µs "
        "| gloo / torch→hpcdist |"
    )
    out = [head, "|" + "---|" * (head.count("|") - 1)]
    for nb, b in rows:
        out.append(
            f"| {_size(nb)} | {b['raw'] * 1e6:.1f} | {b['direct'] * 1e6:.1f} | {b['torch'] * 1e6:.1f} "
            f"| {(b['torch'] - b['direct']) * 1e6:+.1f} | {b['gloo'] * 1e6:.1f} | {b['gloo'] / b['torch']:.1f}x |"
        )
    return out


def _size(nb: int) -> str:
    for unit, s in (("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nb >= s:
            return f"{nb // s} {unit}"
    return f"{nb} B"


def _model(kind: str):
    import torch

    torch.manual_seed(0)
    if kind == "comm":
        layers = [torch.nn.Linear(1024, 1024) for _ in range(16)]
        batch, width = 8, 1024
    else:
        layers = [torch.nn.Linear(256, 256) for _ in range(4)]
        batch, width = 8192, 256
    body = []
    for lin in layers:
        body += [lin, torch.nn.ReLU()]
    return torch.nn.Sequential(*body[:-1]), batch, width


def bench_ddp(args, tdist, gloo, comm, MPI) -> list[str]:
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = comm.Get_rank()
    out = [
        "| model | parameters | gradient MiB | hpcdist step ms | gloo step ms | gloo / hpcdist |",
        "|---|---|---|---|---|---|",
    ]
    for kind, label in (("comm", "communication-bound"), ("compute", "compute-bound")):
        med = {}
        nparam = 0
        for backend, group in (("hpcdist", None), ("gloo", gloo), ("hpcdist2", None), ("gloo2", gloo)):
            model, batch, width = _model(kind)
            nparam = sum(p.numel() for p in model.parameters())
            ddp = DDP(model, process_group=group)
            opt = torch.optim.SGD(ddp.parameters(), lr=1e-3)
            g = torch.Generator().manual_seed(rank)
            x = torch.randn(batch, width, generator=g)
            y = torch.randn(batch, width, generator=g)
            times = []
            for step in range(args.warmup + args.steps):
                comm.Barrier()
                t0 = time.perf_counter()
                opt.zero_grad(set_to_none=False)
                loss = torch.nn.functional.mse_loss(ddp(x), y)
                loss.backward()
                opt.step()
                dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
                if step >= args.warmup:
                    times.append(dt)
            key = backend.rstrip("2")
            med[key] = min(med.get(key, float("inf")), statistics.median(times))  # two interleaved passes
            del ddp, opt, model
        out.append(
            f"| {label} | {nparam / 1e6:.2f} M | {nparam * 4 / 2**20:.0f} | {med['hpcdist'] * 1e3:.1f} "
            f"| {med['gloo'] * 1e3:.1f} | {med['gloo'] / med['hpcdist']:.2f}x |"
        )
    return out


def worker(args) -> None:
    import torch
    import torch.distributed as tdist
    from mpi4py import MPI

    import hpcdist
    import hpcdist.torch

    torch.set_num_threads(1)  # ranks share the machine's cores
    tdist.init_process_group("hpcdist")  # under mpiexec: rank and size from MPI, no MASTER_ADDR
    gloo = tdist.new_group(backend="gloo")
    comm = MPI.COMM_WORLD.Dup()
    rank, size = comm.Get_rank(), comm.Get_size()
    lines = []
    if "allreduce" in args.parts:
        lines += [f"### all_reduce, {size} ranks (SUM, float32, in place; best of {args.rounds} rounds)", ""]
        lines += bench_allreduce(args, tdist, gloo, comm, MPI)
        lines.append("")
    if "ddp" in args.parts:
        lines += [f"### DDP step, {size} ranks (median of {args.steps} steps after {args.warmup}, best of 2 passes)"]
        lines += ["", *bench_ddp(args, tdist, gloo, comm, MPI), ""]
    if rank == 0:
        print(
            f"# {MPI.Get_library_version().splitlines()[0].strip()}; mpi4py {__import__('mpi4py').__version__}; "
            f"torch {torch.__version__}; hpcdist {hpcdist.__version__}; host {socket.gethostname()}, "
            f"{os.cpu_count()} cpus; load average {os.getloadavg()[0]:.1f}"
        )
        print("\n".join(lines), flush=True)
    comm.Free()
    tdist.destroy_process_group()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", default="2,4", help="rank counts to launch (driver mode)")
    ap.add_argument("--worker", action="store_true", help="run as one rank of an mpiexec launch")
    ap.add_argument("--max-bytes", type=int, default=64 << 20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--parts", default="allreduce,ddp")
    args = ap.parse_args()
    if args.worker:
        worker(args)
        return
    mpiexec = os.path.join(os.path.dirname(sys.executable), "mpiexec")
    if not os.path.exists(mpiexec):
        mpiexec = shutil.which("mpiexec") or "mpiexec"
    rest = []
    skip = False
    for a in sys.argv[1:]:  # every option but --ranks goes to the workers
        if skip or a.startswith("--ranks"):
            skip = a == "--ranks"
            continue
        rest.append(a)
    for n in (int(x) for x in args.ranks.split(",") if x):
        env = dict(os.environ, OMP_NUM_THREADS="1")
        env.pop("MASTER_ADDR", None)
        cmd = [mpiexec, "-n", str(n), sys.executable, os.path.abspath(__file__), "--worker", *rest]
        rc = subprocess.call(cmd, env=env)
        if rc != 0:
            sys.exit(f"the {n}-rank launch failed (exit code {rc})")


if __name__ == "__main__":
    main()
