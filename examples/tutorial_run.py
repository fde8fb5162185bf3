#!/usr/bin/env python
"""run.py: from PyTorch's "Writing Distributed Applications with PyTorch" tutorial.

The tutorial's program with one change: ``import hpcdist as dist`` instead of
``import torch.distributed as dist``. Two processes started by
multiprocessing join through ``env://`` (MASTER_ADDR/MASTER_PORT) over MPI
ports; backend "gloo" is accepted and runs on MPI; then a blocking send/recv.

Run: ``python examples/tutorial_run.py``. ``HPCDIST_TUTORIAL_PORT`` replaces
the tutorial's fixed port 29500 (the tests use a free port).
"""

import os
import sys

import torch
import torch.multiprocessing as mp

import hpcdist as dist


def run(rank, size):
    """Blocking point-to-point communication."""
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        # Send the tensor to process 1
        dist.send(tensor=tensor, dst=1)
    else:
        # Receive tensor from process 0
        dist.recv(tensor=tensor, src=0)
    print("Rank ", rank, " has data ", tensor[0])


def init_process(rank, size, fn, backend="gloo"):
    """Initialize the distributed environment."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = os.environ.get("HPCDIST_TUTORIAL_PORT", "29500")
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(rank, size)


if __name__ == "__main__":
    world_size = 2
    processes = []
    if "google.colab" in sys.modules:
        print("Running in Google Colab")
        mp.get_context("spawn")
    else:
        mp.set_start_method("spawn")
    for rank in range(world_size):
        p = mp.Process(target=init_process, args=(rank, world_size, run))
        p.start()
        processes.append(p)

    for p in processes:
        p.join()
