"""Checkpoint save/load bandwidth: hpcdist.checkpoint beside raw disk I/O and torch.distributed.checkpoint.

Run:  mpiexec -n 2 python examples/benchmarks/bench_checkpoint.py [--mib 1024] [--dir DIR] [--repeat 3] [--no-dcp]

The state is ``--mib`` MiB of float32 in total, sharded evenly over the ranks
(each rank holds 1/N along dimension 0), written into ``--dir`` (default: a
temporary directory under $TMPDIR, removed at the end; at most two copies of
the state exist on disk at any time). Timed, each as the slowest rank between
two barriers, best of ``--repeat`` rounds interleaved:

* raw write: each rank writes its bytes to its own file with ``os.write`` and
  ``fsync`` (dd with conv=fsync); raw read: ``readinto`` of that file;
* ``checkpoint.save`` (fsync and atomic commit included) and ``checkpoint.load``
  with and without checksum verification; ``async_save``: the time the caller
  is blocked (host copy and planning) and the time until ``wait()`` returns;
* ``torch.distributed.checkpoint`` ``save``/``load`` of the same shards as a
  DTensor over gloo (when torch is installed and ``--no-dcp`` is not given).

Reads are cold: before each read, the files' pages are dropped from the page
cache with ``posix_fadvise(DONTNEED)`` (own files only). Rank 0 prints a
Markdown table of GB/s (10^9 bytes/s of state) and the ratio to raw disk.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import tempfile
import time
from pathlib import Path

import numpy as np
from mpi4py import MPI

import hpcdist as dist
from hpcdist import checkpoint as ck


def drop_cache(path: Path) -> None:
    files = [path] if path.is_file() else [p for p in path.rglob("*") if p.is_file()]
    for f in files:
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def timed(fn, comm) -> float:
    comm.Barrier()
    t0 = time.perf_counter()
    fn()
    dt = time.perf_counter() - t0
    return comm.allreduce(dt, op=MPI.MAX)


def raw_write(path: Path, arr: np.ndarray) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        view = memoryview(arr.reshape(-1).view(np.uint8))
        step = 64 << 20
        for i in range(0, len(view), step):
            os.write(fd, view[i : i + step])
        os.fsync(fd)
    finally:
        os.close(fd)


def raw_read(path: Path, out: np.ndarray) -> None:
    with open(path, "rb", buffering=0) as fh:
        view = memoryview(out.reshape(-1).view(np.uint8))
        pos = 0
        while pos < len(view):
            n = fh.readinto(view[pos:])
            if not n:
                raise OSError(f"short read of {path}")
            pos += n


def setup_dcp(rank: int, size: int):
    try:
        import torch
        import torch.distributed as tdist
        import torch.distributed.checkpoint as dcp
        from torch.distributed.tensor import Shard, init_device_mesh
    except ImportError:
        return None
    port = [None]
    if rank == 0:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port[0] = s.getsockname()[1]
    dist.broadcast_object_list(port, src=0)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port[0]))
    tdist.init_process_group("gloo", rank=rank, world_size=size)
    mesh = init_device_mesh("cpu", (size,))
    return torch, dcp, Shard, mesh


def one_round(root: Path, local: np.ndarray, sh: ck.Shard, comm, keep, dcp_parts) -> None:
    """Time every operation once; everything written is removed before returning."""
    rank = comm.Get_rank()
    if rank == 0:
        root.mkdir()
    comm.Barrier()
    target = np.ones_like(local)  # touched: page faults of a fresh array are not timed as reading
    raw = root / f"raw-{rank}.bin"
    keep("raw write (fsync)", timed(lambda: raw_write(raw, local), comm))
    drop_cache(raw)
    keep("raw read (cold)", timed(lambda: raw_read(raw, target), comm))
    assert np.array_equal(target, local)
    raw.unlink()

    path = root / "ck"
    keep("hpcdist save", timed(lambda: ck.save({"w": ck.Sharded(local, sh)}, path), comm))
    for verify in (True, False):
        comm.Barrier()
        if rank == 0:
            drop_cache(path)
        target[...] = 0
        name = "hpcdist load" + (" (verify)" if verify else " (no verify)")
        keep(name, timed(lambda v=verify: ck.load({"w": ck.Sharded(target, sh)}, path, verify=v), comm))
        assert np.array_equal(target, local)
    comm.Barrier()
    if rank == 0:
        shutil.rmtree(path)

    work: list = []
    apath = root / "async"
    blocked = timed(lambda: work.append(ck.async_save({"w": ck.Sharded(local, sh)}, apath)), comm)
    keep("hpcdist async_save: caller blocked", blocked)
    keep("hpcdist async_save: until committed", blocked + timed(lambda: work[0].wait(), comm))
    comm.Barrier()
    if rank == 0:
        shutil.rmtree(apath)

    if dcp_parts is not None:
        torch, dcp, Shard, mesh = dcp_parts
        from torch.distributed.tensor import DTensor

        dt = DTensor.from_local(torch.from_numpy(local), mesh, [Shard(0)], run_check=False)
        dpath = root / "dcp"
        keep("torch DCP save", timed(lambda: dcp.save({"w": dt}, checkpoint_id=str(dpath)), comm))
        comm.Barrier()
        if rank == 0:
            drop_cache(dpath)
        tgt = DTensor.from_local(torch.zeros(sh.sizes), mesh, [Shard(0)], run_check=False)
        keep("torch DCP load", timed(lambda: dcp.load({"w": tgt}, checkpoint_id=str(dpath)), comm))
        assert np.array_equal(tgt.to_local().numpy(), local)
    comm.Barrier()
    if rank == 0:
        shutil.rmtree(root)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=1024, help="total state size in MiB (float32)")
    ap.add_argument("--dir", default=None, help="where to write (default: a temporary directory)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--no-dcp", action="store_true", help="skip torch.distributed.checkpoint")
    args = ap.parse_args()

    dist.init_process_group("mpi")
    comm = MPI.COMM_WORLD.Dup()
    rank, size = dist.get_rank(), dist.get_world_size()
    box = [tempfile.mkdtemp(prefix="hpcdist-bench-ck-", dir=args.dir) if rank == 0 else None]
    dist.broadcast_object_list(box, src=0)
    root = Path(box[0])
    cols = 1024
    rows = args.mib * (1 << 20) // 4 // cols
    sh = ck.Shard.even((rows, cols), 0, rank, size)
    local = np.random.default_rng(rank).standard_normal(sh.sizes, dtype=np.float32)
    total = rows * cols * 4
    dcp_parts = None if args.no_dcp else setup_dcp(rank, size)
    best: dict[str, float] = {}

    def keep(name: str, t: float) -> None:
        best[name] = min(best.get(name, float("inf")), t)

    try:
        for rnd in range(args.repeat):
            one_round(root / f"round-{rnd}", local, sh, comm, keep, dcp_parts)
    finally:
        comm.Barrier()
        if rank == 0:
            shutil.rmtree(root, ignore_errors=True)
    if rank == 0:
        print(f"\n{size} ranks, {args.mib} MiB float32 state ({total / 1e9:.2f} GB), best of {args.repeat}\n")
        print("| operation | time (s) | GB/s | vs raw disk |")
        print("| --- | ---: | ---: | ---: |")
        for name, t in best.items():
            ref = best["raw read (cold)"] if "load" in name or "read" in name else best["raw write (fsync)"]
            print(f"| {name} | {t:.3f} | {total / t / 1e9:.2f} | {ref / t:.2f}x |")
    if dcp_parts is not None:
        dcp_parts[0].distributed.destroy_process_group()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
