"""DistributedDataParallel over one backend, in every mode the tests check; final parameters saved.

Modes: plain, no_sync (gradient accumulation), find_unused_parameters=True,
static_graph=True, the communication hooks allreduce_hook,
fp16_compress_hook and PowerSGD, and a DistributedSampler training loop.
The same seeds on every backend: the runs must end with equal parameters.

Usage: mpiexec -n N python ddp.py BACKEND OUTDIR
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn
from common import args, init, params, save
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

backend, outdir = args()
rank, n = init(backend)
torch.set_num_threads(1)
STEPS = 5


class Net(nn.Module):
    """Two paths; ``use_b=False`` leaves ``b`` unused (find_unused_parameters)."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(12, 32)
        self.b = nn.Linear(32, 32)
        self.c = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor, use_b: bool = True) -> torch.Tensor:
        h = torch.relu(self.a(x))
        if use_b:
            h = torch.relu(self.b(h))
        return self.c(h)


def model() -> nn.Module:
    torch.manual_seed(1234 + rank)  # different on every rank: DDP's broadcast from rank 0 must fix that
    return Net()


def batch(step: int, micro: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * rank + 10 * step + micro)
    return torch.randn(8, 12, generator=g), torch.randn(8, 4, generator=g)


def train(ddp: DDP, steps: int = STEPS, step_fn: Callable[[DDP, Any, int], None] | None = None) -> None:
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    for s in range(steps):
        opt.zero_grad()
        if step_fn is None:
            x, y = batch(s)
            nn.functional.mse_loss(ddp(x), y).backward()
        else:
            step_fn(ddp, opt, s)
        opt.step()


results: dict[str, Any] = {}


def run(name: str, ddp: DDP, **kw: Any) -> None:
    print(f"[{rank}] {name}", flush=True)
    train(ddp, **kw)
    results[name] = params(ddp.module)


run("plain", DDP(model()))


def accumulate(ddp: DDP, opt: Any, s: int) -> None:
    with ddp.no_sync():
        x, y = batch(s, 0)
        nn.functional.mse_loss(ddp(x), y).backward()
    x, y = batch(s, 1)
    nn.functional.mse_loss(ddp(x), y).backward()


run("no_sync", DDP(model()), step_fn=accumulate)


def sometimes_unused(ddp: DDP, opt: Any, s: int) -> None:
    x, y = batch(s)
    nn.functional.mse_loss(ddp(x, use_b=s % 2 == 0), y).backward()


run("find_unused", DDP(model(), find_unused_parameters=True), step_fn=sometimes_unused)
run("static_graph", DDP(model(), static_graph=True))

m = DDP(model(), bucket_cap_mb=0.001)  # several buckets: hooks run once per bucket
m.register_comm_hook(None, default_hooks.allreduce_hook)
run("allreduce_hook", m)
m = DDP(model())
m.register_comm_hook(None, default_hooks.fp16_compress_hook)
run("fp16_compress_hook", m)
# one bucket: PowerSGD's callbacks issue collectives, which with several buckets can interleave with the next
# buckets' differently on different ranks (it hangs on torch's gloo too; docs/torch.md)
m = DDP(model())
state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=2, start_powerSGD_iter=2, random_seed=7)
m.register_comm_hook(state, powersgd.powerSGD_hook)
run("powersgd", m, steps=6)

# a DistributedSampler loop: every rank sees its own shard; epochs reshuffle with set_epoch
g = torch.Generator().manual_seed(5)
data = TensorDataset(torch.randn(96, 12, generator=g), torch.randn(96, 4, generator=g))
sampler = DistributedSampler(data, num_replicas=n, rank=rank, shuffle=True, seed=3)
loader = DataLoader(data, batch_size=8, sampler=sampler)
ddp = DDP(model())
opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
seen = []
for epoch in range(2):
    sampler.set_epoch(epoch)
    for x, y in loader:
        seen.append(x[:, 0].clone())
        opt.zero_grad()
        nn.functional.mse_loss(ddp(x), y).backward()
        opt.step()
results["sampler"] = params(ddp.module)
results["sampler_seen"] = torch.cat(seen)

save(outdir, "ddp", results)
dist.destroy_process_group()
