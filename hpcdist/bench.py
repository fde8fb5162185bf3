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
paste into ``hpcdist/backends/shm/table.py``; ``--table-file PATH`` writes
them as a JSON file that ``HPCDIST_SHM_TABLE=PATH`` makes this machine's
groups use instead of the built-in table.
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
from functools import partial
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
        value = int(float(num) * _UNITS[unit])  # OverflowError: inf, 1e400
    except (ValueError, OverflowError):
        raise ValueError(f"--sizes: expected a size such as 8, 4K, 1M or 64MiB, got {text!r}") from None
    if value < 1:
        raise ValueError(f"--sizes: expected a size of at least 1 byte, got {text!r}")
    return value


def parse_sizes(spec: str) -> list[int]:
    """``"1K:64M"`` (powers of two, or ``"1K:64M:4"`` x4 steps) or ``"8,1K,1M"`` -> byte counts (at least one,
    each at least 1); ValueError naming ``--sizes``, what it expects and what it got."""
    if ":" in spec:
        parts = spec.split(":")
        expected = f"--sizes: expected LO:HI[:FACTOR] with 0 < LO <= HI and an integer FACTOR >= 2, got {spec!r}"
        if len(parts) > 3:
            raise ValueError(expected)
        lo, hi = _bytes(parts[0]), _bytes(parts[1])
        try:
            step = int(parts[2]) if len(parts) > 2 else 2
        except ValueError:
            raise ValueError(expected) from None
        if hi < lo or step < 2:
            raise ValueError(expected)
        out = []
        while lo <= hi:
            out.append(lo)
            lo *= step
        return out
    out = [_bytes(s) for s in spec.split(",") if s.strip()]
    if not out:
        raise ValueError(
            f"--sizes: expected at least one size (LO:HI[:FACTOR] or a list such as 8,1K,1M), got {spec!r}"
        )
    return out


def parse_ops(spec: str) -> list[str]:
    """``"all_reduce,broadcast"`` -> the operations, in order (at least one, each of :data:`OPS`);
    ValueError naming ``--ops``, the choices and what it got."""
    ops = [o.strip() for o in spec.split(",") if o.strip()]
    unknown = [o for o in ops if o not in BUS]
    if unknown or not ops:
        got = f"unknown {', '.join(map(repr, unknown))} in {spec!r}" if unknown else repr(spec)
        raise ValueError(f"--ops: expected a comma-separated list of {', '.join(OPS)}; got {got}")
    return ops


def parse_ranks(spec: str, size: int | None = None) -> list[int]:
    """``"2,4"`` -> the group sizes to sweep, sorted (empty: all ranks of the launch); with ``size`` (the
    launch's), each must be at most it. ValueError naming ``--ranks``."""
    try:
        ranks = sorted({int(r) for r in spec.split(",") if r.strip()})
    except ValueError:
        raise ValueError(f"--ranks: expected comma-separated integers such as 2,4, got {spec!r}") from None
    bad = [k for k in ranks if k < 1 or (size is not None and k > size)]
    if bad:
        most = f" and at most the {size} ranks of this launch" if size is not None else ""
        raise ValueError(f"--ranks: expected group sizes of at least 1{most}, got {spec!r}")
    return ranks


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


def _count(op: str, nbytes: int, n: int) -> int:
    """The float32 items of ``op``'s (full-size) array for a requested ``nbytes`` at ``n`` ranks: at least one,
    and a multiple of ``n`` where the array is split among the ranks. A row reports ``4 * count`` bytes, the
    size that moved (as nccl-tests reports the size it rounded to)."""
    count = max(1, nbytes // 4)
    if op in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"):
        count = max(n, count // n * n)
    return count


def _calls(
    op: str, nbytes: int, n: int, me: int, groups: dict[str, Any], raw: Any, tg: Any, sym: bool = False
) -> dict[str, Any]:
    """The call of every available variant for ``op`` on ``nbytes`` (float32 data); ``sym``: with the symmetric
    variant (allocating its arrays: collective over the group)."""
    from mpi4py import MPI

    import hpcdist as dist

    count = _count(op, nbytes, n)
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
    """Run the sweep (in an initialized world); every rank returns the rows (rank 0's are the ones printed).

    Every step (a communicator's making, one operation and size with all its
    variants) runs under hpcdist's watchdog with the world group's timeout: raw
    MPI calls cannot time out, so a rank stuck in one ends the job with a
    DistTimeoutError message naming the step (``MPI_Abort``, status 124)
    rather than leaving the others waiting.
    """
    from mpi4py import MPI

    from ._timed import watched
    from ._world import WORLD

    limit = WORLD.default_pg._timeout_s
    world = watched(MPI.COMM_WORLD.Dup, limit, "hpcdist bench: duplicating COMM_WORLD")
    me = world.Get_rank()
    ops, sizes, ranks = args.op_list, args.size_list, args.rank_list  # parsed once, by main's checks
    gloo = not args.no_gloo and watched(partial(_init_gloo, world), limit, "hpcdist bench: starting gloo")
    rows: list[dict[str, Any]] = []
    steps = len(ranks) * sum(1 if op == "barrier" else len(sizes) for op in ops)
    bar = _Progress(steps, me == 0 and (args.progress or sys.stderr.isatty()))
    for k in ranks:
        groups, raw, tg = watched(partial(_groups, k, gloo, world), limit, f"hpcdist bench: the groups of {k} ranks")
        for op in ops:
            for nbytes in sizes if op != "barrier" else sizes[:1]:
                what = f"hpcdist bench: {op} of {human_size(nbytes)} on {k} ranks"
                rows += watched(partial(_step, op, nbytes, k, world, groups, raw, tg, args), limit, what)
                bar.step(f"{op} {human_size(nbytes)} x {k} ranks")
        if raw != MPI.COMM_NULL:  # this pass's communicators (the groups go at destroy_process_group)
            raw.Free()
    world.Free()
    if gloo:
        import torch.distributed as tdist

        tdist.destroy_process_group()
    return rows


def _step(
    op: str, nbytes: int, k: int, world: Any, groups: dict[str, Any], raw: Any, tg: Any, args: argparse.Namespace
) -> list[dict[str, Any]]:
    """Time every variant of ``op`` at ``nbytes`` on ranks 0..k-1 (the others wait); this rank's rows."""
    me, rows = world.Get_rank(), []
    if me < k:
        calls = _calls(op, nbytes, k, me, groups, raw, tg, args.symmetric)
        iters = _iters(nbytes, args.iters)
        best = {v: float("inf") for v in calls}
        for _ in range(args.rounds):
            for v, fn in calls.items():
                best[v] = min(best[v], _time(fn, iters, raw))
        moved = 4 * _count(op, nbytes, k) if op != "barrier" else 0
        route = groups["hpcdist"].engine("cpu").path(op, moved)
        for v, t in best.items():
            rows.append(
                {
                    "op": op,
                    "ranks": k,
                    "bytes": moved,
                    "variant": v,
                    "path": route if v == "hpcdist" else v,
                    "time_us": t * 1e6,
                    "algbw_GBps": moved / t / 1e9,
                    "busbw_GBps": moved / t / 1e9 * BUS[op](k),
                }
            )
    world.Barrier()
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
            cells = [str(nbytes), by["hpcdist"]["path"] if "hpcdist" in by else "-"]
            cells += [f"{by[v]['time_us']:.1f}" if v in by else "-" for v in variants]
            cells += [f"{by[v]['busbw_GBps']:.2f}" if v in by else "-" for v in variants]
            cells.append(_ratio(by, "hpcdist"))
            if "symmetric" in variants:
                cells.append(_ratio(by, "symmetric"))
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def _ratio(by: dict[str, dict[str, Any]], variant: str) -> str:
    """raw's time over ``variant``'s (``-`` where a CSV of ``--from-csv`` lacks either)."""
    if "raw" not in by or variant not in by or not by[variant]["time_us"] > 0:
        return "-"
    return f"{by['raw']['time_us'] / by[variant]['time_us']:.2f}x"


def crossovers(rows: list[dict[str, Any]]) -> dict[str, dict[int, int | None]]:
    """Per shared-memory op and ranks measured: the smallest size from which ``shm`` beats ``raw`` at every measured
    size above it (None: not at the largest)."""
    from .backends.shm.table import OPS as SHM_OPS

    out: dict[str, dict[int, int | None]] = {}
    for op in [o for o in OPS if o in SHM_OPS]:
        for k in sorted({r["ranks"] for r in rows if r["op"] == op}):
            t = {(r["bytes"], r["variant"]): r["time_us"] for r in rows if r["op"] == op and r["ranks"] == k}
            lo = None
            for s in sorted({b for b, _ in t}, reverse=True):
                if t.get((s, "shm"), np.inf) < t.get((s, "raw"), 0.0):
                    lo = s
                else:
                    break
            out.setdefault(op, {})[k] = lo
    return out


def selection_rows(rows: list[dict[str, Any]]) -> str:
    """The shared-memory table's rows (Python, for ``hpcdist/backends/shm/table.py``) from :func:`crossovers`."""
    lines = ["TABLE: dict[str, dict[int, tuple[int, int]]] = {"]
    for op, per in crossovers(rows).items():
        cells = ", ".join(f"{k}: {'NEVER' if lo is None else f'({lo}, INF)'}" for k, lo in per.items())
        lines.append(f"    {op!r}: {{{cells}}},")
    lines.append("}")
    return "\n".join(lines)


#: a measured tensor form's crossover also stands for its list form (the same data movement) in a table file
_LIST_FORMS = {"all_gather_into_tensor": "all_gather", "reduce_scatter_tensor": "reduce_scatter"}


def table_file(rows: list[dict[str, Any]], machine: str) -> str:
    """The JSON table of ``HPCDIST_SHM_TABLE`` (``--table-file``) from the measured crossovers."""
    from .backends.shm import table

    out: dict[str, dict[int, tuple[int, int]]] = {}
    for op, per in crossovers(rows).items():
        out[op] = {k: table.NEVER if lo is None else (lo, table.INF) for k, lo in per.items()}
        if op in _LIST_FORMS and not any(r["op"] == _LIST_FORMS[op] for r in rows):
            out[_LIST_FORMS[op]] = out[op]
    date = time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()) + " (written by hpcdist bench --table-file)"
    return table.dumps(out, machine, date)


def _machine() -> str:
    """This machine in one line, for a table file: CPU model and count, OS, MPI library, NumPy."""
    import platform

    from mpi4py import MPI

    model = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), model)
    except OSError:
        pass
    return (
        f"{socket.gethostname()}: {model}, {os.cpu_count()} CPUs, {platform.system()} {platform.release()}, "
        f"{MPI.Get_library_version().splitlines()[0].strip()}, NumPy {np.__version__}"
    )


def write_csv(rows: list[dict[str, Any]], path: str) -> None:
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)


def read_csv(paths: list[str]) -> list[dict[str, Any]]:
    """The rows of earlier ``--csv`` files, typed as :func:`run` makes them (for ``--from-csv``).

    ValueError naming the file (and line) when one cannot be read, lacks a column, holds a value of the
    wrong kind, an unknown operation or variant, or no row at all."""
    types: dict[str, Callable[[str], Any]] = {
        "ranks": int, "bytes": int, "time_us": float, "algbw_GBps": float, "busbw_GBps": float,
    }  # fmt: skip
    columns = ("op", "ranks", "bytes", "variant", "path", "time_us", "algbw_GBps", "busbw_GBps")
    rows: list[dict[str, Any]] = []
    for path in paths:
        try:
            with open(path, newline="") as f:
                reader = csv.DictReader(f)
                if reader.fieldnames is None:
                    raise ValueError(
                        f"--from-csv {path!r}: expected a CSV written by hpcdist bench --csv, got an empty file"
                    )
                missing = [c for c in columns if c not in reader.fieldnames]
                if missing:
                    raise ValueError(
                        f"--from-csv {path!r}: expected a CSV written by hpcdist bench --csv, but its header lacks "
                        f"{', '.join(missing)}"
                    )
                before = len(rows)
                for row in reader:
                    rows.append(_typed(row, types, f"--from-csv {path!r} line {reader.line_num}"))
        except OSError as exc:
            raise ValueError(f"--from-csv: cannot read {path!r}: {exc.strerror or exc}") from None
        if len(rows) == before:
            raise ValueError(f"--from-csv {path!r}: expected rows of measurements, got none")
    return rows


def _typed(row: dict[str, str], types: dict[str, Callable[[str], Any]], where: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in row.items():
        try:
            out[k] = types.get(k, str)(v)
        except (TypeError, ValueError):
            kind = "an integer" if types[k] is int else "a number"
            raise ValueError(f"{where}: {k}: expected {kind}, got {v!r}") from None
    if out["op"] not in BUS:
        raise ValueError(f"{where}: op: expected one of {', '.join(OPS)}, got {out['op']!r}")
    if out["variant"] not in VARIANTS:
        raise ValueError(f"{where}: variant: expected one of {', '.join(VARIANTS)}, got {out['variant']!r}")
    return out


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
        raise ValueError("--plot: no row of an operation with sizes to plot (barrier's rows have none)")
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
    from .backends.shm.table import active
    from .config import shm_mode

    return (
        f"# hpcdist bench: hpcdist {__version__}, mpi4py {__import__('mpi4py').__version__}, "
        f"{MPI.Get_library_version().splitlines()[0].strip()}, NumPy {np.__version__}, Python "
        f"{platform.python_version()}\n# host {socket.gethostname()}, {os.cpu_count()} cpus, "
        f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, load average {os.getloadavg()[0]:.1f}; "
        f"HPCDIST_SHM={os.environ.get('HPCDIST_SHM', 'auto')}; selection table from: {active(shm_mode()).label()}"
    )


def _from_csv(args: argparse.Namespace) -> int:
    """``--from-csv``: the outputs of a sweep from its CSV files, without MPI (e.g. 2 ranks and 4 ranks measured
    in separate launches, plotted together)."""
    rows = read_csv(args.from_csv)
    if args.plot and all(r["op"] == "barrier" for r in rows):
        raise ValueError(f"--plot: the rows of {', '.join(args.from_csv)} are all barrier's: no size to plot")
    problem = _check_outputs(args)
    if problem:
        raise ValueError(problem)
    _outputs(rows, args)
    return 0


def _outputs(rows: list[dict[str, Any]], args: argparse.Namespace) -> None:
    """Print the tables (and ``--table``'s rows); write ``--csv`` and ``--plot``."""
    print(format_tables(rows))
    if args.table:
        print("\n# measured crossovers for hpcdist/backends/shm/table.py\n" + selection_rows(rows))
    if args.table_file:
        machine = args.machine or (
            _machine() if not args.from_csv else f"unknown (--from-csv {' '.join(args.from_csv)}; --machine names it)"
        )
        with open(args.table_file, "w") as f:
            f.write(table_file(rows, machine))
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
    p.add_argument(
        "--rounds", type=_number("--rounds", int, 1), default=3, help="interleaved rounds; the best is kept (default 3)"
    )
    p.add_argument(
        "--passes",
        type=_number("--passes", int, 1),
        default=1,
        help="sweep this many times and keep each cell's best (a slow spell of a shared machine then spoils "
        "one pass of a size, not its every round; default 1)",
    )
    p.add_argument(
        "--iters",
        type=_number("--iters", float, 0),
        default=1.0,
        help="scale the iterations per measurement (default 1)",
    )
    p.add_argument("--no-gloo", action="store_true", help="skip torch.distributed gloo even when torch is installed")
    p.add_argument(
        "--symmetric",
        action="store_true",
        help=f"also time hpcdist on symmetric-memory arrays (hpcdist.symmetric_memory) for {', '.join(SYMMETRIC_OPS)}",
    )
    p.add_argument("--csv", help="write every measurement to this CSV file")
    p.add_argument("--plot", help="write a PNG of bus bandwidth against size (needs matplotlib)")
    p.add_argument("--table", action="store_true", help="print the shared-memory selection table from the results")
    p.add_argument(
        "--table-file",
        metavar="PATH",
        help="write the shared-memory selection table from the results as JSON, for HPCDIST_SHM_TABLE=PATH",
    )
    p.add_argument(
        "--machine", default="", help="the machine --table-file names (default: this host's CPU, OS, MPI, NumPy)"
    )
    p.add_argument("--progress", action="store_true", help="show the progress bar even when stderr is no terminal")
    p.add_argument(
        "--from-csv",
        nargs="+",
        metavar="CSV",
        help="measure nothing: print the tables of earlier --csv files (merged; with --plot, --table, --csv)",
    )
    args = p.parse_args(argv)
    try:
        if args.from_csv:
            return _from_csv(args)
        _check_args(args)  # before MPI starts, on every rank
    except ValueError as exc:
        p.error(str(exc))
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's deprecation notes on *_tensor names
    import hpcdist as dist

    if not dist.is_initialized():
        dist.init_process_group("mpi")
    from mpi4py import MPI

    problem = _check_launch(args, MPI.COMM_WORLD)
    if problem:
        dist.destroy_process_group()
        if MPI.COMM_WORLD.Get_rank() == 0:
            p.print_usage(sys.stderr)
            sys.stderr.write(f"{p.prog}: error: {problem}\n")
        return 2
    rows = best_of([run(args) for _ in range(args.passes)])
    if MPI.COMM_WORLD.Get_rank() == 0:
        print(_header())
        _outputs(rows, args)
    dist.destroy_process_group()
    return 0


def _number(flag: str, kind: type, minimum: float) -> Callable[[str], Any]:
    """An argparse ``type`` of :func:`~hpcdist.config.parse_number` (its message, without argparse's prefix)."""
    from .config import parse_number

    def parse(text: str) -> Any:
        try:
            return parse_number(
                text, flag, minimum=minimum, unit="a number" if kind is float else "an integer", kind=kind
            )
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc).split(": ", 1)[1]) from None

    return parse


def _check_args(args: argparse.Namespace) -> None:
    """Every check that needs no MPI: sizes, ops, the --ranks list (against the launch's size where the
    launcher's variables give it), and a --plot that would have nothing to draw. Keeps the parsed sizes and
    ops in ``args`` (``size_list``, ``op_list``) for :func:`run`."""
    from .rendezvous.detect import launcher_rank_size

    args.size_list = parse_sizes(args.sizes)
    args.op_list = ops = parse_ops(args.ops)
    launch = launcher_rank_size()
    parse_ranks(args.ranks, launch[1] if launch else None)
    if args.plot and set(ops) == {"barrier"}:
        raise ValueError(f"--plot: barrier has no sizes to plot; add another operation to --ops, got {args.ops!r}")
    from .backends.shm.table import active
    from .config import shm_mode

    active(shm_mode())  # where the table applies, a wrong HPCDIST_SHM_TABLE is said here, before MPI starts


def _check_launch(args: argparse.Namespace, world: Any) -> str | None:
    """The checks that need the launch, before any measurement: --ranks against its size (every rank alike;
    kept in ``args.rank_list``), and whether rank 0 can write --csv and --plot (its answer broadcast under the
    default group's timeout). The message, or None."""
    import hpcdist as dist

    try:
        args.rank_list = parse_ranks(args.ranks, world.Get_size()) or [world.Get_size()]
    except ValueError as exc:
        return str(exc)
    answer = [_check_outputs(args) if world.Get_rank() == 0 else None]
    dist.broadcast_object_list(answer, src=0)
    return answer[0]


def _check_outputs(args: argparse.Namespace) -> str | None:
    """Why rank 0 could not write ``--csv`` / ``--plot`` after the sweep (a missing or read-only directory, a
    directory in the file's place, no matplotlib), or None."""
    for flag, path in (("--csv", args.csv), ("--plot", args.plot), ("--table-file", args.table_file)):
        if not path:
            continue
        folder = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            return f"{flag}: expected a file to write, got the directory {path!r}"
        if not os.path.isdir(folder) or not os.access(folder, os.W_OK | os.X_OK):
            return f"{flag}: expected a file in a writable directory, got {path!r} ({folder} is not one)"
    if args.plot:
        import importlib.util

        if importlib.util.find_spec("matplotlib") is None:
            return "--plot needs matplotlib: pip install 'hpcdist[plot]'"
    return None
