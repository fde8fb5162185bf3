"""The main demo: data-parallel training of a small NumPy MLP on N ranks.

Run it with any launcher (it needs NumPy and hpcdist; tqdm and matplotlib are
optional)::

    hpcdist run -n 4 examples/train_demo.py          # scripts/demo does this
    mpiexec -n 4 python examples/train_demo.py
    srun --mpi=pmi2 -n 4 python examples/train_demo.py   # jobs/slurm_cpu.sbatch

What it does, as torch's DistributedDataParallel would:

1. every rank makes the same seeded synthetic data set (3 classes of points
   on interleaved spirals, 20 noisy features) and keeps its shard
   (``X[rank::world_size]``);
2. rank 0's initial parameters are broadcast, so all ranks start equal;
3. each step computes gradients on the local mini-batch and averages them with
   one ``all_reduce`` (``ReduceOp.AVG``) of a flat buffer, then takes an SGD
   step: every rank applies the same update;
4. rank 0 shows a tqdm progress bar, prints the final loss and test accuracy,
   and writes the loss curve as a PNG (``--plot``, default ``demo_loss.png``);
5. at the end all ranks compare a SHA-256 of their parameters
   (``all_gather_object``) and the demo fails if they differ.

Finishes in a few seconds at 4 ranks on a laptop.
"""

from __future__ import annotations

import argparse
import hashlib
import sys
import time

import numpy as np

import hpcdist as dist


def make_data(n: int, features: int, classes: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Interleaved spirals in 2-D, lifted to ``features`` dims with a fixed random map plus noise."""
    rng = np.random.default_rng(seed)
    y = rng.integers(0, classes, size=n)
    t = rng.uniform(0.0, 1.0, size=n)
    angle = 4.0 * t + 2.0 * np.pi * y / classes + rng.normal(0.0, 0.15, size=n)
    xy = np.stack([t * np.cos(angle), t * np.sin(angle)], axis=1)
    lift = rng.normal(0.0, 1.0, size=(2, features))
    x = np.tanh(xy @ lift) + rng.normal(0.0, 0.05, size=(n, features))
    return x.astype(np.float64), y.astype(np.int64)


def init_params(features: int, hidden: int, classes: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "w1": rng.normal(0.0, 1.0 / np.sqrt(features), size=(features, hidden)),
        "b1": np.zeros(hidden),
        "w2": rng.normal(0.0, 1.0 / np.sqrt(hidden), size=(hidden, classes)),
        "b2": np.zeros(classes),
    }


def forward_backward(p: dict[str, np.ndarray], x: np.ndarray, y: np.ndarray) -> tuple[float, dict[str, np.ndarray]]:
    """Mean cross-entropy of a tanh MLP and its gradients."""
    h = np.tanh(x @ p["w1"] + p["b1"])
    logits = h @ p["w2"] + p["b2"]
    logits -= logits.max(axis=1, keepdims=True)
    prob = np.exp(logits)
    prob /= prob.sum(axis=1, keepdims=True)
    n = x.shape[0]
    loss = float(-np.log(prob[np.arange(n), y] + 1e-12).mean())
    d_logits = prob
    d_logits[np.arange(n), y] -= 1.0
    d_logits /= n
    d_h = (d_logits @ p["w2"].T) * (1.0 - h**2)
    grads = {"w1": x.T @ d_h, "b1": d_h.sum(axis=0), "w2": h.T @ d_logits, "b2": d_logits.sum(axis=0)}
    return loss, grads


def predict(p: dict[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    return np.argmax(np.tanh(x @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"], axis=1)


def flat(tensors: dict[str, np.ndarray]) -> np.ndarray:
    return np.concatenate([t.ravel() for t in tensors.values()])


def unflat(buffer: np.ndarray, like: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    out, offset = {}, 0
    for name, t in like.items():
        out[name] = buffer[offset : offset + t.size].reshape(t.shape)
        offset += t.size
    return out


def progress(total: int, enabled: bool):
    """A tqdm bar on rank 0 (a plain stand-in when tqdm is missing or on other ranks)."""
    if enabled:
        try:
            from tqdm import tqdm

            return tqdm(total=total, desc="training", unit="step", file=sys.stderr, mininterval=0.2)
        except ImportError:
            print("(tqdm not installed: no progress bar)", flush=True)

    class _Quiet:
        def update(self, n=1):
            pass

        def set_postfix(self, **kw):
            pass

        def close(self):
            pass

    return _Quiet()


def save_plot(path: str, losses: list[float], accuracies: list[float], world: int) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print(f"(matplotlib not installed: no plot written to {path}; pip install matplotlib)", flush=True)
        return
    fig, ax = plt.subplots(figsize=(6, 4))
    epochs = np.arange(1, len(losses) + 1)
    ax.plot(epochs, losses, marker="o", label="training loss (mean over ranks)")
    ax.set_xlabel("epoch")
    ax.set_ylabel("cross-entropy")
    ax2 = ax.twinx()
    ax2.plot(epochs, accuracies, color="tab:green", linestyle="--", label="test accuracy")
    ax2.set_ylabel("test accuracy")
    ax2.set_ylim(0.0, 1.0)
    ax.set_title(f"hpcdist data-parallel MLP on {world} ranks")
    handles = ax.get_legend_handles_labels()[0] + ax2.get_legend_handles_labels()[0]
    ax.legend(handles=handles, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    print(f"loss curve written to {path}", flush=True)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epochs", type=int, default=15)
    ap.add_argument("--samples", type=int, default=6000, help="size of the whole data set (train + test)")
    ap.add_argument("--features", type=int, default=20)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--batch", type=int, default=64, help="mini-batch size per rank")
    ap.add_argument("--lr", type=float, default=0.5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--plot", default="demo_loss.png", help="PNG of the loss curve ('' for none)")
    args = ap.parse_args()
    classes = 3

    dist.init_process_group("mpi")
    rank, world = dist.get_rank(), dist.get_world_size()
    t0 = time.perf_counter()

    x, y = make_data(args.samples, args.features, classes, args.seed)
    n_test = args.samples // 5
    x_train, y_train, x_test, y_test = x[n_test:], y[n_test:], x[:n_test], y[:n_test]
    x_local, y_local = x_train[rank::world], y_train[rank::world]
    x_test_local, y_test_local = x_test[rank::world], y_test[rank::world]
    # every rank takes the same number of steps per epoch (shards differ by at most one sample)
    steps = max(1, (len(x_train) // world) // args.batch)

    params = init_params(args.features, args.hidden, classes, seed=args.seed + 1000 + rank)  # differs per rank...
    buffer = flat(params)
    dist.broadcast(buffer, src=0)  # ...until rank 0's parameters are broadcast
    params = unflat(buffer, params)
    if rank == 0:
        print(
            f"hpcdist demo: {world} ranks, {len(x_train)} training samples ({len(x_local)} on rank 0), "
            f"{buffer.size} parameters, {args.epochs} epochs x {steps} steps",
            flush=True,
        )

    rng = np.random.default_rng(args.seed + 7 + rank)
    losses: list[float] = []
    accuracies: list[float] = []
    bar = progress(args.epochs * steps, enabled=rank == 0)
    stats = np.zeros(2)
    for epoch in range(args.epochs):
        order = rng.permutation(len(x_local))
        stats[:] = 0.0
        for step in range(steps):
            idx = order[(step * args.batch) % len(order) :][: args.batch]
            loss, grads = forward_backward(params, x_local[idx], y_local[idx])
            g = flat(grads)
            dist.all_reduce(g, op=dist.ReduceOp.AVG)  # data parallelism: average the gradients
            buffer -= args.lr * g
            params = unflat(buffer, params)
            stats += (loss, 1.0)
            bar.update(1)
        dist.all_reduce(stats, op=dist.ReduceOp.SUM)
        losses.append(stats[0] / stats[1])
        correct = np.array([float((predict(params, x_test_local) == y_test_local).sum()), float(len(y_test_local))])
        dist.all_reduce(correct, op=dist.ReduceOp.SUM)
        accuracies.append(correct[0] / correct[1])
        bar.set_postfix(epoch=epoch + 1, loss=f"{losses[-1]:.3f}", acc=f"{accuracies[-1]:.3f}")
    bar.close()

    digest = hashlib.sha256(buffer.tobytes()).hexdigest()
    digests: list[str | None] = [None] * world
    dist.all_gather_object(digests, digest)
    same = all(d == digests[0] for d in digests)
    if rank == 0:
        print(f"final loss {losses[-1]:.4f}  test accuracy {accuracies[-1]:.4f}", flush=True)
        print(
            f"parameters identical on all {world} ranks: {'yes' if same else 'NO'} (sha256 {digest[:12]})", flush=True
        )
        if args.plot:
            save_plot(args.plot, losses, accuracies, world)
        print(f"done in {time.perf_counter() - t0:.1f} s", flush=True)
    dist.destroy_process_group()
    if not same:
        print(f"rank {rank}: parameters differ between ranks: {digests}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
