"""A PyTorch training loop, DDP-style, on hpcdist: gradients averaged with all_reduce.

    hpcdist run -n 2 examples/torch_training.py
    srun --mpi=pmi2 -n 4 python examples/torch_training.py

Each rank builds the same ``nn.Module`` (rank 0's initial weights are
broadcast), trains on its shard of a seeded synthetic regression problem,
and after ``loss.backward()`` averages every gradient with one
``all_reduce(..., op=ReduceOp.AVG)`` on a flat buffer before
``optimizer.step()`` -- what ``DistributedDataParallel`` does, on torch CPU
tensors over MPI. Without torch it prints a skip message and exits 0.
"""

from __future__ import annotations

import sys

import hpcdist as dist

try:
    import torch
    from torch import nn
except ImportError:
    torch = None  # type: ignore[assignment]


def average_gradients(model: nn.Module) -> None:
    """All-reduce every gradient in one flat buffer (fewer, larger messages than one per tensor)."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.AVG)
    offset = 0
    for g in grads:
        g.copy_(flat[offset : offset + g.numel()].view_as(g))
        offset += g.numel()


def main() -> int:
    if torch is None:
        print("torch_training.py: skipped, PyTorch is not installed (pip install torch)")
        return 0
    dist.init_process_group("mpi")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(1234)  # same data on every rank; each takes its shard
    x = torch.randn(2048, 16)
    w_true = torch.randn(16, 1) / 4.0
    y = torch.sin(x @ w_true) + 0.05 * torch.randn(2048, 1)
    x_local, y_local = x[rank::world], y[rank::world]

    torch.manual_seed(rank)  # different initial weights per rank...
    model = nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 1))
    with torch.no_grad():
        for p in model.parameters():
            dist.broadcast(p.data, src=0)  # ...until rank 0's are broadcast
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.MSELoss()

    for epoch in range(10):
        perm = torch.randperm(len(x_local), generator=torch.Generator().manual_seed(epoch * 100 + rank))
        for i in range(0, len(x_local) - 63, 64):
            idx = perm[i : i + 64]
            opt.zero_grad()
            loss = loss_fn(model(x_local[idx]), y_local[idx])
            loss.backward()
            average_gradients(model)
            opt.step()
        with torch.no_grad():
            total = torch.tensor([loss_fn(model(x_local), y_local).item() * len(x_local), float(len(x_local))])
        dist.all_reduce(total)
        if rank == 0:
            print(f"epoch {epoch + 1:2d}  mse {total[0] / total[1]:.4f}", flush=True)

    with torch.no_grad():
        checksum = torch.cat([p.reshape(-1) for p in model.parameters()]).double().sum().reshape(1)
    sums = [None] * world
    dist.all_gather_object(sums, float(checksum))
    same = all(s == sums[0] for s in sums)
    if rank == 0:
        print(f"model identical on all {world} ranks: {'yes' if same else 'NO'}", flush=True)
    dist.destroy_process_group()
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
