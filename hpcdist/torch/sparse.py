"""All-reduce of sparse COO tensors (SUM), as gloo does it.

Every rank's coalesced ``(indices, values)`` travel to every rank (two
all-gathers of buffers padded to the largest ``nnz``, after one all-gather of
the counts); each rank then adds them up into one coalesced sparse tensor and
copies it into its input, which takes the result's ``nnz``. Collective over
the group; the tensors' shapes (sparse and dense dimensions) must agree on
every rank. Only ``ReduceOp.SUM`` is defined, as with gloo.
"""

from __future__ import annotations

from typing import Any

import torch

from .. import collectives as C
from ..ops import RedOpType

__all__ = ["all_reduce_sparse"]


def all_reduce_sparse(tensors: list[Any], op: Any, group: Any, who: str = "hpcdist backend: all_reduce") -> None:
    """Sum each sparse tensor of ``tensors`` over ``group``, in place (blocking; collective over the group).

    ``who`` begins the argument errors (the backend's call, or the facade's ``all_reduce``); they are raised
    before any message moves."""
    kind = getattr(op, "op", op)  # torch's ReduceOp object, or its RedOpType
    try:
        summing = type(kind) is not bool and int(kind) == int(RedOpType.SUM)
    except (TypeError, ValueError):  # a PREMUL_SUM object, or no op at all
        summing = False
    if not summing:
        raise ValueError(
            f"{who} of a sparse tensor supports ReduceOp.SUM only (as gloo does), got {kind!r}; "
            "reduce t.to_dense() for other operations"
        )
    for t in tensors:
        if t.layout is not torch.sparse_coo:
            raise TypeError(
                f"{who}: a list mixing sparse and dense tensors was given ({t.layout}); "
                "reduce sparse and dense tensors in separate calls"
            )
    for t in tensors:
        _one(t, group)


def _one(t: Any, group: Any) -> None:
    size = group.size()
    c = t.coalesce()
    idx, val = c.indices(), c.values()
    nnz = torch.tensor([idx.shape[1]], dtype=torch.int64)
    counts = [torch.empty_like(nnz) for _ in range(size)]
    C.all_gather(counts, nnz, group=group)
    n = [int(k) for k in counts]
    top = max(n)
    pad_idx = torch.zeros((idx.shape[0], top), dtype=idx.dtype)
    pad_idx[:, : n[group.rank()]] = idx
    pad_val = torch.zeros((top, *val.shape[1:]), dtype=val.dtype)
    pad_val[: n[group.rank()]] = val
    all_idx = [torch.empty_like(pad_idx) for _ in range(size)]
    all_val = [torch.empty_like(pad_val) for _ in range(size)]
    C.all_gather(all_idx, pad_idx, group=group)
    C.all_gather(all_val, pad_val, group=group)
    total = torch.sparse_coo_tensor(
        torch.cat([a[:, :k] for a, k in zip(all_idx, n)], dim=1),
        torch.cat([v[:k] for v, k in zip(all_val, n)]),
        t.shape,
    ).coalesce()
    t.copy_(total)
