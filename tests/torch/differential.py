"""The machinery of a differential audit: one program run on two implementations, its records compared.

``test_backend_audit.py`` (torch.distributed on gloo and on the backend "hpcdist") and
``test_facade_audit.py`` (``import torch.distributed as dist`` on gloo and ``import hpcdist as dist``) are
each both a test and the program it launches: the program runs every scenario of a :class:`Scenarios`
registry with :func:`run_scenarios` and saves per scenario what it returned or the types of what it
raised (:func:`raised`); the tests compare two runs rank by rank with :func:`compare_runs`.
"""

from __future__ import annotations

import copy
import sys
from collections.abc import Callable
from typing import Any

import torch

#: what a Work's result()/get_future() record where the backend implements neither
UNSUPPORTED = "unsupported"
Scenario = Callable[[int, int], Any]


class Scenarios(dict[str, Scenario]):
    """Scenarios by name, in the order they are registered; the registry is also the decorator that registers."""

    def __call__(self, fn: Scenario) -> Scenario:
        self[fn.__name__] = fn
        return fn


def rank_input(r: int, shape: tuple[int, ...], dtype: Any = torch.float32) -> Any:
    """Rank ``r``'s input of ``shape``: ``1, 2, 3, ...`` plus ``10 r``, as ``dtype`` (distinct on every rank)."""
    n = 1
    for s in shape:
        n *= s
    return (torch.arange(n, dtype=torch.float64).reshape(shape) + 10 * r + 1).to(dtype)


def raised(exc: BaseException) -> tuple[str, tuple[str, ...]]:
    """What a scenario records for an exception: its type's names, most derived first (compared by subclass)."""
    return ("raised", tuple(c.__name__ for c in type(exc).__mro__))


def run_scenarios(
    scenarios: Scenarios,
    rank: int,
    n: int,
    barrier: Callable[[], Any],
    settle: Callable[[], Any],
    messages: list[str] | None = None,
) -> tuple[dict[str, Any], dict[str, str]]:
    """Run every scenario in order on this rank, then ``barrier()``; their records, and what each raise said.

    ``settle()`` runs after a scenario raised (gloo's barrier rethrows the error of a work its worker thread
    has not yet marked complete: it lets the thread finish); ``messages`` collects what raises inside a
    scenario said (cleared before each), for reading, not compared.
    """
    res: dict[str, Any] = {}
    msgs: dict[str, str] = {}
    for name, fn in scenarios.items():
        print(f"rank {rank}: {name}", file=sys.stderr, flush=True)  # where a launch that ran past its limit was
        if messages is not None:
            messages.clear()
        try:
            res[name] = ("ok", fn(rank, n))
        except Exception as exc:
            res[name] = raised(exc)
            msgs[name] = str(exc)[:300]
            settle()
        if messages:
            msgs[name] = " | ".join([msgs.get(name, ""), *messages])
            settle()
        barrier()
    return res, msgs


def close(a: Any, b: Any, path: str = "", runtime_as: tuple[str, ...] = ()) -> str | None:
    """None where ``a`` (hpcdist's record) matches ``b`` (the reference's), else where and how they differ.

    Tensors: same dtype and shape, equal for integers, allclose for floats. Raises: hpcdist's type is the
    reference's or a subclass; where the reference raised a plain RuntimeError, the type names in
    ``runtime_as`` are accepted too. A reference Work without result()/future (:data:`UNSUPPORTED`) matches all.
    """
    if isinstance(b, tuple) and len(b) == 2 and b[0] == UNSUPPORTED:
        return None
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b) == 2 and a[0] == b[0] == "raised":
        ok = b[1][0] in a[1] or (b[1][0] == "RuntimeError" and a[1][0] in runtime_as)
        return None if ok else f"{path}: raised {a[1][0]} vs {b[1][0]}"
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        if a.dtype != b.dtype or a.shape != b.shape:
            return f"{path}: {a.dtype}{tuple(a.shape)} vs {b.dtype}{tuple(b.shape)}"
        exact = not (a.is_floating_point() or a.is_complex())
        ok = torch.equal(a, b) if exact else torch.allclose(a, b, rtol=1e-3 if a.element_size() <= 2 else 1e-6)
        return None if ok else f"{path}: {a} vs {b}"
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)) and len(a) == len(b):
        return next((d for i, (x, y) in enumerate(zip(a, b)) if (d := close(x, y, f"{path}[{i}]", runtime_as))), None)
    if isinstance(a, dict) and isinstance(b, dict) and a.keys() == b.keys():
        return next((d for k in a if (d := close(a[k], b[k], f"{path}[{k!r}]", runtime_as))), None)
    try:
        return None if a == b else f"{path}: {a!r} vs {b!r}"
    except Exception:
        return f"{path}: {a!r} vs {b!r}"


def xfail_param(name: str, xfail: dict[str, str]) -> Any:
    """Scenario ``name`` as a test parameter: a strict xfail with its reason where ``xfail`` lists it."""
    import pytest

    if name in xfail:
        return pytest.param(name, marks=pytest.mark.xfail(strict=True, reason=xfail[name]))
    return name


def compare_runs(
    ours: list[dict[str, Any]],
    ref: list[dict[str, Any]],
    name: str,
    label: str,
    ref_wrong: dict[str, tuple[tuple[Any, ...], str]],
    runtime_as: tuple[str, ...] = (),
) -> None:
    """Assert that every rank's record of scenario ``name`` in ``ours`` matches ``ref``'s (:func:`close`).

    ``ref_wrong[name]``: the path to a field of the record that the reference gets wrong (False) and hpcdist
    must get right (True); that field is checked so, then left out of the comparison. ``label`` names the
    reference in the failure message (``hpcdist vs <label>``).
    """
    for r, (mine, theirs) in enumerate(zip(ours, ref, strict=True)):
        got, want = copy.deepcopy(mine[name]), copy.deepcopy(theirs[name])
        if name in ref_wrong and got[1] is not None:
            *within, key = ref_wrong[name][0]
            mine_rec, ref_rec = got[1], want[1]
            for k in within:
                mine_rec, ref_rec = mine_rec[k], ref_rec[k]
            assert mine_rec.pop(key) is True and ref_rec.pop(key) is False, (r, name, got)
        diff = close(got, want, runtime_as=runtime_as)
        assert diff is None, f"rank {r} {name}: hpcdist vs {label} {diff}"
