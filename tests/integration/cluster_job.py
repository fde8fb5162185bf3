"""One rank of a job on the simulated cluster (run by tests/integration/test_cluster.py).

Started without an MPI launcher on one "node" (a namespace of
scripts/cluster-up) with RANK/WORLD_SIZE/MASTER_ADDR/MASTER_PORT set; joins
through ``sys.argv[1]`` (``env://`` or a ``tcp://`` URL), then checks what
it can against NumPy and prints one JSON line: what it saw (host name,
LOCAL_RANK, the device it would choose, its node group), whether each
collective matched NumPy, and a digest of each result so the test can
compare them bitwise across ranks.
"""

from __future__ import annotations

import hashlib
import json
import os
import socket
import sys
from datetime import timedelta

import numpy as np
from mpi4py import MPI

import hpcdist as dist
from hpcdist.gpu.device import device_for_local_rank

SIZES = (1, 7, 1000, 65536 + 3)  # uneven and even: all_reduce takes rails where the ranks per node divide the size
DTYPES = ("float32", "float64", "int64", "float16")


def data(rank: int, n: int, dtype: str, salt: int) -> np.ndarray:
    rng = np.random.default_rng(1000 * salt + rank)
    if dtype == "int64":
        return rng.integers(-1000, 1000, n).astype(np.int64)
    return rng.standard_normal(n).astype(dtype)


def digest(arr: np.ndarray) -> str:
    return hashlib.sha256(np.ascontiguousarray(arr).tobytes()).hexdigest()[:16]


def close(got: np.ndarray, want: np.ndarray) -> bool:
    if got.dtype.kind in "iub":
        return bool(np.array_equal(got, want))
    tol = 2e-2 if got.dtype == np.float16 else 1e-5
    return bool(np.allclose(got.astype(np.float64), want, rtol=tol, atol=tol))


def main() -> int:
    url = sys.argv[1]
    dist.init_process_group("mpi", init_method=url, timeout=timedelta(seconds=60))
    rank, size = dist.get_rank(), dist.get_world_size()
    report: dict = {
        "rank": rank,
        "host": socket.gethostname(),
        "local_rank": int(os.environ["LOCAL_RANK"]),
        "local_world_size": int(os.environ["LOCAL_WORLD_SIZE"]),
        "node_local_rank": dist.get_node_local_rank(),
        "device": device_for_local_rank(),  # CUDA_VISIBLE_DEVICES=0,1,2,3 and no CUDA runtime: local rank % 4
        "engine": type(dist.group.WORLD.engine("cpu")).__name__,
        "checks": {},
        "digests": {},
    }
    sub, _ = dist.new_subgroups()  # default: the ranks of this node
    report["subgroup"] = dist.get_process_group_ranks(sub)
    checks, digests = report["checks"], report["digests"]
    ops = {"sum": dist.ReduceOp.SUM, "avg": dist.ReduceOp.AVG, "max": dist.ReduceOp.MAX}
    for dtype in DTYPES:
        for n in SIZES:
            for opname, op in ops.items():
                if opname == "avg" and dtype == "int64":
                    continue
                x = data(rank, n, dtype, 1)
                everyone = np.stack([data(r, n, dtype, 1).astype(np.float64) for r in range(size)])
                want = {"sum": everyone.sum(0), "avg": everyone.mean(0), "max": everyone.max(0)}[opname]
                dist.all_reduce(x, op=op)
                key = f"all_reduce/{dtype}/{n}/{opname}"
                checks[key] = close(x, want)
                digests[key] = digest(x)
            factor = 0.5
            x = data(rank, n, dtype, 2)
            if dtype != "int64":
                dist.all_reduce(x, op=dist.ReduceOp.PREMUL_SUM(factor))
                want = sum(data(r, n, dtype, 2).astype(np.float64) * factor for r in range(size))
                key = f"all_reduce/{dtype}/{n}/premul_sum"
                checks[key] = close(x, want)
                digests[key] = digest(x)
            for root in range(size):
                x = data(rank, n, dtype, 3 + root)
                dist.broadcast(x, src=root)
                key = f"broadcast/{dtype}/{n}/root{root}"
                checks[key] = bool(np.array_equal(x, data(root, n, dtype, 3 + root)))
            inp = data(rank, n, dtype, 10)
            out = np.empty(n * size, dtype=dtype)
            dist.all_gather_into_tensor(out, inp)
            key = f"all_gather_into_tensor/{dtype}/{n}"
            checks[key] = bool(np.array_equal(out, np.concatenate([data(r, n, dtype, 10) for r in range(size)])))
            inp = data(rank, n * size, dtype, 11)
            out = np.empty(n, dtype=dtype)
            dist.reduce_scatter_tensor(out, inp)
            want = sum(data(r, n * size, dtype, 11).astype(np.float64) for r in range(size))[rank * n : (rank + 1) * n]
            key = f"reduce_scatter_tensor/{dtype}/{n}"
            checks[key] = close(out, want)
    # the node-local steps of the hierarchical path, and a group of this node's ranks, run in shared memory
    topo = dist.group.WORLD.engine("cpu")._topo
    report["node_steps"] = type(topo.steps).__name__ if topo is not None else None
    report["node_steps_segment"] = type(getattr(topo.steps, "_seg", None)).__name__ if topo is not None else None
    # nodes of equal size: all_reduce crosses them on rails (one communicator per node rank, one rank per node)
    report["rails"] = [] if topo is None or topo.rails == MPI.COMM_NULL else topo.rails.allgather(rank)
    big = data(rank, 1 << 18, "float32", 20)
    dist.all_reduce(big, group=sub)
    members = dist.get_process_group_ranks(sub)
    ref = data(members[0], 1 << 18, "float32", 20)
    for r in members[1:]:
        ref = ref + data(r, 1 << 18, "float32", 20)  # the shared-memory engine's fixed rank order
    checks["subgroup_all_reduce"] = bool(np.array_equal(big, ref))
    report["subgroup_engine"] = type(sub.engine("cpu")).__name__
    report["subgroup_segment"] = type(getattr(sub.engine("cpu"), "_seg", None)).__name__
    dist.destroy_process_group()
    print("REPORT " + json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
