"""DDP's gradient all-reduces overlap backward: the order of events in one backward pass, recorded per rank.

The backend's ``allreduce`` is wrapped to record each call DDP's reducer
makes (with the Work it returned); each parameter's gradient hook records
when backward produced that gradient. The last hook of backward is the first
layer's (backward runs from the last layer to the first).

To make "not yet complete" a fact rather than a race, rank 1 holds its
backward at its first gradient hook until rank 0 has run its last gradient
hook (a message on a separate communicator, waited for up to 60 s): no
all-reduce can complete before rank 1 joins it. A backend that ran DDP's
all-reduces synchronously inside backward would block rank 0 in its first
bucket; rank 1 then goes on after 60 s without the message and the record
shows the all-reduce completed before the last hook (the test fails, it does
not hang).

Usage: mpiexec -n 2 python overlap.py hpcdist OUTDIR
"""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.nn as nn
from common import args, init, save
from mpi4py import MPI
from torch.nn.parallel import DistributedDataParallel as DDP

from hpcdist.torch.backend import HpcdistProcessGroup

backend, outdir = args()
rank, n = init(backend)
torch.set_num_threads(1)
side = MPI.COMM_WORLD.Dup()  # the hold-and-release messages, apart from the backend's traffic
LAYERS, WIDTH = 6, 256  # 257 KiB of gradient per layer; bucket_cap_mb=0.3: buckets of 2 layers after the 1st step
events: list[tuple[str, Any]] = []
issued: list[Any] = []  # the Works DDP got back, in issue order

_allreduce = HpcdistProcessGroup.allreduce


def recording_allreduce(self: Any, tensors: Any, opts: Any = None) -> Any:
    work = _allreduce(self, tensors, opts)
    events.append(("all_reduce", len(issued)))
    issued.append(work)
    return work


HpcdistProcessGroup.allreduce = recording_allreduce  # type: ignore[method-assign]

torch.manual_seed(0)
model = nn.Sequential(*[nn.Linear(WIDTH, WIDTH) for _ in range(LAYERS)])
ddp = DDP(model, bucket_cap_mb=0.3)
names = {id(p): name for name, p in model.named_parameters()}
last = {id(p) for p in model[0].parameters()}  # the first layer's gradients come last in backward
state: dict[str, Any] = {"hooks": 0, "released": False, "held_s": 0.0, "at_last": None}


def hook(p: torch.Tensor) -> Any:
    def fn(grad: torch.Tensor) -> torch.Tensor:
        if not state["on"]:
            return grad
        state["hooks"] += 1
        events.append(("grad", names[id(p)]))
        if rank == 1 and state["hooks"] == 1:  # hold backward until rank 0 ran its last hook
            t0 = time.monotonic()
            req = side.irecv(source=0, tag=7)
            while not (done := req.test())[0] and time.monotonic() - t0 < 60:
                time.sleep(0.001)
            state["released"], state["held_s"] = bool(done[0]), time.monotonic() - t0
            if not done[0]:
                req.Cancel()
        if rank == 0 and id(p) in last and state["hooks"] == 2 * LAYERS:  # the last gradient hook of backward
            state["at_last"] = {
                "issued": len(issued),
                "first_completed": bool(issued[0].is_completed()) if issued else None,
            }
            for peer in range(1, n):
                side.send("go", dest=peer, tag=7)
        return grad

    return fn


for prm in model.parameters():
    prm.register_hook(hook(prm))

x = torch.randn(8, WIDTH, generator=torch.Generator().manual_seed(rank))
state["on"] = False
for _ in range(2):  # DDP's first step reduces all gradients as one bucket, then rebuilds its buckets
    ddp(x).square().sum().backward()
side.Barrier()
events.clear()
issued.clear()
state["on"] = True
ddp(x).square().sum().backward()  # the recorded step
side.Barrier()
save(outdir, "overlap", {"events": events, "state": state, "buckets": len(issued)})
side.Free()
