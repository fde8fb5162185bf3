"""torch code that asks a group for its device types, over backend "hpcdist" and gloo (the reference).

* the group's ``_device_types`` and the object collectives' device;
* ``set_model_state_dict`` with ``broadcast_from_rank0``: rank 0 alone holds
  the full state dict (known values, a formula per parameter) and torch
  broadcasts it into an FSDP2 model sharded over every rank;
* ``torch.distributed.checkpoint.async_save`` of that model over a group of its
  own, while this thread all-reduces over the default group, then ``dcp.load``
  into a fresh model;
* (hpcdist only) a group made with the device map ``cpu:gloo,cuda:hpcdist``:
  the backend torch gets for each device type.

Every rank saves the full values it ends with (``full_tensor()``, a collective).

Usage: mpiexec -n N python state_dict.py BACKEND OUTDIR CHECKPOINT_DIR
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from common import args, init, save, sharded_model
from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict
from torch.distributed.distributed_c10d import _get_object_coll_device

backend, outdir = args()
ckpt = sys.argv[3]
rank, n = init(backend)


def model() -> nn.Module:
    torch.manual_seed(1234 + rank)  # different on every rank: only the broadcast makes them agree
    return sharded_model()


def formula(i: int, shape: torch.Size) -> torch.Tensor:
    return torch.arange(shape.numel(), dtype=torch.float32).reshape(shape) / (i + 3) + i


def full_values(m: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.full_tensor() for k, v in sorted(m.state_dict().items())}  # collective


out: dict[str, object] = {
    "device_types": sorted(d.type for d in dist.group.WORLD._device_types),
    "object_device": _get_object_coll_device(dist.group.WORLD),
}

m = model()
shapes = {k: v.shape for k, v in sorted(m.state_dict().items())}
full = {k: formula(i, s) for i, (k, s) in enumerate(shapes.items())} if rank == 0 else {}
set_model_state_dict(m, full, options=StateDictOptions(full_state_dict=True, broadcast_from_rank0=True))
out["broadcast"] = full_values(m)

# torch's advice: a group of its own for the checkpoint's collectives, which run on a background thread
# while this one goes on with the default group's
ckpt_group = dist.new_group()
future = dcp.async_save({"model": m.state_dict()}, checkpoint_id=ckpt, process_group=ckpt_group)
sums = []
for i in range(20):
    t = torch.full((1000,), float(rank + i))
    dist.all_reduce(t)
    sums.append(t)
future.result()
out["sums_during_save"] = torch.stack(sums)
fresh = model()
state = {"model": fresh.state_dict()}
dcp.load(state, checkpoint_id=ckpt)
fresh.load_state_dict(state["model"])
out["async_saved"] = full_values(fresh)

if backend == "hpcdist":  # a device map naming another backend: torch gets that backend for its device
    routed = dist.new_group(backend="cpu:gloo,cuda:hpcdist")
    try:
        routed._get_backend(torch.device("xpu"))
        unserved = ""
    except RuntimeError as exc:
        unserved = str(exc)
    out["routed"] = (
        sorted(d.type for d in routed._device_types),
        type(routed._get_backend(torch.device("cpu"))).__name__,
        routed._get_backend(torch.device("cuda")) is routed,
        unserved,
    )
save(outdir, "state_dict", out)
dist.destroy_process_group()
