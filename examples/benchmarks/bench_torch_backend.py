"""torch.distributed over hpcdist: all_reduce latency/bandwidth and DDP step time, beside gloo.

Run (one run, 2 and 4 ranks; it launches itself under ``mpiexec``)::

    python examples/benchmarks/bench_torch_backend.py [--ranks 2,4] [--max-bytes N] [--rounds R] [--full]

or one rank count directly: ``mpiexec -n 2 python examples/benchmarks/bench_torch_backend.py --worker``.

With more ranks than cores (4 ranks on a 2-core machine) it runs a tenth of
the calls, 2 rounds and 3 DDP steps, and says so above its tables (``--full``
runs everything anyway): oversubscribed ranks that busy-poll take turns on
the cores and each call costs a scheduler time slice.

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
over the timed steps, the slowest rank's. Beside it, the same step without
DDP (no communication) and DDP's buckets all-reduced alone (25 MiB each,
issued asynchronously, then waited for); "comm hidden by backward" is
(no-comm step + all-reduce alone - DDP step) / all-reduce alone: the share
of the communication that overlapped compute.

(c) dispatch: one 8-byte all_reduce through each layer in turn (raw
mpi4py, hpcdist blocking and asynchronous, the backend's method called
directly, torch.distributed's function), so the differences between rows say
what each layer costs.
"""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import socket
import statistics
import subprocess
import sys
import time

from _timing import iterations, per_call  # this folder

SIZES = (8, 64, 512, 4096, 32768, 262144, 1 << 20, 4 << 20, 16 << 20, 64 << 20)


def bench_allreduce(args, tdist, gloo, comm, MPI) -> list[str]:
    import torch

    import hpcdist

    rows = []
    for nbytes in (n for n in SIZES if n <= args.max_bytes):
        t = torch.zeros(nbytes // 4, dtype=torch.float32)  # zeros: repeated sums stay finite
        a = t.numpy()  # the same memory
        it = max(3, iterations(nbytes, 1000) // args.scale)
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
                best[name] = min(best[name], per_call(fn, n, comm))
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


def bench_dispatch(args, tdist, comm, MPI) -> list[str]:
    """Where torch→hpcdist's time per call goes: one 8-byte all_reduce through each layer, added one by one."""
    import torch
    from torch._C import _distributed_c10d as c10d

    import hpcdist

    t = torch.zeros(2, dtype=torch.float32)
    a = t.numpy()
    pg = tdist.distributed_c10d._get_default_group()  # the backend's ProcessGroup itself
    blocking = c10d.AllreduceOptions()
    blocking.asyncOp = False

    def raw_nb() -> None:
        comm.Iallreduce(MPI.IN_PLACE, a).Wait()

    steps = [
        ("raw mpi4py `Allreduce`", lambda: comm.Allreduce(MPI.IN_PLACE, a)),
        ("raw mpi4py `Iallreduce` + `Wait`", raw_nb),
        ("`hpcdist.all_reduce(t)`", lambda: hpcdist.all_reduce(t)),
        ("`hpcdist.all_reduce(t, async_op=True).wait()`", lambda: hpcdist.all_reduce(t, async_op=True).wait()),
        ("the backend's `allreduce([t], opts)` (blocking)", lambda: pg.allreduce([t], blocking)),
        ("`torch.distributed.all_reduce(t)`", lambda: tdist.all_reduce(t)),
        ("`torch.distributed.all_reduce(t, async_op=True).wait()`", lambda: tdist.all_reduce(t, async_op=True).wait()),
    ]
    iters = max(100, 5000 // args.scale)
    best = [float("inf")] * len(steps)
    for _ in range(args.rounds):
        for i, (_, fn) in enumerate(steps):
            best[i] = min(best[i], per_call(fn, iters, comm))
    out = ["| path (8 B, float32, SUM) | µs per call | over the row above µs |", "|---|---|---|"]
    for i, (name, _) in enumerate(steps):
        extra = f"{(best[i] - best[i - 1]) * 1e6:+.1f}" if i else ""
        out.append(f"| {name} | {best[i] * 1e6:.1f} | {extra} |")
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


def _step_times(step, steps: int, warmup: int, comm, MPI) -> float:
    """Median seconds of ``step()`` over ``steps`` after ``warmup``, the slowest rank's each time."""
    times = []
    for i in range(warmup + steps):
        comm.Barrier()
        t0 = time.perf_counter()
        step()
        dt = comm.allreduce(time.perf_counter() - t0, op=MPI.MAX)
        if i >= warmup:
            times.append(dt)
    return statistics.median(times)


def _train_step(net, opt, x, y) -> None:
    import torch

    opt.zero_grad(set_to_none=False)
    torch.nn.functional.mse_loss(net(x), y).backward()
    opt.step()


def _comm_step(tdist, buckets, group) -> None:
    works = [tdist.all_reduce(b, group=group, async_op=True) for b in buckets]
    for w in works:
        w.wait()


def bench_ddp(args, tdist, gloo, comm, MPI) -> list[str]:
    """DDP step time per backend, and how much of the gradient all-reduce time backward hid.

    Per model and backend: ``ddp`` (the DDP step), ``local`` (the same step
    without DDP: no communication) and ``comm`` (DDP's buckets alone: the
    gradients all-reduced asynchronously in 25 MiB buckets, then waited for).
    ``local + comm - ddp`` is the communication time that overlapped compute;
    as a share of ``comm`` it is the "hidden" column (0 %: none, 100 %: all).
    """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    rank = comm.Get_rank()
    out = [
        "| model | parameters | gradient MiB | backend | step ms | no-comm step ms | all-reduce alone ms "
        "| comm hidden by backward | gloo / hpcdist |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for kind, label in (("comm", "communication-bound"), ("compute", "compute-bound")):
        med: dict[str, float] = {}
        nparam = 0
        for backend, group in (("hpcdist", None), ("gloo", gloo), ("hpcdist", None), ("gloo", gloo)):  # 2 passes
            model, batch, width = _model(kind)
            nparam = sum(p.numel() for p in model.parameters())
            g = torch.Generator().manual_seed(rank)
            x = torch.randn(batch, width, generator=g)
            y = torch.randn(batch, width, generator=g)
            for mode in ("ddp", "local", "comm"):
                if mode == "local" and backend == "gloo":  # no communication: once per pass
                    continue
                if mode == "comm":  # DDP's buckets alone: 25 MiB each, all issued, then waited for
                    buckets = list(torch.zeros(nparam).split(25 * 2**20 // 4))
                    step = functools.partial(_comm_step, tdist, buckets, group)
                else:
                    net = DDP(model, process_group=group) if mode == "ddp" else model
                    opt = torch.optim.SGD(net.parameters(), lr=1e-3)
                    step = functools.partial(_train_step, net, opt, x, y)
                key = mode if mode == "local" else f"{mode}-{backend}"
                t = _step_times(step, args.steps, args.warmup, comm, MPI)
                med[key] = min(med.get(key, float("inf")), t)
                del step
            del model
        for backend in ("hpcdist", "gloo"):
            ddp, local, alone = med[f"ddp-{backend}"], med["local"], med[f"comm-{backend}"]
            hidden = max(0.0, min(1.0, (local + alone - ddp) / alone)) if alone > 0 else 0.0
            ratio = f"{med['ddp-gloo'] / med['ddp-hpcdist']:.2f}x" if backend == "hpcdist" else ""
            out.append(
                f"| {label} | {nparam / 1e6:.2f} M | {nparam * 4 / 2**20:.0f} | {backend} | {ddp * 1e3:.1f} "
                f"| {local * 1e3:.1f} | {alone * 1e3:.1f} | {hidden * 100:.0f} % | {ratio} |"
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
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    if size > cores and not args.full:  # oversubscribed: busy-polling ranks share cores, every call is slow
        args.scale, args.rounds = 10, min(args.rounds, 2)
        args.steps, args.warmup = min(args.steps, 3), min(args.warmup, 1)
        lines += [
            f"({size} ranks on {cores} cores: oversubscribed, so 1/10 of the calls, {args.rounds} rounds, "
            f"{args.steps} steps; these numbers measure the oversubscription; --full runs everything)",
            "",
        ]
    if "allreduce" in args.parts:
        lines += [f"### all_reduce, {size} ranks (SUM, float32, in place; best of {args.rounds} rounds)", ""]
        lines += bench_allreduce(args, tdist, gloo, comm, MPI)
        lines.append("")
    if "dispatch" in args.parts:
        lines += [f"### torch dispatch, {size} ranks (best of {args.rounds} rounds)", ""]
        lines += [*bench_dispatch(args, tdist, comm, MPI), ""]
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
    ap.add_argument("--parts", default="dispatch,allreduce,ddp")
    ap.add_argument("--full", action="store_true", help="all calls and rounds even with more ranks than cores")
    args = ap.parse_args()
    args.scale = 1
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
