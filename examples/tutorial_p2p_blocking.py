#!/usr/bin/env python
"""Blocking point-to-point, from PyTorch's "Writing Distributed Applications with PyTorch".

The tutorial's program with one change: ``import hpcdist as dist`` instead of
``import torch.distributed as dist``, started the way the tutorial's MPI
section says: by the MPI launcher, with ``init_process(0, 0, run,
backend="mpi")`` (``rank=0, world_size=0`` means "take them from MPI").

    mpiexec -n 2 python examples/tutorial_p2p_blocking.py

Rank 0 sends a tensor holding 1.0 to rank 1; both print ``has data tensor(1.)``.

Two details differ from the tutorial's text, both about that MPI variant:
``init_process`` hands ``run`` the rank and size MPI gave (the tutorial
passes its 0, 0 through, so every process would think it is rank 0), and the
program refuses to run on other than 2 processes, as ``run`` is written for two.
"""

import os

import torch

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
    os.environ["MASTER_PORT"] = "29500"
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(dist.get_rank(), dist.get_world_size())  # rank and size as MPI gave them


def on_two_processes(fn):
    """Run ``fn`` only when the job has exactly 2 processes, as the tutorial's ``run`` expects."""

    def wrapper(rank, size):
        if size != 2:
            if rank == 0:
                print(f"this tutorial program needs exactly 2 processes, got {size}: mpiexec -n 2 python ...")
            return
        fn(rank, size)

    return wrapper


if __name__ == "__main__":
    init_process(0, 0, on_two_processes(run), backend="mpi")
