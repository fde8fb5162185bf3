"""Three defects of the torch backend found by adversarial testing, at 3 ranks on the 2-CPU host (oversubscribed).

* ``bf16_0d``: all_reduce of a 0-d bfloat16 tensor, blocking and async (it raised BufferError: widening
  the bits of a 0-d array gave a read-only NumPy scalar).
* ``join``: DDP under torch's ``Join`` with uneven inputs (rank r runs 3 + r steps). Joined ranks answer with
  blocking all-reduces where the others issue asynchronous ones; on an oversubscribed node the blocking ones
  took shared memory and the asynchronous ones MPI, and every rank waited for the other path.
* ``owned_timeout``: rank 0 starts an async all_reduce, takes its future (the progress thread then owns it)
  and its ``wait(timeout=1s)`` expires before the others arrive (3 s later); the operation then completes.
  The expired wait marked the process as having an operation stuck in flight, so the job ended with
  MPI_Abort(124) at exit although everything completed. The test asserts exit status 0.
* ``dropped``: async all_reduces (SUM) whose Work is dropped at once, then ``dist.barrier()``: gloo's barrier
  waits for the group's earlier work, so the outputs hold the sum after it. On "hpcdist" they held nothing
  (or the sum without the copy-back into a non-contiguous view): torch's barrier waits on an asynchronous
  hpcdist barrier, which did not finish the group's dropped operations as the blocking one does.
* ``p2p_across_barrier``: rank 0 keeps an ``irecv`` whose send rank 1 makes only once rank 0 is past the
  barrier; a barrier that waited for it would never return (gloo's leaves point-to-point work out, hpcdist's too).
* ``dtypes``: tensors of dtypes NumPy lacks (float8, float4_e2m1fn_x2) and torch's unsigned uint16-64: the
  backend refused every call on them ("tensors has dtype torch.uint16 ..."), point to point too, where gloo
  moves them (its collectives refuse them). Each call's outcome is recorded: the bytes, the values, or the
  exception.
* ``held``: the same with the Works kept (and waited only after the barrier), blocking and async barrier: gloo's
  barrier waits for them (a program of only these calls gives the sums on gloo; here, after DDP under Join,
  gloo's were partial); hpcdist's outputs held nothing at 64 Ki elements.

Usage: mpiexec -n 3 python defects.py BACKEND OUTDIR
"""

from __future__ import annotations

import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn as nn
from common import args, init, save

DROPPED_SIZES = (16, 1024, 65536)


def _two_async_sums(n: int, rank: int) -> tuple[torch.Tensor, torch.Tensor, list]:
    """Start async SUMs of ``rank + 1`` into a tensor of ``n`` and into column 0 of an n x 2 tensor (non-contiguous:
    copied back by a finishing step); return both tensors and the Works."""
    t = torch.full((n,), rank + 1.0)
    view = torch.zeros(n, 2)
    view[:, 0] = rank + 1.0
    return t, view, [dist.all_reduce(t, async_op=True), dist.all_reduce(view[:, 0], async_op=True)]


def main() -> None:
    backend, out = args()
    rank, _ = init(backend)
    res: dict = {}
    for asynchronous in (False, True):
        x = torch.tensor(rank + 1.0, dtype=torch.bfloat16)
        w = dist.all_reduce(x, async_op=asynchronous)
        if asynchronous:
            w.wait()
        res[f"bf16_0d_async={asynchronous}"] = x.clone()

    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(20, 64), nn.Tanh(), nn.Linear(64, 5))
    ddp = DDP(model, bucket_cap_mb=0.01)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    with Join([ddp]):
        for step in range(3 + rank):
            g = torch.Generator().manual_seed(100 * rank + step)
            x, y = torch.randn(8, 20, generator=g), torch.randn(8, 5, generator=g)
            opt.zero_grad()
            nn.functional.mse_loss(ddp(x), y).backward()
            opt.step()
    res["join_params"] = torch.cat([p.detach().flatten() for p in model.parameters()])

    # before the expired wait below: after a timed-out wait gloo's later results are unreliable
    for n in DROPPED_SIZES:
        t, view = _two_async_sums(n, rank)[:2]  # the Works are dropped at once
        dist.barrier()
        res[f"dropped_{n}"] = (t.clone(), view.clone())
        for how in ("barrier", "async-barrier", "async-barrier-polled"):  # held, not waited: gloo's barrier waits
            t, view, works = _two_async_sums(n, rank)
            if how == "barrier":
                dist.barrier()
            elif how == "async-barrier":
                dist.barrier(async_op=True).wait()
            else:
                b = dist.barrier(async_op=True)
                while not b.is_completed():
                    time.sleep(0.001)
            res[f"held_{how}_{n}"] = (t.clone(), view.clone())
            for w in works:
                w.wait()

    # a held irecv whose send rank 1 makes only once rank 0 is past the barrier: a barrier that waited for
    # point-to-point work would never return
    got = torch.zeros(4)
    if rank == 0:
        w = dist.irecv(got, src=1)
        dist.barrier()
        dist.send(torch.ones(1), dst=1)
        w.wait()
    else:
        dist.barrier()
        if rank == 1:
            dist.recv(torch.zeros(1), src=0)
            dist.send(torch.arange(4.0), dst=0)
    res["p2p_across_barrier"] = got.clone()

    res["dtypes"] = _dtypes(rank, dist.get_world_size())

    t = torch.ones(3)
    if rank == 0:
        w = dist.all_reduce(t, async_op=True)
        fut = w.get_future()
        try:
            w.wait(timedelta(seconds=1))
            res["owned_wait"] = "returned"
        except Exception as e:  # the peers come 3 s later
            res["owned_wait"] = (type(e).__name__, isinstance(e, RuntimeError))
        fut.wait()
    else:
        time.sleep(3)
        dist.all_reduce(t)
    res["owned_result"] = t.clone()
    save(out, "defects", res)
    dist.barrier()
    dist.destroy_process_group()


#: dtypes moved as bits (tests/mpi/test_bits_dtypes.py covers the facade) and torch's unsigned ones
BITS = ("float8_e4m3fn", "float8_e5m2", "float4_e2m1fn_x2")
UNSIGNED = ("uint16", "uint32", "uint64")


def drawn(name: str, rank: int, count: int = 6) -> torch.Tensor:
    """``count`` elements of dtype ``name`` made of bytes drawn from a generator seeded by ``rank``."""
    dt = getattr(torch, name)
    size = torch.empty(0, dtype=dt).element_size()
    gen = torch.Generator().manual_seed(rank)
    return torch.randint(0, 256, (count * size,), dtype=torch.uint8, generator=gen).view(dt)


def _outcome(call) -> object:
    """What ``call()`` returned as bytes (a uint8 tensor) or values (a list), or (exception type, RuntimeError?,
    message) when it raised."""
    try:
        return call()
    except Exception as e:  # gloo refuses these dtypes in its collectives ("Invalid scalar type")
        return (type(e).__name__, isinstance(e, RuntimeError), str(e))


def _dtypes(rank: int, n: int) -> dict:
    out: dict = {}
    for name in BITS + UNSIGNED:
        dt = getattr(torch, name)

        def bcast(name=name):
            t = drawn(name, rank)
            dist.broadcast(t, src=1)
            return t.view(torch.uint8).clone()

        def gather(name=name, dt=dt):
            o = torch.empty(6 * n, dtype=dt)
            dist.all_gather_into_tensor(o, drawn(name, rank))
            return o.view(torch.uint8).clone()

        def a2a(name=name, dt=dt):
            o = torch.empty(2 * n, dtype=dt)
            dist.all_to_all_single(o, drawn(name, rank, 2 * n))
            return o.view(torch.uint8).clone()

        def ring(name=name, dt=dt):
            got = torch.empty(6, dtype=dt)
            works = [dist.isend(drawn(name, rank), dst=(rank + 1) % n), dist.irecv(got, src=(rank - 1) % n)]
            for w in works:
                w.wait()
            return got.view(torch.uint8).clone()

        out[name, "broadcast"] = _outcome(bcast)
        out[name, "all_gather_into_tensor"] = _outcome(gather)
        out[name, "all_to_all_single"] = _outcome(a2a)
        out[name, "isend/irecv"] = _outcome(ring)
        for op in ("SUM", "MAX"):
            base = 2 ** (8 * torch.empty(0, dtype=dt).element_size() - 1) if name in UNSIGNED else 0

            def reduce(name=name, dt=dt, op=op, base=base):  # MAX near the top of the range: unsigned order
                if name in BITS:
                    t = torch.tensor([rank + 1, rank], dtype=torch.uint8).view(dt)
                else:
                    t = torch.tensor([rank + 1, base + rank], dtype=dt)
                dist.all_reduce(t, op=getattr(dist.ReduceOp, op))
                return t.tolist() if name in UNSIGNED else t.view(torch.uint8).clone()

            out[name, op] = _outcome(reduce)
    x = torch.ones(2)
    dist.all_reduce(x)  # after every refusal the group still matches
    out["after"] = x.tolist()
    return out


if __name__ == "__main__":
    main()
