"""``hpcdist bench``: collectives x sizes x rank counts on the current launch.

Run it under the launcher like any program::

    mpiexec -n 4 hpcdist bench --ops all_reduce,broadcast --sizes 1K:64M --ranks 2,4 --csv out.csv

For every operation, group size (the first ``k`` ranks of the launch) and
size, it times, interleaved in rounds (the best round of each is kept, which
takes most of the noise of a shared machine out):

* ``hpcdist``: the hpcdist call on a group with the default path selection
  (the shared-memory table, or what ``HPCDIST_SHM`` says);
* ``shm``: the same on a group forced onto shared memory (``HPCDIST_SHM=1``);
* ``symmetric`` (with ``--symmetric``): the hpcdist call of the first
  group on arrays of ``hpcdist.symmetric_memory`` (all_reduce, broadcast,
  and the inputs of all_gather_into_tensor and reduce_scatter_tensor);
* ``raw``: the same MPI collective called directly through mpi4py;
* ``gloo``: ``torch.distributed`` with the gloo backend (when torch is
  installed, unless ``--no-gloo``).

Sizes follow nccl-tests: all_gather's size is the gathered output,
reduce_scatter's the input, the others' the per-rank buffer; ``algbw`` is
size / time and ``busbw`` algbw times the operation's bus factor
(all_reduce ``2(n-1)/n``, all_gather/reduce_scatter/all_to_all ``(n-1)/n``,
broadcast/reduce 1), so busbw compares across rank counts. Rank 0 prints one
Markdown table per operation and rank count, and writes ``--csv`` /
``--plot`` (PNG; needs the ``plot`` extra, matplotlib). ``--table`` prints
the shared-memory selection table's rows from the measured crossovers, to
paste into ``hpcdist/backends/shm/table.py``.
"""

from __future__ import annotations

import argparse
import csv
import os
import socket
import sys
import time
import warnings
from collections.abc import Callable
from typing import Any

import numpy as np

from ._launchenv import free_port

__all__ = ["BUS", "OPS", "human_size", "main", "parse_sizes"]

#: op -> (bus factor(n), the variants' calls are built by _calls)
BUS: dict[str, Callable[[int], float]] = {
    "all_reduce": lambda n: 2 * (n - 1) / n,
    "broadcast": lambda n: 1.0,
    "reduce": lambda n: 1.0,
    "all_gather_into_tensor": lambda n: (n - 1) / n,
    "reduce_scatter_tensor": lambda n: (n - 1) / n,
    "all_to_all_single": lambda n: (n - 1) / n,
    "barrier": lambda n: 0.0,
}
OPS = tuple(BUS)
VARIANTS = ("hpcdist", "shm", "symmetric", "raw", "gloo")
#: the operations with a symmetric-memory variant (``--symmetric``)
SYMMETRIC_OPS = ("all_reduce", "broadcast", "all_gather_into_tensor", "reduce_scatter_tensor")
_UNITS = {"": 1, "B": 1, "K": 1 << 10, "KB": 1 << 10, "KIB": 1 << 10, "M": 1 << 20, "MB": 1 << 20, "MIB": 1 << 20}
_UNITS.update({"G": 1 << 30, "GB": 1 << 30, "GIB": 1 << 30})


def _bytes(text: str) -> int:
    t = text.strip().upper()
    num = t.rstrip("KMGIB")
    unit = t[len(num) :]
    try:
        if unit not in _UNITS:
            raise ValueError(unit)
        return int(float(num) * _UNITS[unit])
    except ValueError:
        raise ValueError(f"--sizes: {text!r} is not a size such as 8, 4K, 1M or 64MiB") from None


def parse_sizes(spec: str) -> list[int]:
    """``"1K:64M"`` (powers of two, or ``"1K:64M:4"`` x4 steps) or ``"8,1K,1M"`` -> byte counts."""
    if ":" in spec:
        parts = spec.split(":")
        lo, hi = _bytes(parts[0]), _bytes(parts[1])
        step = int(parts[2]) if len(parts) > 2 else 2
        if lo <= 0 or hi < lo or step < 2:
            raise ValueError(f"--sizes {spec!r}: expected LO:HI[:FACTOR] with 0 < LO <= HI and FACTOR >= 2")
        out = []
        while lo <= hi:
            out.append(lo)
            lo *= step
        return out
    return [_bytes(s) for s in spec.split(",") if s.strip()]


def human_size(n: float) -> str:
    """``1048576`` -> ``"1 MiB"`` (whole binary units only; else bytes)."""
    for unit, f in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= f and n % f == 0:
            return f"{n // f:g} {unit}"
    return f"{n:g} B"


def _iters(nbytes: int, scale: float) -> int:
    base = 400 if nbytes <= 64 << 10 else 100 if nbytes <= 1 << 20 else 20 if nbytes <= 8 << 20 else 5
    return max(2, int(base * scale))


class _Progress:
    """A one-line progress bar on rank 0's stderr (only on a terminal, or with ``--progress``)."""

    def __init__(self, total: int, on: bool) -> None:
        self.total, self.done, self.on = total, 0, on

    def step(self, what: str) -> None:
        self.done += 1
        if self.on:
            width = 30
            fill = width * self.done // max(self.total, 1)
            sys.stderr.write(f"\r[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} {what:<40}")
            if self.done == self.total:
                sys.stderr.write("\n")
            sys.stderr.flush()


def _calls(
    op: str, nbytes: int, n: int, me: int, groups: dict[str, Any], raw: Any, tg: Any, sym: bool = False
) -> dict[str, Any]:
    """The call of every available variant for ``op`` on ``nbytes`` (float32 data); ``sym``: with the symmetric
    variant (allocating its arrays: collective over the group)."""
    from mpi4py import MPI

    import hpcdist as dist

    count = max(1, nbytes // 4)
    if op in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"):
        count = max(n, count // n * n)
    a = np.zeros(count, np.float32)
    a2 = np.zeros(count, np.float32)
    small = np.zeros(count // n, np.float32)
    out: dict[str, Any] = {}
    torch = sys.modules.get("torch") if tg is not None else None
    t = t2 = ts = None
    if torch is not None:
        t, t2, ts = torch.zeros(count), torch.zeros(count), torch.zeros(count // n)
    tdist = sys.modules.get("torch.distributed")
    for name in ("hpcdist", "shm"):
        g = groups[name]
        if op == "all_reduce":
            out[name] = lambda g=g: dist.all_reduce(a, group=g)
        elif op == "broadcast":
            out[name] = lambda g=g: dist.broadcast(a, group=g, group_src=0)
        elif op == "reduce":
            out[name] = lambda g=g: dist.reduce(a, group=g, group_dst=0)
        elif op == "all_gather_into_tensor":
            out[name] = lambda g=g: dist.all_gather_into_tensor(a, small, group=g)
        elif op == "reduce_scatter_tensor":
            out[name] = lambda g=g: dist.reduce_scatter_tensor(small, a, group=g)
        elif op == "all_to_all_single":
            out[name] = lambda g=g: dist.all_to_all_single(a2, a, group=g)
        else:
            out[name] = lambda g=g: dist.barrier(group=g)
    if sym and op in SYMMETRIC_OPS:
        out["symmetric"] = _symmetric_call(op, count, n, groups["hpcdist"], a, small)
    raw_calls: dict[str, Callable[[], Any]] = {
        "all_reduce": lambda: raw.Allreduce(MPI.IN_PLACE, a),
        "broadcast": lambda: raw.Bcast(a, 0),
        "reduce": lambda: raw.Reduce(MPI.IN_PLACE if me == 0 else a, a if me == 0 else None, root=0),
        "all_gather_into_tensor": lambda: raw.Allgather(small, a),
        "reduce_scatter_tensor": lambda: raw.Reduce_scatter_block(a, small),
        "all_to_all_single": lambda: raw.Alltoall(a, a2),
        "barrier": raw.Barrier,
    }
    out["raw"] = raw_calls[op]
    if tdist is not None and t is not None:
        gloo_calls: dict[str, Callable[[], Any]] = {
            "all_reduce": lambda: tdist.all_reduce(t, group=tg),
            "broadcast": lambda: tdist.broadcast(t, group=tg, group_src=0),
            "reduce": lambda: tdist.reduce(t, group=tg, group_dst=0),
            "all_gather_into_tensor": lambda: tdist.all_gather_into_tensor(t, ts, group=tg),
            "reduce_scatter_tensor": lambda: tdist.reduce_scatter_tensor(ts, t, group=tg),
            "all_to_all_single": lambda: tdist.all_to_all_single(t2, t, group=tg),
            "barrier": lambda: tdist.barrier(group=tg),
        }
        out["gloo"] = gloo_calls[op]
    return out


def _symmetric_call(op: str, count: int, n: int, g: Any, a: np.ndarray, small: np.ndarray) -> Callable[[], Any]:
    """``op`` on arrays of a new symmetric allocation of ``g`` (collective); the outputs stay ordinary."""
    import hpcdist as dist
    from hpcdist import symmetric_memory

    if op == "all_gather_into_tensor":
        s = symmetric_memory.empty(count // n, group=g)
        return lambda: dist.all_gather_into_tensor(a, s, group=g)
    s = symmetric_memory.empty(count, group=g)
    if op == "reduce_scatter_tensor":
        return lambda: dist.reduce_scatter_tensor(small, s, group=g)
    if op == "broadcast":
        return lambda: dist.broadcast(s, group=g, group_src=0)
    return lambda: dist.all_reduce(s, group=g)


def _time(fn: Callable[[], Any], iters: int, comm: Any) -> float:
    """Seconds per call: the slowest rank's mean over ``iters`` calls; NaN when the call is unsupported."""
    from mpi4py import MPI

    ok = 1
    try:
        fn()  # warm up (and set up segments)
    except Exception:
        ok = 0
    if not comm.allreduce(ok, op=MPI.MIN):
        return float("nan")
    comm.Barrier()
    t0 = time.perf_counter()
    for _ in range(iters):
        fn()
    return float(comm.allreduce((time.perf_counter() - t0) / iters, op=MPI.MAX))


def _groups(k: int, gloo: bool, world: Any) -> tuple[dict[str, Any], Any, Any]:
    """hpcdist groups (auto and forced shared memory), a raw communicator and a gloo group of ranks 0..k-1."""
    import hpcdist as dist

    ranks = list(range(k))
    me = world.Get_rank()
    groups: dict[str, Any] = {"hpcdist": dist.new_group(ranks)}
    saved = os.environ.get("HPCDIST_SHM")
    os.environ["HPCDIST_SHM"] = "1"
    try:
        groups["shm"] = dist.new_group(ranks)
        if me < k:
            groups["shm"].engine("cpu")  # built while HPCDIST_SHM=1
    finally:
        if saved is None:
            os.environ.pop("HPCDIST_SHM", None)
        else:
            os.environ["HPCDIST_SHM"] = saved
    from mpi4py import MPI

    raw = world.Split(0 if me < k else MPI.UNDEFINED, me)
    tg = None
    if gloo:
        import torch.distributed as tdist

        tg = tdist.new_group(ranks)
    return groups, raw, tg


def _init_gloo(world: Any) -> bool:
    try:
        import torch.distributed as tdist
    except ImportError:
        return False
    port = world.bcast(free_port("127.0.0.1") if world.Get_rank() == 0 else None, root=0)
    tdist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=world.Get_rank(), world_size=world.Get_size()
    )
    return True


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run the sweep; every rank returns the rows (rank 0's are the ones printed)."""
    from mpi4py import MPI

    import hpcdist as dist

    if not dist.is_initialized():
        dist.init_process_group("mpi")
    world = MPI.COMM_WORLD.Dup()
    n_world, me = world.Get_size(), world.Get_rank()
    ops = [o.strip() for o in args.ops.split(",") if o.strip()]
    for o in ops:
        if o not in BUS:
            raise SystemExit(f"hpcdist bench: unknown op {o!r}; expected some of {', '.join(OPS)}")
    ranks = sorted({int(r) for r in args.ranks.split(",")}) if args.ranks else [n_world]
    ranks = [k for k in ranks if 2 <= k <= n_world] or [n_world]
    sizes = parse_sizes(args.sizes)
    gloo = not args.no_gloo and _init_gloo(world)
    rows: list[dict[str, Any]] = []
    steps = len(ranks) * sum(1 if op == "barrier" else len(sizes) for op in ops)
    bar = _Progress(steps, me == 0 and (args.progress or sys.stderr.isatty()))
    for k in ranks:
        groups, raw, tg = _groups(k, gloo, world)
        for op in ops:
            for nbytes in sizes if op != "barrier" else sizes[:1]:
                if me < k:
                    calls = _calls(op, nbytes, k, me, groups, raw, tg, args.symmetric)
                    iters = _iters(nbytes, args.iters)
                    best = {v: float("inf") for v in calls}
                    for _ in range(args.rounds):
                        for v, fn in calls.items():
                            best[v] = min(best[v], _time(fn, iters, raw))
                    path = groups["hpcdist"].engine("cpu")
                    route = path.path(op, nbytes)
                    for v, t in best.items():
                        factor = BUS[op](k)
                        rows.append(
                            {
                                "op": op,
                                "ranks": k,
                                "bytes": nbytes if op != "barrier" else 0,
                                "variant": v,
                                "path": route if v == "hpcdist" else v,
                                "time_us": t * 1e6,
                                "algbw_GBps": nbytes / t / 1e9 if op != "barrier" else 0.0,
                                "busbw_GBps": nbytes / t / 1e9 * factor if op != "barrier" else 0.0,
                            }
                        )
                world.Barrier()
                bar.step(f"{op} {human_size(nbytes)} x {k} ranks")
    if gloo:
        import torch.distributed as tdist

        tdist.destroy_process_group()
    return rows


def best_of(passes: list[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """The rows of several sweeps merged: each (op, ranks, bytes, variant) at its best time, bandwidths with it."""
    best: dict[tuple[Any, ...], dict[str, Any]] = {}
    for rows in passes:
        for r in rows:
            key = (r["op"], r["ranks"], r["bytes"], r["variant"])
            if key not in best or r["time_us"] < best[key]["time_us"]:
                best[key] = r
    return list(best.values())


def format_tables(rows: list[dict[str, Any]]) -> str:
    """One Markdown table per (op, ranks): time and bus bandwidth of each variant, hpcdist / raw."""
    out = []
    keys = sorted({(r["op"], r["ranks"]) for r in rows}, key=lambda x: (OPS.index(x[0]), x[1]))
    for op, k in keys:
        mine = [r for r in rows if r["op"] == op and r["ranks"] == k]
        variants = [v for v in VARIANTS if any(r["variant"] == v for r in mine)]
        out.append(f"\n### {op}, {k} ranks (float32)\n")
        head = ["bytes", "path"] + [f"{v} µs" for v in variants] + [f"{v} busbw GB/s" for v in variants]
        head.append("hpcdist/raw")
        if "symmetric" in variants:
            head.append("symmetric/raw")
        out.append("| " + " | ".join(head) + " |")
        out.append("|" + "---|" * len(head))
        for nbytes in sorted({r["bytes"] for r in mine}):
            by = {r["variant"]: r for r in mine if r["bytes"] == nbytes}
            cells = [str(nbytes), by["hpcdist"]["path"]]
            cells += [f"{by[v]['time_us']:.1f}" for v in variants]
            cells += [f"{by[v]['busbw_GBps']:.2f}" for v in variants]
            cells.append(f"{by['raw']['time_us'] / by['hpcdist']['time_us']:.2f}x")
            if "symmetric" in variants:
                cells.append(f"{by['raw']['time_us'] / by['symmetric']['time_us']:.2f}x" if "symmetric" in by else "")
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def selection_rows(rows: list[dict[str, Any]]) -> str:
    """The shared-memory table's rows: per op and ranks, the smallest size from which ``shm`` beats ``raw`` at every
    measured size (else NEVER)."""
    from .backends.shm.table import OPS as SHM_OPS

    lines = ["TABLE: dict[str, dict[int, tuple[int, int]]] = {"]
    for op in [o for o in OPS if o in SHM_OPS]:
        per: dict[int, str] = {}
        for k in sorted({r["ranks"] for r in rows if r["op"] == op}):
            t = {(r["bytes"], r["variant"]): r["time_us"] for r in rows if r["op"] == op and r["ranks"] == k}
            sizes = sorted({b for b, _ in t})
            lo = None
            for s in reversed(sizes):
                if t.get((s, "shm"), np.inf) < t.get((s, "raw"), 0.0):
                    lo = s
                else:
                    break
            per[k] = "NEVER" if lo is None else f"({lo}, INF)"
        if per:
            lines.append(f"    {op!r}: {{" + ", ".join(f"{k}: {v}" for k, v in per.items()) + "},")
    lines.append("}")
    return "\n".join(lines)


def write_csv(rows: list[dict[str, Any]], path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def read_csv(paths: list[str]) -> list[dict[str, Any]]:
    """The rows of earlier ``--csv`` files, typed as :func:`run` makes them (for ``--from-csv``)."""
    types = {"ranks": int, "bytes": int, "time_us": float, "algbw_GBps": float, "busbw_GBps": float}
    rows = []
    for path in paths:
        with open(path, newline="") as f:
            for row in csv.DictReader(f):
                rows.append({k: types.get(k, str)(v) for k, v in row.items()})
    return rows


def write_plot(rows: list[dict[str, Any]], path: str) -> None:
    """Bus bandwidth against size, one panel per (op, ranks), one line per variant (needs matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise SystemExit("hpcdist bench --plot needs matplotlib: pip install 'hpcdist[plot]'") from None
    keys = sorted({(r["op"], r["ranks"]) for r in rows if r["op"] != "barrier"}, key=lambda x: (OPS.index(x[0]), x[1]))
    if not keys:
        return
    cols = min(3, len(keys))
    nrows = -(-len(keys) // cols)
    fig, axes = plt.subplots(nrows, cols, figsize=(5 * cols, 3.6 * nrows), squeeze=False)
    for ax, (op, k) in zip(axes.flat, keys):
        for v in VARIANTS:
            pts = sorted(
                (r["bytes"], r["busbw_GBps"]) for r in rows if (r["op"], r["ranks"], r["variant"]) == (op, k, v)
            )
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=v)
        ax.set_xscale("log", base=2)
        ax.set_title(f"{op}, {k} ranks")
        ax.set_xlabel("bytes")
        ax.set_ylabel("busbw GB/s")
        ax.legend(fontsize=8)
    for ax in list(axes.flat)[len(keys) :]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _header() -> str:
    import platform

    from mpi4py import MPI

    from ._version import __version__
    from .backends.shm.table import DATE, MACHINE

    return (
        f"# hpcdist bench: hpcdist {__version__}, mpi4py {__import__('mpi4py').__version__}, "
        f"{MPI.Get_library_version().splitlines()[0].strip()}, NumPy {np.__version__}, Python "
        f"{platform.python_version()}\n# host {socket.gethostname()}, {os.cpu_count()} cpus, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.1f}; "
        f"HPCDIST_SHM={os.environ.get('HPCDIST_SHM', 'auto')}; selection table from: {MACHINE}, {DATE}"
    )


def _from_csv(args: argparse.Namespace) -> int:
    """``--from-csv``: the outputs of a sweep from its CSV files, without MPI (e.g. 2 ranks and 4 ranks measured
    in separate launches, plotted together)."""
    _outputs(read_csv(args.from_csv), args)
    return 0


def _outputs(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Print the tables (and ``--table``'s rows); write ``--csv`` and ``--plot``."""
    print(format_tables(rows))
    if args.table:
        print("\n# measured crossovers for hpcdist/backends/shm/table.py\n" + selection_rows(rows))
    if args.csv:
        write_csv(rows, args.csv)
    if args.plot:
        write_plot(rows, args.plot)


def main(argv: list[str]) -> int:
    """Entry point of ``hpcdist bench`` (run it under mpiexec / srun / ``hpcdist run``)."""
    p = argparse.ArgumentParser(prog="hpcdist bench", description=__doc__.split("\n\n")[0])
    p.add_argument("--ops", default="all_reduce", help=f"comma-separated, of: {', '.join(OPS)} (default all_reduce)")
    p.add_argument("--sizes", default="1K:64M:4", help="LO:HI[:FACTOR] or a list, e.g. 8,1K,1M (default 1K:64M:4)")
    p.add_argument("--ranks", default="", help="group sizes to sweep, e.g. 2,4 (default: all ranks of the launch)")
    p.add_argument("--rounds", type=int, default=3, help="interleaved rounds; the best is kept (default 3)")
    p.add_argument(
        "--passes",
        type=int,
        default=1,
        help="sweep this many times and keep each cell's best (a slow spell of a shared machine then spoils "
        "one pass of a size, not its every round; default 1)",
    )
    p.add_argument("--iters", type=float, default=1.0, help="scale the iterations per measurement (default 1)")
    p.add_argument("--no-gloo", action="store_true", help="skip torch.distributed gloo even when torch is installed")
    p.add_argument(
        "--symmetric",
        action="store_true",
        help=f"also time hpcdist on symmetric-memory arrays (hpcdist.symmetric_memory) for {', '.join(SYMMETRIC_OPS)}",
    )
    p.add_argument("--csv", help="write every measurement to this CSV file")
    p.add_argument("--plot", help="write a PNG of bus bandwidth against size (needs matplotlib)")
    p.add_argument("--table", action="store_true", help="print the shared-memory selection table from the results")
    p.add_argument("--progress", action="store_true", help="show the progress bar even when stderr is no terminal")
    p.add_argument(
        "--from-csv",
        nargs="+",
        metavar="CSV",
        help="measure nothing: print the tables of earlier --csv files (merged; with --plot, --table, --csv)",
    )
    args = p.parse_args(argv)
    if args.from_csv:
        return _from_csv(args)
    try:
        parse_sizes(args.sizes)  # bad sizes fail before MPI starts
    except ValueError as exc:
        p.error(str(exc))
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's deprecation notes on *_tensor names
    if args.passes < 1:
        p.error(f"--passes must be >= 1, got {args.passes}")
    rows = best_of([run(args) for _ in range(args.passes)])
    from mpi4py import MPI

    if MPI.COMM_WORLD.Get_rank() == 0:
        print(_header())
        _outputs(rows, args)
    import hpcdist as dist

    dist.destroy_process_group()
    return 0
