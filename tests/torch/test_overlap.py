"""DDP's gradient all-reduces overlap backward on backend "hpcdist": an ordering, not a timing.

progs/overlap.py records, on each of 2 ranks, the order in which one
backward pass of a 6-layer model under DDP (3 buckets of 2 layers) produced
its gradients and issued DDP's all-reduces, holding rank 1 at its first
gradient until rank 0 ran its last (see its docstring). Backward runs from
the last layer to the first, so the known answer is: the first bucket (the
last two layers) is issued after its 4 gradients and before the first
layer's, and on rank 0 it is still incomplete when the last gradient hook
runs (rank 1 has not joined it yet). A backend that ran the all-reduce
inside backward, synchronously, would fail both.

The same program then all-reduces 1 MiB blocking and asynchronously with the
engines' ``all_reduce`` wrapped: the blocking call must take the group's
engine (the shared-memory one on one node, where its table says it wins) and
the asynchronous one MPI's non-blocking path.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from conftest import launch, load


@pytest.fixture(scope="module")
def record(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    out = tmp_path_factory.mktemp("overlap")
    launch(2, "overlap.py", "hpcdist", out, limit=200)
    return [load(Path(out), "overlap", r) for r in range(2)]


def test_three_buckets_issued(record: list[dict[str, Any]]) -> None:
    for r, rec in enumerate(record):
        assert rec["buckets"] == 3, f"rank {r}: DDP issued {rec['buckets']} all-reduces, expected 3 buckets"


def test_first_bucket_issued_before_the_last_gradient(record: list[dict[str, Any]]) -> None:
    for r, rec in enumerate(record):
        kinds = [what for what, _ in rec["events"]]
        first = kinds.index("all_reduce")
        last_grad = len(kinds) - 1 - kinds[::-1].index("grad")
        assert kinds[:first] == ["grad"] * 4, f"rank {r}: events {rec['events']}"
        assert first < last_grad, f"rank {r}: the first all-reduce came after backward's last gradient"
        assert rec["events"][last_grad][1].startswith("0."), rec["events"]  # the first layer's, last


def test_first_bucket_incomplete_at_the_last_gradient(record: list[dict[str, Any]]) -> None:
    at_last = record[0]["state"]["at_last"]
    assert at_last is not None, "rank 0 never recorded its last gradient hook"
    assert at_last["issued"] == 2, f"rank 0 had issued {at_last['issued']} all-reduces at its last gradient hook"
    assert at_last["first_completed"] is False, (
        "the first bucket's all-reduce had completed on rank 0 before rank 1 joined it: it ran synchronously "
        "inside backward"
    )
    assert record[1]["state"]["released"], "rank 1 waited 60 s for rank 0's last gradient hook: backward was blocked"


def test_blocking_all_reduce_takes_the_groups_engine_async_takes_mpi(record: list[dict[str, Any]]) -> None:
    """A 1 MiB all_reduce: blocking -> the group's engine (shared memory on one node, in its window);
    asynchronous -> MPI's non-blocking path only (a shared-memory call would complete before returning)."""
    for r, rec in enumerate(record):
        p = rec["paths"]
        assert p["value"], f"rank {r}: wrong sums"
        assert p["async"] == ["MPIEngine"], f"rank {r}: the asynchronous all_reduce entered {p['async']}"
        if p["engine"] == "ShmEngine" and p["window"] == "shm":
            assert p["blocking"] == ["ShmEngine"], f"rank {r}: the blocking all_reduce entered {p['blocking']}"
        else:  # HPCDIST_SHM=0 or a machine where shared memory never wins at 1 MiB: the MPI engine
            assert p["blocking"][-1:] == ["MPIEngine"], f"rank {r}: {p}"
