"""init_process_group("hpcdist") / destroy_process_group four times in one process, nothing set by the user.

init exports torchrun's variables (MASTER_ADDR/MASTER_PORT among them); destroy
must take back what it set, or the next init hands over to torch's own
``env://`` at the last world's port (the third round then hung). Every rank
saves, per round, the variables it saw before init and the all-reduce's sum.

Usage: mpiexec -n N python reinit.py hpcdist OUTDIR
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist
from common import args, save

import hpcdist.torch  # noqa: F401

backend, outdir = args()
seen = []
for _ in range(4):
    before = {k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")}
    dist.init_process_group(backend)
    x = torch.full((3,), float(dist.get_rank() + 1))
    dist.all_reduce(x)
    seen.append((before, x))
    rank = dist.get_rank()
    dist.destroy_process_group()
os.environ["PMI_RANK"] = str(rank)  # save() names the file by rank once the group is gone
save(outdir, "reinit", seen)
