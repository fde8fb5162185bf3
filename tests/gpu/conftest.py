"""Fixtures of the GPU tests: each test runs once per device path.

``gpu_path`` (session scope) is one of:

* ``staged``     — ``backend="mpi"``, ``HPCDIST_CUDA_AWARE=0``: pinned host staging;
* ``cuda-aware`` — ``backend="mpi"``, ``HPCDIST_CUDA_AWARE=1``: device pointers to
  MPI; only where the MPI says it is CUDA-aware (or ``HPCDIST_TEST_CUDA_AWARE=1``),
  since a plain MPI would read device pointers as host memory. With
  ``HPCDIST_TEST_CUDA_AWARE=managed`` the path runs on any MPI: CuPy then
  allocates CUDA managed memory, which the host can read, so the CUDA-aware
  engine (device pointers to MPI, packing and reduction arithmetic on the GPU,
  stream syncs) runs for real; torch tensors are skipped in that mode;
* ``nccl``       — ``backend="cpu:mpi,cuda:nccl"``; only with one GPU per rank
  (NCCL refuses two ranks on one GPU).

Each path initializes the default group and the matrix groups of
tests/mpi/conftest.py (world, rev, head, split) and pins their CUDA engine.
Without CuPy or a GPU every test skips with the reason. Decisions to skip a
path are agreed over MPI so that no rank waits for another in a collective.
"""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from gpu_arrays import gpu_missing, load_matrix

import hpcdist as dist
from hpcdist.backends.cuda_aware import CudaAwareEngine
from hpcdist.backends.nccl import NCCLEngine
from hpcdist.backends.staged import StagedEngine
from hpcdist.gpu import set_device_for_local_rank

PATHS = ["staged", "cuda-aware", "nccl"]
#: the engine that serves each path's device arrays
ENGINE_OF_PATH = {"staged": StagedEngine, "cuda-aware": CudaAwareEngine, "nccl": NCCLEngine}
MATRIX = load_matrix()
GROUP_KINDS = MATRIX.GROUP_KINDS
_SKIP_NCCL_OPS = {"BAND", "BOR", "BXOR"}


def _agree(ok: bool) -> bool:
    """True only when every rank of the job says True."""
    from mpi4py import MPI

    return bool(MPI.COMM_WORLD.allreduce(int(ok), op=MPI.MIN))


def _mpi_awareness():
    """What the MPI says of CUDA (the user's HPCDIST_CUDA_AWARE override left out)."""
    from hpcdist.gpu import cuda_aware

    return cuda_aware.detect({k: v for k, v in os.environ.items() if k != "HPCDIST_CUDA_AWARE"}, cuda_aware.query_mpi())


def _path_problem(path: str) -> str | None:
    from mpi4py import MPI

    from hpcdist.backends import is_backend_available

    if path == "cuda-aware":
        forced = os.environ.get("HPCDIST_TEST_CUDA_AWARE") in ("1", "managed")
        aware = _mpi_awareness()
        if not (forced or aware.enabled):
            return f"this MPI is not CUDA-aware ({aware.reason}); set HPCDIST_TEST_CUDA_AWARE=1 to force the path, or =managed to run it on managed memory"
    if path == "nccl":
        if not is_backend_available("nccl"):
            return "NCCL is not available through CuPy"
        import cupy

        from hpcdist.topology import split_shared

        node = split_shared(MPI.COMM_WORLD, 60.0, "GPU test setup", "every rank runs the GPU tests")
        local = node.Get_size()
        node.Free()
        gpus = int(cupy.cuda.runtime.getDeviceCount())
        if local > gpus:
            return f"{local} ranks on this node but {gpus} GPU(s): NCCL needs one GPU per rank"
    return None


def _use_managed_memory(on: bool) -> None:
    """CuPy allocations in CUDA managed memory (host-readable) or back to its default pool."""
    import cupy
    from gpu_arrays import MANAGED_ONLY

    cupy.cuda.Device().synchronize()
    pool = cupy.cuda.MemoryPool(cupy.cuda.malloc_managed) if on else cupy.get_default_memory_pool()
    cupy.cuda.set_allocator(pool.malloc)
    MANAGED_ONLY[0] = on


@pytest.fixture(scope="session", params=PATHS)
def gpu_path(request):
    why = gpu_missing()
    if not _agree(why is None):
        pytest.skip(why or "a GPU is missing on another rank")
    path = request.param
    problem = _path_problem(path)
    if not _agree(problem is None):
        pytest.skip(problem or f"the {path} path cannot run on another rank")
    if dist.is_initialized():
        pytest.skip("tests/gpu initializes its own process groups: run it in its own pytest session")
    saved = os.environ.get("HPCDIST_CUDA_AWARE")
    managed = (  # a CUDA-aware MPI runs the path on device memory, as users do
        path == "cuda-aware"
        and os.environ.get("HPCDIST_TEST_CUDA_AWARE") == "managed"
        and not _agree(_mpi_awareness().enabled)
    )
    if managed:
        _use_managed_memory(True)
    if path != "nccl":
        os.environ["HPCDIST_CUDA_AWARE"] = "1" if path == "cuda-aware" else "0"
    backend = "cpu:mpi,cuda:nccl" if path == "nccl" else "mpi"
    timeout = timedelta(seconds=float(os.environ.get("HPCDIST_TIMEOUT", "60")))
    try:
        dist.init_process_group(backend, timeout=timeout)
        set_device_for_local_rank()
        groups = MATRIX.make_groups(backend)
        for g in groups.values():  # pin each group's CUDA engine while the override is set
            pg = dist.group.WORLD if g is None else g
            if pg is not dist.GroupMember.NON_GROUP_MEMBER and pg is not None:
                assert isinstance(pg.engine("cuda"), ENGINE_OF_PATH[path])
        yield groups
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
        if managed:
            _use_managed_memory(False)
        if saved is None:
            os.environ.pop("HPCDIST_CUDA_AWARE", None)
        else:
            os.environ["HPCDIST_CUDA_AWARE"] = saved


@pytest.fixture(params=GROUP_KINDS)
def group(request, gpu_path):
    return gpu_path[request.param]


@pytest.fixture
def members(group):
    return MATRIX.members_of(group)


@pytest.fixture(autouse=True)
def _in_step(gpu_path):
    dist.barrier()
    yield
    dist.barrier()


def pytest_collection_modifyitems(config, items):
    """Cases NCCL cannot run (its errors are pinned in test_gpu_specific.py) skip with the reason."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if params.get("gpu_path") != "nccl":
            continue
        name = item.originalname if hasattr(item, "originalname") else item.name
        opname, dtype = params.get("opname"), params.get("dtype")
        if name == "test_all_reduce_ops" and opname in _SKIP_NCCL_OPS and (dtype != "bool" or opname == "BXOR"):
            item.add_marker(pytest.mark.skip(reason="NCCL has no bitwise reductions (error pinned elsewhere)"))
        if name == "test_async_ops_and_futures":
            item.add_marker(
                pytest.mark.skip(
                    reason="NCCL Work.wait() orders the stream without blocking the host (torch semantics), so "
                    "is_completed() right after wait() may be False; covered by test_nccl_stream_semantics"
                )
            )
