"""All-reduce of CuPy arrays on GPUs, one rank per GPU.

    hpcdist run -n 2 --map-gpu examples/gpu_allreduce.py
    sbatch jobs/slurm_gpu.sbatch examples/gpu_allreduce.py

Each rank takes the GPU of its local rank (``LOCAL_RANK``, set by ``hpcdist
run`` and the Slurm template; with ``--map-gpu`` each rank sees exactly one
device), fills an array with ``rank + 1`` and all-reduces it: every element
becomes ``1 + 2 + ... + world_size``. The backend is NCCL for CUDA arrays when
CuPy's NCCL is there (``"cpu:mpi,cuda:nccl"``), else MPI (which then needs a
CUDA-aware MPI; ``hpcdist info`` tells). Without CuPy or a GPU it prints a skip
message and exits 0.
"""

from __future__ import annotations

import os
import sys
import time


def gpu_or_reason() -> tuple[object | None, str]:
    try:
        import cupy
    except ImportError:
        return None, "CuPy is not installed (pip install cupy-cuda12x)"
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # no driver, no device
        return None, f"no usable GPU ({type(exc).__name__}: {str(exc).splitlines()[0]})"
    if count < 1:
        return None, "no GPU visible (CUDA_VISIBLE_DEVICES?)"
    return cupy, ""


def main() -> int:
    cupy, reason = gpu_or_reason()
    if cupy is None:
        from hpcdist.rendezvous.detect import launcher_rank_size

        rank_size = launcher_rank_size()
        if os.environ.get("RANK", str(rank_size[0] if rank_size else 0)) == "0":  # one message, from rank 0
            print(f"gpu_allreduce.py: skipped, {reason}", flush=True)
        return 0

    import hpcdist as dist

    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    device = local_rank % cupy.cuda.runtime.getDeviceCount()
    cupy.cuda.Device(device).use()
    backend = "cpu:mpi,cuda:nccl" if dist.is_nccl_available() else "mpi"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()

    n = 1 << 24  # 16 Mi float32 = 64 MiB
    x = cupy.full(n, rank + 1, dtype=cupy.float32)
    dist.all_reduce(x)  # warm-up (and the check below)
    expected = world * (world + 1) / 2
    ok = bool(cupy.all(x == expected))
    cupy.cuda.Device().synchronize()
    t0 = time.perf_counter()
    for _ in range(5):
        dist.all_reduce(x)
    cupy.cuda.Device().synchronize()
    dt = (time.perf_counter() - t0) / 5
    print(
        f"rank {rank}/{world} on GPU {device} ({backend}): all_reduce {'ok' if ok else 'WRONG'}, "
        f"64 MiB in {dt * 1e3:.2f} ms",
        flush=True,
    )
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
