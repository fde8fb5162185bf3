#!/usr/bin/env python
"""Our own ring all-reduce, from PyTorch's "Writing Distributed Applications with PyTorch".

The tutorial's ``allreduce(send, recv)`` -- DeepSpeech's ring all-reduce
built from point-to-point calls -- with one change: ``import hpcdist as dist``
instead of ``import torch.distributed as dist``. Each rank sends to its right
neighbour with ``isend`` while it receives from its left one with ``recv``,
and adds what arrives; after ``size - 1`` steps every rank holds the sum.
``run`` checks the result against ``dist.all_reduce`` on the same data.

    mpiexec -n 3 python examples/ring_allreduce.py        (any number of processes)

Rank r contributes ``arange(5) + 10 r``; every rank prints the ring's sum and
whether it equals ``dist.all_reduce``'s.
"""

import os

import torch

import hpcdist as dist


def allreduce(send, recv):
    """Implementation of a ring-reduce with addition."""
    rank = dist.get_rank()
    size = dist.get_world_size()
    send_buff = send.clone()
    recv_buff = send.clone()
    accum = send.clone()

    left = ((rank - 1) + size) % size
    right = (rank + 1) % size

    for i in range(size - 1):
        if i % 2 == 0:
            # Send send_buff
            send_req = dist.isend(send_buff, right)
            dist.recv(recv_buff, left)
            accum[:] += recv_buff[:]
        else:
            # Send recv_buff
            send_req = dist.isend(recv_buff, right)
            dist.recv(send_buff, left)
            accum[:] += send_buff[:]
        send_req.wait()
    recv[:] = accum[:]


def run(rank, size):
    """The ring all-reduce, checked against the library's all_reduce."""
    send = torch.arange(5, dtype=torch.float32) + 10 * rank
    recv = torch.zeros_like(send)
    allreduce(send, recv)

    expected = send.clone()
    dist.all_reduce(expected, op=dist.ReduceOp.SUM)
    same = torch.equal(recv, expected)
    print(f"Rank {rank} of {size}: ring allreduce {recv.tolist()}, equal to dist.all_reduce: {same}")


def init_process(rank, size, fn, backend="gloo"):
    """Initialize the distributed environment."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "29500"
    dist.init_process_group(backend, rank=rank, world_size=size)
    fn(dist.get_rank(), dist.get_world_size())  # rank and size as MPI gave them


if __name__ == "__main__":
    init_process(0, 0, run, backend="mpi")
