"""DETAIL mode over backend "hpcdist": all-reduces whose sizes or dtypes differ between ranks are refused.

Run with HPCDIST_DEBUG=DETAIL (or TORCH_DISTRIBUTED_DEBUG=DETAIL). The backend's
all-reduces of CPU tensors take the MPI engine's non-blocking path; without the
check there, ranks passing 3 + rank items got each a different silent result.
Every rank saves, per case, the error it got (or the result), then the sum of
a matched all_reduce (the group stays usable).

Usage: mpiexec -n N python detail.py hpcdist OUTDIR
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from common import args, init, save

backend, outdir = args()
rank, n = init(backend)
CASES = {
    "size": lambda: torch.ones(3 + rank),
    "dtype": lambda: torch.ones(4, dtype=torch.float32 if rank == 0 else torch.float64),
}
out: dict[str, object] = {}
for name, make in CASES.items():
    for asynchronous in (False, True):
        x = make()
        try:
            work = dist.all_reduce(x, async_op=asynchronous)
            if asynchronous:
                work.wait()
            out[f"{name} async={asynchronous}"] = x
        except Exception as exc:
            out[f"{name} async={asynchronous}"] = f"{type(exc).__name__}: {exc}"
        y = torch.ones(2)
        dist.all_reduce(y)
        out[f"{name} async={asynchronous} after"] = y
save(outdir, "detail", out)
dist.destroy_process_group()
