#!/usr/bin/env python
"""Non-blocking point-to-point, from PyTorch's "Writing Distributed Applications with PyTorch".

The tutorial's program with one change: ``import hpcdist as dist`` instead of
``import torch.distributed as dist``, started by the MPI launcher as the
tutorial's MPI section says (``init_process(0, 0, run, backend="mpi")``).

    mpiexec -n 2 python examples/tutorial_p2p_nonblocking.py

``isend``/``irecv`` return a ``Work`` at once; ``req.wait()`` blocks until the
transfer is done. Until then rank 0 must not write its tensor and rank 1 must
not read its own. Both end up printing ``has data tensor(1.)``.
``init_process`` hands ``run`` the rank and size MPI gave; the program runs on
exactly 2 processes (see ``tutorial_p2p_blocking.py``).
"""

import os

import torch

import hpcdist as dist


def run(rank, size):
    """Non-blocking point-to-point communication."""
    tensor = torch.zeros(1)
    req = None
    if rank == 0:
        tensor += 1
        # Send the tensor to process 1
        req = dist.isend(tensor=tensor, dst=1)
        print("Rank 0 started sending")
    else:
        # Receive tensor from process 0
        req = dist.irecv(tensor=tensor, src=0)
        print("Rank 1 started receiving")
    req.wait()
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
