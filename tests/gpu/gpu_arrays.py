"""Device array kinds for the GPU tests, with the same names as tests/mpi/mpi_arrays.py.

:func:`host_bodies` loads tests/mpi/test_collectives.py with this module in
place of ``mpi_arrays``, so its test bodies run unchanged on CuPy arrays and
torch CUDA tensors (NumPy stays the reference).
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np
import pytest

MPI_TESTS = Path(__file__).resolve().parent.parent / "mpi"


def _load(name: str, path: Path) -> ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod  # dataclasses look their module up there
    spec.loader.exec_module(mod)
    return mod


HOST = _load("hpcdist_host_mpi_arrays", MPI_TESTS / "mpi_arrays.py")


def load_matrix() -> ModuleType:
    """tests/mpi/matrix.py: the groups of the test matrix."""
    return _load("hpcdist_host_matrix", MPI_TESTS / "matrix.py")


torch = HOST.torch
values, cast = HOST.values, HOST.cast
DTYPES, FLOATS, INTS = HOST.DTYPES, HOST.FLOATS, HOST.INTS

KINDS = ["cupy", "torch"]


def _cupy() -> Any:
    import cupy

    return cupy


#: set by conftest.py while the CUDA-aware path runs on managed memory (HPCDIST_TEST_CUDA_AWARE=managed):
#: CuPy then allocates host-accessible memory, torch does not, so torch tensors must not reach MPI
MANAGED_ONLY = [False]


def torch_cuda() -> bool:
    return torch is not None and torch.cuda.is_available() and not MANAGED_ONLY[0]


def need(kind: str, dtype: str = "float64") -> None:
    if kind == "torch" and MANAGED_ONLY[0]:
        pytest.skip("CUDA-aware path on managed memory: torch's allocator is not managed, MPI cannot read it")
    if kind == "torch" and not torch_cuda():
        pytest.skip("torch has no CUDA here (CPU build or no GPU)")
    if kind == "cupy" and dtype == "bfloat16":
        pytest.skip("CuPy has no bfloat16")


def cases(dtypes: list[str]) -> list[tuple[str, str]]:
    return [(k, d) for k in KINDS for d in dtypes if not (k == "cupy" and d == "bfloat16")]


def make(kind: str, data: Any, dtype: str) -> Any:
    if kind == "cupy":
        return _cupy().asarray(np.array(data).astype(dtype))
    return HOST.make("torch", data, dtype).cuda()


def empty(kind: str, shape: Any, dtype: str) -> Any:
    if kind == "cupy":
        return _cupy().asarray(HOST.empty("numpy", shape, dtype))
    return HOST.empty("torch", shape, dtype).cuda()


def to_np(x: Any) -> np.ndarray:
    cupy = sys.modules.get("cupy")
    if cupy is not None and isinstance(x, cupy.ndarray):
        return HOST.to_np(x.get())
    if torch is not None and isinstance(x, torch.Tensor):
        return HOST.to_np(x.detach().cpu())
    return HOST.to_np(x)


_SPIN_SRC = (
    'extern "C" __global__ void spin(long long cycles) {'
    "  long long t0 = clock64(); while (clock64() - t0 < cycles) {} }"
)


def spin(seconds: float) -> None:
    """Keep the current CuPy stream busy for about ``seconds`` (one thread counting GPU clock cycles)."""
    cupy = _cupy()
    kernel = cupy.RawKernel(_SPIN_SRC, "spin")
    kernel((1,), (1,), (cupy.int64(int(seconds * 2_000_000_000)),))  # H100/A100 SM clocks: 1.4-2 GHz


def gpu_missing() -> str | None:
    """Why the GPU tests cannot run here, or None."""
    try:
        import cupy
    except Exception as exc:
        return f"CuPy is not importable ({type(exc).__name__}: {exc})".splitlines()[0]
    try:
        n = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:
        return f"no CUDA device ({type(exc).__name__})"
    return None if n > 0 else "no CUDA device"


def host_bodies(skip: set[str]) -> dict[str, Any]:
    """The ``test_*`` functions of tests/mpi/test_collectives.py over device kinds (minus ``skip``)."""
    shim = ModuleType("mpi_arrays")
    shim.__dict__.update({k: v for k, v in vars(HOST).items() if not k.startswith("__")})
    shim.__dict__.update(KINDS=KINDS, need=need, cases=cases, make=make, empty=empty, to_np=to_np)
    saved = sys.modules.get("mpi_arrays")
    sys.modules["mpi_arrays"] = shim
    try:
        mod = _load("hpcdist_gpu_host_bodies", MPI_TESTS / "test_collectives.py")
    finally:
        if saved is None:
            sys.modules.pop("mpi_arrays", None)
        else:
            sys.modules["mpi_arrays"] = saved
    return {k: v for k, v in vars(mod).items() if k.startswith("test_") and callable(v) and k not in skip}


def me() -> int:
    """This process's global rank."""
    import hpcdist as dist

    return dist.get_rank()


def n() -> int:
    """The world size."""
    import hpcdist as dist

    return dist.get_world_size()
