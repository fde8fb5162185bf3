"""Every torch.distributed collective, op and dtype through one backend; results saved per rank.

Inputs are small integers (exact in every dtype and every summation order),
so results compare bit for bit against gloo's run and against the answer
computed here from every rank's input. A case the backend refuses records
the exception's type name instead of a tensor.

Usage: mpiexec -n N python collectives.py BACKEND OUTDIR
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from common import args, init, save

backend, outdir = args()
rank, n = init(backend)
got: dict[str, Any] = {}
TRACE = bool(__import__("os").environ.get("TRACE"))
want: dict[str, Any] = {}

DTYPES = [
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
    torch.bool,
]


def x_of(r: int, dtype: torch.dtype, k: int = 5) -> torch.Tensor:
    """Rank ``r``'s input: small integers (bool: r's parity pattern)."""
    base = torch.arange(k) % 3 + r + 1
    if dtype is torch.bool:
        return (torch.arange(k) + r) % 2 == 0
    if dtype.is_complex:
        return torch.complex(base.double(), -base.double()).to(dtype)
    return base.to(dtype)


def case(name: str, fn: Callable[[], Any], expected: Any = None) -> None:
    if TRACE:
        print(f"[{rank}] {name}", flush=True)
    try:
        got[name] = fn()
    except Exception as exc:  # gloo refuses some; the test decides whether that is right
        got[name] = f"error:{type(exc).__name__}"
    if expected is not None:
        want[name] = expected


def allreduce(t: torch.Tensor, op: Any) -> torch.Tensor:
    dist.all_reduce(t, op=op)
    return t


everyone = list(range(n))
# ---------------------------------------------------------------- all_reduce: every op x dtype
ops = {
    "SUM": dist.ReduceOp.SUM,
    "PRODUCT": dist.ReduceOp.PRODUCT,
    "MIN": dist.ReduceOp.MIN,
    "MAX": dist.ReduceOp.MAX,
    "BAND": dist.ReduceOp.BAND,
    "BOR": dist.ReduceOp.BOR,
    "BXOR": dist.ReduceOp.BXOR,
}
for dt in DTYPES:
    xs = [x_of(r, dt) for r in everyone]
    for name, op in ops.items():
        if dt is torch.bool or (name.startswith("B") and (dt.is_floating_point or dt.is_complex)):
            continue
        if dt.is_complex and name in ("PRODUCT", "MIN", "MAX"):
            continue
        exp: torch.Tensor
        if name == "SUM":
            exp = sum(xs[1:], xs[0].clone())
        elif name == "PRODUCT":
            exp = xs[0].clone()
            for v in xs[1:]:
                exp = exp * v
        elif name == "MIN":
            exp = torch.stack(xs).min(0).values
        elif name == "MAX":
            exp = torch.stack(xs).max(0).values
        else:
            f = {"BAND": torch.bitwise_and, "BOR": torch.bitwise_or, "BXOR": torch.bitwise_xor}[name]
            exp = xs[0].clone()
            for v in xs[1:]:
                exp = f(exp, v)
        case(f"all_reduce/{name}/{dt}", lambda dt=dt, op=op: allreduce(x_of(rank, dt), op), exp.to(dt))
bools = [x_of(r, torch.bool) for r in everyone]
case(
    "all_reduce/SUM/torch.bool", lambda: allreduce(x_of(rank, torch.bool), dist.ReduceOp.SUM), torch.stack(bools).any(0)
)
case(
    "all_reduce/MIN/torch.bool", lambda: allreduce(x_of(rank, torch.bool), dist.ReduceOp.MIN), torch.stack(bools).all(0)
)
for dt in (torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.complex64):
    xs = [x_of(r, dt, 6) * 2 * n for r in everyone]
    total = sum(xs[1:], xs[0].clone())
    case(f"all_reduce/AVG/{dt}", lambda dt=dt: allreduce(x_of(rank, dt, 6) * 2 * n, dist.ReduceOp.AVG), total / n)
    premul = dist._make_nccl_premul_sum(2.0)
    case(f"all_reduce/PREMUL_SUM/{dt}", lambda dt=dt, p=premul: allreduce(x_of(rank, dt, 6) * 2 * n, p), total * 2)
    quarter = dist._make_nccl_premul_sum(0.25)  # another factor on the same dtype: not the first one's again
    case(
        f"all_reduce/PREMUL_SUM/0.25/{dt}", lambda dt=dt, p=quarter: allreduce(x_of(rank, dt, 6) * 2 * n, p), total / 4
    )
case(
    "all_reduce/AVG/torch.int64",
    lambda: allreduce(torch.full((3,), 2 * n * (rank + 1), dtype=torch.int64), dist.ReduceOp.AVG),
    torch.full((3,), (n + 1) * n, dtype=torch.int64),
)
big = torch.arange(300_000, dtype=torch.float32) % 7
case("all_reduce/SUM/large", lambda: allreduce(big + rank, dist.ReduceOp.SUM), big * n + sum(everyone))
case("all_reduce/SUM/noncontiguous", lambda: allreduce(torch.ones(4, 6).t() * (rank + 1), dist.ReduceOp.SUM))

# ---------------------------------------------------------------- rooted and gathering collectives
for dt in (torch.float32, torch.int64, torch.bfloat16, torch.complex128, torch.bool):
    for root in range(n):
        t = x_of(rank, dt)
        case(f"broadcast/{dt}/root{root}", lambda t=t, root=root: (dist.broadcast(t, root), t)[1], x_of(root, dt))
        t = x_of(rank, dt)
        dist.reduce(t, root)  # the result is defined on the root only (gloo leaves partial sums elsewhere)
        if rank == root:
            exp = sum((x_of(r, dt) for r in everyone[1:]), x_of(0, dt)) if dt is not torch.bool else None
            case(f"reduce/{dt}/root{root}", lambda t=t: t, exp)
    xs = [x_of(r, dt) for r in everyone]
    out = [torch.zeros_like(xs[0]) for _ in everyone]
    case(f"all_gather/{dt}", lambda out=out, dt=dt: (dist.all_gather(out, x_of(rank, dt)), out)[1], xs)
    o = torch.zeros(n * 5, dtype=dt)
    case(f"all_gather_into_tensor/{dt}", lambda o=o, dt=dt: (dist.all_gather_into_tensor(o, x_of(rank, dt)), o)[1])
    want[f"all_gather_into_tensor/{dt}"] = torch.cat(xs)
    gl = [torch.zeros_like(xs[0]) for _ in everyone] if rank == 1 % n else None
    case(f"gather/{dt}", lambda gl=gl, dt=dt: (dist.gather(x_of(rank, dt), gl, dst=1 % n), gl)[1])
    if rank == 1 % n:
        want[f"gather/{dt}"] = xs
    sl = [x_of(r + 10, dt) for r in everyone] if rank == 0 else None
    o = torch.zeros(5, dtype=dt)
    case(f"scatter/{dt}", lambda o=o, sl=sl: (dist.scatter(o, sl, src=0), o)[1], x_of(rank + 10, dt))
    ins = [x_of(rank + 7, dt) for _ in everyone]
    o = torch.zeros(5, dtype=dt)
    ins2 = [torch.roll(x_of(rank, dt), r) for r in everyone]
    outs = [torch.zeros(5, dtype=dt) for _ in everyone]
    case(f"all_to_all_list/{dt}", lambda outs=outs, ins2=ins2: (dist.all_to_all(outs, ins2), outs)[1])
    want[f"all_to_all_list/{dt}"] = [torch.roll(x_of(r, dt), rank) for r in everyone]
    if dt is not torch.bool:
        case(f"reduce_scatter/{dt}", lambda o=o, ins=ins: (dist.reduce_scatter(o, ins), o)[1])
        want[f"reduce_scatter/{dt}"] = sum((x_of(r + 7, dt) for r in everyone[1:]), x_of(7, dt))
        inp = torch.cat([x_of(rank, dt) for _ in everyone])
        o = torch.zeros(5, dtype=dt)
        case(f"reduce_scatter_tensor/{dt}", lambda o=o, inp=inp: (dist.reduce_scatter_tensor(o, inp), o)[1])
        want[f"reduce_scatter_tensor/{dt}"] = sum((x_of(r, dt) for r in everyone[1:]), x_of(0, dt))

# in place: the input is this rank's slot of the output (FSDP2 gathers so)
slots = torch.zeros(n, 4)
slots[rank] = torch.arange(4.0) + 10 * rank
case("all_gather_into_tensor/in_place", lambda: (dist.all_gather_into_tensor(slots, slots[rank]), slots)[1])
want["all_gather_into_tensor/in_place"] = torch.stack([torch.arange(4.0) + 10 * r for r in everyone])

# all_to_all_single with uneven splits: rank r sends (j + 1) rows to rank j
in_splits = [j + 1 for j in everyone]
out_splits = [rank + 1] * n
inp = torch.cat([torch.full((j + 1, 2), float(100 * rank + j)) for j in everyone])
out = torch.zeros(sum(out_splits), 2)
case("all_to_all_single/uneven", lambda: (dist.all_to_all_single(out, inp, out_splits, in_splits), out)[1])
want["all_to_all_single/uneven"] = torch.cat([torch.full((rank + 1, 2), float(100 * r + rank)) for r in everyone])
inp = torch.arange(n * 3.0) + 10 * rank
out = torch.zeros(n * 3)
case("all_to_all_single/even", lambda: (dist.all_to_all_single(out, inp), out)[1])
want["all_to_all_single/even"] = torch.cat([torch.arange(rank * 3.0, rank * 3.0 + 3) + 10 * r for r in everyone])

# ---------------------------------------------------------------- point to point
if n > 1:
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    t = torch.full((4,), float(rank))
    r_in = torch.zeros(4)
    reqs = dist.batch_isend_irecv([dist.P2POp(dist.isend, t, nxt), dist.P2POp(dist.irecv, r_in, prv)])
    for w in reqs:
        w.wait()
    case("batch_isend_irecv", lambda: r_in, torch.full((4,), float(prv)))
    if rank == 0:
        for _ in range(1, n):
            buf = torch.zeros(3, dtype=torch.int64)
            s = dist.recv(buf)  # any source
            case(f"recv_any/{s}", lambda buf=buf: buf, torch.full((3,), s, dtype=torch.int64))
    else:
        dist.send(torch.full((3,), rank, dtype=torch.int64), 0)
    buf = torch.zeros(2)
    if rank == 0:
        w = dist.isend(torch.tensor([1.5, 2.5]), 1, tag=7)
        w.wait()
    elif rank == 1:
        w = dist.irecv(buf, 0, tag=7)
        w.wait()
        case("irecv_tag", lambda: buf, torch.tensor([1.5, 2.5]))

# ---------------------------------------------------------------- coalesced, objects, barrier
ts = [torch.full((k + 1,), float(rank + k)) for k in range(3)]
with dist._coalescing_manager(async_ops=False):
    for t in ts:
        dist.all_reduce(t)
case(
    "coalescing_manager/all_reduce", lambda: ts, [torch.full((k + 1,), float(sum(everyone) + n * k)) for k in range(3)]
)
objs: list[Any] = [None] * n
case("all_gather_object", lambda: (dist.all_gather_object(objs, {"r": rank, "s": "x" * rank}), objs)[1])
want["all_gather_object"] = [{"r": r, "s": "x" * r} for r in everyone]
lst = [rank * 10, "a"] if rank == 0 else [None, None]
case("broadcast_object_list", lambda: (dist.broadcast_object_list(lst, 0), lst)[1], [0, "a"])
case("barrier", lambda: dist.barrier() or "ok", "ok")

# ---------------------------------------------------------------- subgroups
if n >= 2:
    g = dist.new_group([0, n - 1])
    if rank in (0, n - 1):
        t = torch.full((2,), float(rank + 1))
        case("new_group/all_reduce", lambda: (dist.all_reduce(t, group=g), t)[1], torch.full((2,), float(n + 1)))
        case("new_group/size", lambda: dist.get_world_size(g), 2)
    sub, subs = dist.new_subgroups_by_enumeration([[r] for r in everyone])
    case("new_subgroups_by_enumeration", lambda: dist.get_world_size(sub), 1)
    mine, _ = dist.new_subgroups(group_size=1)
    t = torch.full((2,), float(rank))
    case("new_subgroups/all_reduce", lambda: (dist.all_reduce(t, group=mine), t)[1], torch.full((2,), float(rank)))
    rev = dist.new_group(list(reversed(everyone)))
    t = torch.full((3,), float(rank))
    case(
        "reversed_group/broadcast", lambda: (dist.broadcast(t, n - 1, group=rev), t)[1], torch.full((3,), float(n - 1))
    )
    case("reversed_group/rank", lambda: dist.get_rank(rev), rank)

save(outdir, "collectives", {"got": got, "want": want})
dist.destroy_process_group()
