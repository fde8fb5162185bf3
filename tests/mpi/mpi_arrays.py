"""Array kinds and reference data for the MPI tests (NumPy is the reference)."""

from __future__ import annotations

import numpy as np
import pytest

try:
    import torch
except ImportError:  # torch is optional
    torch = None

KINDS = ["numpy", "torch"]
# logical dtypes; bfloat16 exists only for torch
DTYPES = ["float32", "float64", "int32", "int64", "float16", "bfloat16", "complex128", "uint8", "bool"]
FLOATS = ["float32", "float64", "float16", "bfloat16"]
INTS = ["int32", "int64", "uint8"]


def need(kind: str, dtype: str = "float64") -> None:
    """Skip (with the reason) combinations that do not exist."""
    if kind == "torch" and torch is None:
        pytest.skip("torch is not installed")


def cases(dtypes: list[str]) -> list[tuple[str, str]]:
    """(kind, dtype) pairs that exist (NumPy has no bfloat16)."""
    return [(k, d) for k in KINDS for d in dtypes if not (k == "numpy" and d == "bfloat16")]


def values(rank: int, size: int, dtype: str, salt: int = 0) -> np.ndarray:
    """Rank ``rank``'s deterministic input: small numbers exact in every dtype."""
    i = np.arange(size, dtype=np.int64)
    v = (i * 3 + rank * 5 + salt) % 7 + (1 if dtype != "bool" else 0)
    if dtype == "bool":
        return (i + rank + salt) % 3 == 0
    if dtype.startswith("complex"):
        return (v + 1j * ((i + rank) % 3)).astype(np.complex128)
    return v.astype(np.float64 if dtype in FLOATS else np.int64)


def make(kind: str, data: np.ndarray, dtype: str):
    """``data`` as an array of ``kind`` and logical ``dtype``."""
    if kind == "numpy":
        return np.array(data).astype(dtype)
    tdt = getattr(torch, dtype)
    return torch.tensor(np.array(data).astype(np.float64 if dtype == "bfloat16" else dtype)).to(tdt)


def empty(kind: str, shape, dtype: str):
    if kind == "numpy":
        return np.full(shape, 99, dtype=dtype) if dtype != "bool" else np.zeros(shape, dtype=bool)
    return (
        torch.full(shape, 99, dtype=getattr(torch, dtype)) if dtype != "bool" else torch.zeros(shape, dtype=torch.bool)
    )


def to_np(x) -> np.ndarray:
    """Any test array -> float64/complex128/bool NumPy array for comparison."""
    if torch is not None and isinstance(x, torch.Tensor):
        if x.dtype == torch.bfloat16 or x.dtype == torch.float16:
            x = x.float()
        x = x.numpy()
    x = np.asarray(x)
    if x.dtype == bool:
        return x
    return x.astype(np.complex128 if x.dtype.kind == "c" else np.float64)


def cast(ref: np.ndarray, dtype: str) -> np.ndarray:
    """The reference result as the dtype would hold it (rounded/wrapped), back in float64."""
    if dtype == "bool":
        return ref.astype(bool)
    if dtype == "bfloat16":
        return to_np(torch.tensor(ref.astype(np.float64)).to(torch.bfloat16))
    return to_np(np.asarray(ref).astype(dtype))
