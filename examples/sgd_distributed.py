#!/usr/bin/env python
"""Distributed synchronous SGD, from PyTorch's "Writing Distributed Applications with PyTorch".

The tutorial's training program with ``import hpcdist as dist`` instead of
``import torch.distributed as dist``, started by the MPI launcher:

    mpiexec -n 2 python examples/sgd_distributed.py [--epochs 10]

Every rank builds the same model (same seed), trains on its own partition of
the data (``DataPartitioner``), and after each ``loss.backward()`` averages the
gradients over all ranks with ``all_reduce`` (``average_gradients``), so every
rank takes the same optimizer step and the models stay identical. Each rank
prints its loss per epoch, as in the tutorial; at the end the program checks
that all ranks hold identical parameters and rank 0 prints the accuracy.

Where the tutorial downloads MNIST, this program makes its data: 4 classes of
Gaussian blobs in 16 dimensions (4096 samples, seeded, the same on every
rank), and ``Net`` is a small MLP. The batch size is an int (newer
``DataLoader`` refuses the tutorial's float). Without PyTorch it prints a skip
message and exits 0.
"""

import argparse
import sys
from math import ceil
from random import Random

import hpcdist as dist

try:
    import torch
    import torch.nn.functional as F
    from torch import nn, optim
except ImportError:
    torch = None


class Partition:
    """Dataset-like object, but only access a subset of it."""

    def __init__(self, data, index):
        self.data = data
        self.index = index

    def __len__(self):
        return len(self.index)

    def __getitem__(self, index):
        data_idx = self.index[index]
        return self.data[data_idx]


class DataPartitioner:
    """Partitions a dataset into different chunks."""

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


def make_dataset(n=4096, dim=16, classes=4, seed=0):
    """A synthetic classification data set: one Gaussian blob per class."""
    g = torch.Generator().manual_seed(seed)
    centers = 0.7 * torch.randn(classes, dim, generator=g)
    target = torch.randint(0, classes, (n,), generator=g)
    data = centers[target] + torch.randn(n, dim, generator=g)
    return torch.utils.data.TensorDataset(data, target)


def partition_dataset():
    """Partitioning the data set: one equal part per rank."""
    dataset = make_dataset()
    size = dist.get_world_size()
    bsz = 128 // size
    partition_sizes = [1.0 / size for _ in range(size)]
    partition = DataPartitioner(dataset, partition_sizes)
    partition = partition.use(dist.get_rank())
    train_set = torch.utils.data.DataLoader(partition, batch_size=bsz, shuffle=True)
    return train_set, bsz


if torch is not None:

    class Net(nn.Module):
        """A small MLP classifier (the tutorial trains a CNN on MNIST)."""

        def __init__(self, dim=16, hidden=32, classes=4):
            super().__init__()
            self.fc1 = nn.Linear(dim, hidden)
            self.fc2 = nn.Linear(hidden, classes)

        def forward(self, x):
            return F.log_softmax(self.fc2(F.relu(self.fc1(x))), dim=1)


def average_gradients(model):
    """Gradient averaging."""
    size = float(dist.get_world_size())
    for param in model.parameters():
        dist.all_reduce(param.grad.data, op=dist.reduce_op.SUM)
        param.grad.data /= size


def run(rank, size, epochs=10):
    """Distributed Synchronous SGD Example"""
    torch.manual_seed(1234)
    train_set, bsz = partition_dataset()
    model = Net()
    optimizer = optim.SGD(model.parameters(), lr=0.01, momentum=0.5)

    num_batches = ceil(len(train_set.dataset) / float(bsz))
    for epoch in range(epochs):
        epoch_loss = 0.0
        for data, target in train_set:
            optimizer.zero_grad()
            output = model(data)
            loss = F.nll_loss(output, target)
            epoch_loss += loss.item()
            loss.backward()
            average_gradients(model)
            optimizer.step()
        print("Rank ", dist.get_rank(), ", epoch ", epoch, ": ", epoch_loss / num_batches)
    return model


def check(model):
    """Identical parameters on every rank (what gradient averaging promises); accuracy on all data."""
    rank, size = dist.get_rank(), dist.get_world_size()
    with torch.no_grad():
        flat = torch.cat([p.reshape(-1) for p in model.parameters()])
        gathered = [torch.zeros_like(flat) for _ in range(size)]
        dist.all_gather(gathered, flat)
        same = all(torch.equal(gathered[0], g) for g in gathered)
        dataset = make_dataset()
        data, target = dataset.tensors
        accuracy = (model(data).argmax(dim=1) == target).float().mean().item()
    if rank == 0:
        print(f"parameters identical on all {size} ranks: {'yes' if same else 'NO'}")
        print(f"accuracy on the whole data set: {accuracy:.3f}")
    return same


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=10)
    args = ap.parse_args()
    if torch is None:
        print("sgd_distributed.py: skipped, PyTorch is not installed (pip install torch)")
        return 0
    torch.set_num_threads(1)  # one thread per rank: ranks share the node's cores
    dist.init_process_group("mpi")
    model = run(dist.get_rank(), dist.get_world_size(), args.epochs)
    ok = check(model)
    dist.destroy_process_group()
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
