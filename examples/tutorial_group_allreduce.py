#!/usr/bin/env python
"""All-reduce on a group, from PyTorch's "Writing Distributed Applications with PyTorch".

The tutorial's program with one change: ``import hpcdist as dist`` instead of
``import torch.distributed as dist``, started by the MPI launcher as the
tutorial's MPI section says (``init_process(0, 0, run, backend="mpi")``).

    mpiexec -n 2 python examples/tutorial_group_allreduce.py

Every process calls ``new_group([0, 1])`` (group creation is collective over
the world); ranks 0 and 1 sum their ones, so both print ``has data
tensor(2.)``. With more than 2 processes the others are not in the group:
their ``all_reduce`` does nothing (with a warning) and they print
``tensor(1.)``, as with torch.
"""

import os

import torch

import hpcdist as dist


def run(rank, size):
    """Simple collective communication."""
    group = dist.new_group([0, 1])
    tensor = torch.ones(1)
    dist.all_reduce(tensor, op=dist.reduce_op.SUM, group=group)
    print("Rank ", rank, " has data ", tensor[0])


def init_process(rank, size, fn, backend="gloo"):
    """Initialize the distributed environment."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29500"
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(dist.get_rank(), dist.get_world_size())  # rank and size as MPI gave them


if __name__ == "__main__":
    init_process(0, 0, run, backend="gloo")  # "gloo" is accepted and runs on MPI
