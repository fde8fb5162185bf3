"""PyTorch's tutorial "Writing Distributed Applications with PyTorch", backend name as an argument.

The tutorial's programs as written there — ``init_process`` with
``MASTER_ADDR``/``MASTER_PORT`` and ``multiprocessing`` (no MPI launcher):
blocking and non-blocking point-to-point, all_reduce in a group, and
synchronous SGD with ``average_gradients`` on a partitioned dataset (random
data instead of MNIST: nothing may download here). Changes: the backend name
comes from the command line; the port from ``MASTER_PORT`` when set (tests run
side by side); results are saved instead of printed; ``INIT`` (``env``,
``tcp`` or ``file``) picks the init_method, ``env`` being the tutorial's.

Usage: python tutorial.py BACKEND OUTDIR [env|tcp|file]
"""

import os
import sys
from random import Random

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.nn.functional as F
import torch.optim as optim


def run_p2p(rank, size, out):
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 1
        dist.send(tensor=tensor, dst=1)
    else:
        dist.recv(tensor=tensor, src=0)
    out["blocking"] = tensor.clone()
    tensor = torch.zeros(1)
    if rank == 0:
        tensor += 2
        req = dist.isend(tensor=tensor, dst=1)
    else:
        req = dist.irecv(tensor=tensor, src=0)
    req.wait()
    out["nonblocking"] = tensor.clone()


def run_allreduce(rank, size, out):
    group = dist.new_group([0, 1])
    tensor = torch.ones(1)
    dist.all_reduce(tensor, op=dist.ReduceOp.SUM, group=group)
    out["all_reduce"] = tensor.clone()


class Partition:
    def __init__(self, data, index):
        self.data = data
        self.index = index

    def __len__(self):
        return len(self.index)

    def __getitem__(self, index):
        return self.data[self.index[index]]


class DataPartitioner:
    def __init__(self, data, sizes=(0.7, 0.2, 0.1), seed=1234):
        self.data = data
        self.partitions = []
        rng = Random()
        rng.seed(seed)
        data_len = len(data)
        indexes = list(range(data_len))
        rng.shuffle(indexes)
        for frac in sizes:
            part_len = int(frac * data_len)
            self.partitions.append(indexes[0:part_len])
            indexes = indexes[part_len:]

    def use(self, partition):
        return Partition(self.data, self.partitions[partition])


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def partition_dataset():
    g = torch.Generator().manual_seed(0)
    dataset = list(zip(torch.randn(256, 20, generator=g), torch.randint(0, 4, (256,), generator=g)))
    size = dist.get_world_size()
    bsz = 128 // size
    partition_sizes = [1.0 / size for _ in range(size)]
    partition = DataPartitioner(dataset, partition_sizes)
    partition = partition.use(dist.get_rank())
    train_set = torch.utils.data.DataLoader(partition, batch_size=bsz, shuffle=False)
    return train_set, bsz


def average_gradients(model):
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.ReduceOp.SUM)
        param.grad.data /= size


def run_sgd(rank, size, out):
    torch.manual_seed(1234)
    train_set, _bsz = partition_dataset()
    model = Net()
    optimizer = optim.SGD(model.parameters(), lr=0.01, momentum=0.5)
    for _epoch in range(3):
        for data, target in train_set:
            optimizer.zero_grad()
            loss = F.nll_loss(model(data), target)
            loss.backward()
            average_gradients(model)
            optimizer.step()
    out["sgd"] = {k: v.clone() for k, v in model.state_dict().items()}


def init_process(rank, size, backend, outdir, init):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = os.environ.get("MASTER_PORT", "29500")
    if init == "env":
        dist.init_process_group(backend, rank=rank, world_size=size)
    elif init == "tcp":
        url = f"tcp://127.0.0.1:{os.environ['MASTER_PORT']}"
        dist.init_process_group(backend, init_method=url, rank=rank, world_size=size)
    else:
        url = f"file://{outdir}/rendezvous"
        dist.init_process_group(backend, init_method=url, rank=rank, world_size=size)
    out = {}
    for fn in (run_p2p, run_allreduce, run_sgd):
        fn(rank, size, out)
    torch.save(out, os.path.join(outdir, f"tutorial.rank{rank}.pt"))
    dist.destroy_process_group()


if __name__ == "__main__":
    backend, outdir = sys.argv[1], sys.argv[2]
    init = sys.argv[3] if len(sys.argv) > 3 else "env"
    size = 2
    processes = []
    mp.set_start_method("spawn")
    for rank in range(size):
        p = mp.Process(target=init_process, args=(rank, size, backend, outdir, init))
        p.start()
        processes.append(p)
    for p in processes:
        p.join()
    sys.exit(max(p.exitcode for p in processes))
