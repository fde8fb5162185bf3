"""Training that survives Slurm's time limit: save on the warning signal, requeue, resume.

Data-parallel SGD with momentum on a least-squares problem (NumPy, any number
of ranks). Every ``--every`` steps the state is saved in the background
(``checkpoint.async_save``). When Slurm's warning signal arrives (USR1, see
``jobs/slurm_requeue.sbatch``) the loop stops at the next step boundary on every
rank, saves, and requeues the job; the requeued job (the same command) resumes
from ``checkpoint.latest()``. The result is the same, bit for bit, as one
uninterrupted run on the same number of ranks.

Run:     mpiexec -n 2 python examples/checkpoint_resume.py --ckpt-dir /tmp/ck --steps 200
Slurm:   sbatch jobs/slurm_requeue.sbatch examples/checkpoint_resume.py --ckpt-dir $PWD/ck --steps 200
Output:  ``--out final.npy`` writes the final parameters (rank 0).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

import hpcdist as dist
from hpcdist import checkpoint


def batch(step: int, rank: int, dim: int, rows: int = 64) -> tuple[np.ndarray, np.ndarray]:
    """This rank's mini-batch of a step: the same on every run (seeded by step and rank)."""
    rng = np.random.default_rng([step, rank])
    x = rng.standard_normal((rows, dim))
    w_true = np.linspace(-1.0, 1.0, dim)
    return x, x @ w_true + 0.01 * rng.standard_normal(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--ckpt-dir", required=True, help="directory of the checkpoints (shared by the ranks)")
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--dim", type=int, default=32)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--every", type=int, default=25, help="async save every N steps (0: only on preemption)")
    ap.add_argument("--sleep", type=float, default=0.0, help="seconds per step (to make a short run last)")
    ap.add_argument("--out", default=None, help="write the final parameters here (.npy, rank 0)")
    args = ap.parse_args()

    dist.init_process_group("mpi")
    rank, size = dist.get_rank(), dist.get_world_size()
    ckpt = Path(args.ckpt_dir)
    state = {"params": {"w": np.zeros(args.dim)}, "optim": {"momentum": np.zeros(args.dim)}, "step": 0}
    last = checkpoint.latest(ckpt)
    if last is not None:
        checkpoint.load(state, last)
        if rank == 0:
            print(f"resumed from {last.name} at step {state['step']} (restart {checkpoint.Preemption.restart_count()})")
    elif rank == 0:
        print(f"starting from scratch on {size} ranks")
    sys.stdout.flush()

    preemption = checkpoint.Preemption()  # USR1 -> stop at the next step boundary
    w, m = state["params"]["w"], state["optim"]["momentum"]
    pending = None
    for step in range(state["step"], args.steps):
        x, y = batch(step, rank, args.dim)
        grad = x.T @ (x @ w - y) / len(y)
        dist.all_reduce(grad)
        grad /= size
        m *= 0.9
        m += grad
        w -= args.lr * m
        state["step"] = step + 1
        if preemption.should_stop():  # collective: all ranks stop at the same step
            path = checkpoint.save(state, ckpt / f"step_{step + 1:06d}")
            if rank == 0:
                print(f"preempted at step {step + 1}: saved {path.name}, requeueing", flush=True)
            requeued = preemption.requeue()
            if rank == 0:
                print("requeued" if requeued else "not in a Slurm job: stopping (run again to resume)", flush=True)
            dist.destroy_process_group()
            return 0
        if args.every and (step + 1) % args.every == 0:
            pending = checkpoint.async_save(state, ckpt / f"step_{step + 1:06d}")  # waits for the previous one
        if args.sleep:
            time.sleep(args.sleep)
    if pending is not None:
        pending.wait()
    if rank == 0:
        loss = float(np.mean((batch(0, 0, args.dim)[0] @ w - batch(0, 0, args.dim)[1]) ** 2))
        print(f"done: {args.steps} steps on {size} ranks, loss {loss:.6f}", flush=True)
        if args.out:
            np.save(args.out, w)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
