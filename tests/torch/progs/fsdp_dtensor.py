"""FSDP2, DTensor and tensor parallelism over one backend at 4 ranks; results saved per rank.

* FSDP2: ``fully_shard`` on each layer of a 4-layer MLP and on the root,
  3 SGD steps; the full parameters gathered at the end.
* DTensor on ``init_device_mesh("cpu", (2, 2))``: ``distribute_tensor``,
  ``redistribute`` Shard(0) -> Replicate -> Shard(1), a sharded matmul.
* Tensor parallel: ``parallelize_module`` with Colwise/Rowwise on a 2-layer
  MLP over the mesh's "tp" dimension, 2 SGD steps.

Usage: mpiexec -n 4 python fsdp_dtensor.py BACKEND OUTDIR
"""

from __future__ import annotations

from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from common import args, init, save
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

backend, outdir = args()
rank, n = init(backend)
torch.set_num_threads(1)
assert n == 4, "run at 4 ranks"
out: dict[str, Any] = {}


def data(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(6, 16, generator=g), torch.randn(6, 16, generator=g)


# ---------------------------------------------------------------- FSDP2
torch.manual_seed(0)
mlp = nn.Sequential(*[nn.Sequential(nn.Linear(16, 16), nn.Tanh()) for _ in range(4)])
for layer in mlp:
    fully_shard(layer)
fully_shard(mlp)
opt = torch.optim.SGD(mlp.parameters(), lr=0.1)
for step in range(3):
    x, y = data(step)
    opt.zero_grad()
    nn.functional.mse_loss(mlp(x), y).backward()
    opt.step()
out["fsdp2"] = {k: v.full_tensor().detach().clone() for k, v in mlp.state_dict().items()}
out["fsdp2_local"] = {k: v.to_local().detach().clone() for k, v in mlp.state_dict().items()}

# ---------------------------------------------------------------- DTensor over a 2 x 2 mesh
mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
big = torch.arange(64.0).reshape(8, 8)
d = distribute_tensor(big, mesh, [Shard(0), Shard(1)])
out["dtensor_local"] = d.to_local().clone()
rep = d.redistribute(mesh, [Replicate(), Replicate()])
out["dtensor_replicated"] = rep.to_local().clone()
col = rep.redistribute(mesh, [Replicate(), Shard(1)])
out["dtensor_shard1_local"] = col.to_local().clone()
a = distribute_tensor(torch.arange(32.0).reshape(8, 4) / 8, mesh, [Replicate(), Shard(0)])
b = distribute_tensor(torch.arange(12.0).reshape(4, 3) / 4, mesh, [Replicate(), Replicate()])
out["dtensor_matmul"] = (a @ b).full_tensor().clone()
w = distribute_tensor(torch.arange(16.0).reshape(4, 4), mesh, [Replicate(), Shard(1)])
v = distribute_tensor(torch.arange(8.0).reshape(4, 2), mesh, [Replicate(), Shard(0)])
out["dtensor_matmul_partial"] = (w @ v).full_tensor().clone()  # Shard(1) @ Shard(0): a partial sum, reduced

# ---------------------------------------------------------------- tensor parallel on the "tp" dimension
torch.manual_seed(1)
tp_model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
tp_model = parallelize_module(tp_model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
opt = torch.optim.SGD(tp_model.parameters(), lr=0.1)
for step in range(2):
    g = torch.Generator().manual_seed(7 + step + 10 * mesh["dp"].get_local_rank())  # same batch within a tp group
    x, y = torch.randn(4, 16, generator=g), torch.randn(4, 16, generator=g)
    opt.zero_grad()
    nn.functional.mse_loss(tp_model(x), y).backward()
    opt.step()
out["tp"] = {k: v.full_tensor().detach().clone() for k, v in tp_model.state_dict().items()}

save(outdir, "fsdp_dtensor", out)
dist.destroy_process_group()
