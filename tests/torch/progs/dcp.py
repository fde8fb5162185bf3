"""torch.distributed.checkpoint over backend "hpcdist": save sharded at one world size, load at another.

``save``: a model sharded with FSDP2 (``fully_shard``) takes known values,
then ``dcp.save`` writes its sharded state dict; rank 0 also writes the full
values for the test. ``load``: the same model, sharded over this world size,
``dcp.load`` reshards the checkpoint into it; every rank saves what it holds.

Usage: mpiexec -n N python dcp.py BACKEND OUTDIR (save|load) CHECKPOINT_DIR
"""

from __future__ import annotations

import sys

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from common import args, init, save, sharded_model

backend, outdir = args()
mode, ckpt = sys.argv[3], sys.argv[4]
rank, n = init(backend)


m = sharded_model()
if mode == "save":
    with torch.no_grad():
        for i, (_name, p) in enumerate(sorted(m.named_parameters())):
            full = torch.arange(p.numel(), dtype=torch.float32).reshape(p.shape) / (i + 3) + i
            p.copy_(torch.distributed.tensor.distribute_tensor(full, p.device_mesh, p.placements))
    dcp.save({"model": m.state_dict()}, checkpoint_id=ckpt)
    full_values = {k: v.full_tensor() for k, v in m.state_dict().items()}  # collective
    if rank == 0:
        torch.save(full_values, f"{outdir}/full.pt")
else:
    state = {"model": m.state_dict()}
    dcp.load(state, checkpoint_id=ckpt)
    m.load_state_dict(state["model"])
    save(outdir, "loaded", {k: (v.to_local().clone(), v.full_tensor()) for k, v in m.state_dict().items()})
dist.destroy_process_group()
