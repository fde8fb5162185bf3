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

Then one blocking and one asynchronous 1 MiB all_reduce, recording which
engine class's ``all_reduce`` each entered.

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
HpcdistProcessGroup.allreduce = _allreduce  # type: ignore[method-assign]  # recording done
record = {"events": list(events), "state": state, "buckets": len(issued)}

# -- which engine runs a 1 MiB all_reduce: the group's (shared memory on one node) when blocking,
#    MPI's non-blocking path when asynchronous (so it can overlap); counted by wrapping the engines
from hpcdist.backends.mpi import MPIEngine  # noqa: E402
from hpcdist.backends.shm.engine import ShmEngine  # noqa: E402

entered: list[str] = []
for cls in (ShmEngine, MPIEngine):  # the general path of all_reduce (arrays past the fast path), per engine class
    inner = cls.__dict__["_all_reduce"]

    def counted(self: Any, *a: Any, _inner: Any = inner, _name: str = cls.__name__, **k: Any) -> Any:
        entered.append(_name)
        return _inner(self, *a, **k)

    cls._all_reduce = counted  # type: ignore[method-assign]
big = torch.ones(1 << 18)  # 1 MiB of float32
paths: dict[str, Any] = {}
torch.distributed.all_reduce(big)
paths["blocking"] = list(entered)
entered.clear()
torch.distributed.all_reduce(big, async_op=True).wait()
paths["async"] = list(entered)
engine = torch.distributed.group.WORLD.hpcdist_group.engine("cpu")
paths["engine"] = type(engine).__name__
paths["window"] = engine.path("all_reduce", big.numel() * 4) if isinstance(engine, ShmEngine) else "mpi"
paths["value"] = bool(torch.equal(big, torch.full_like(big, float(n * n))))
save(outdir, "overlap", {**record, "paths": paths})
side.Free()
