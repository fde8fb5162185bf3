"""The torch backend "hpcdist" on CUDA tensors: collectives and DDP at 2 ranks against the CPU run.

A 2-rank mpiexec job runs the same program with CUDA tensors (hpcdist's GPU
engines: CUDA-aware or staged MPI) and with CPU tensors; the results must be
equal. Skips with the reason without a CUDA build of torch, CuPy or 2 GPUs'
worth of ranks (ranks may share one GPU: the MPI paths allow that).
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import pytest

torch = pytest.importorskip("torch", reason="the torch backend's GPU tests need torch")
pytest.importorskip("cupy", reason="hpcdist's GPU engines need CuPy (pip install 'hpcdist[gpu]')")
if not torch.cuda.is_available():
    pytest.skip("torch has no CUDA device here (a CPU build of torch, or no GPU)", allow_module_level=True)

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from mpirun import run_mpi  # noqa: E402

PROGRAM = textwrap.dedent(
    """
    import sys
    import torch, torch.distributed as dist
    import hpcdist.torch  # noqa: F401
    from torch.nn.parallel import DistributedDataParallel as DDP

    device = sys.argv[1]
    dist.init_process_group("hpcdist")
    rank, n = dist.get_rank(), dist.get_world_size()
    if device == "cuda":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    out = {}
    for dt in (torch.float32, torch.bfloat16, torch.int64):
        t = (torch.arange(6) + rank).to(dt).to(device)
        dist.all_reduce(t)
        out[f"all_reduce/{dt}"] = t.cpu()
        w = dist.all_reduce((torch.arange(6) * (rank + 1)).to(dt).to(device), async_op=True)
        out[f"async/{dt}"] = w.get_future().wait()[0].cpu()
        b = (torch.arange(4) + 10 * rank).to(dt).to(device)
        dist.broadcast(b, 1)
        out[f"broadcast/{dt}"] = b.cpu()
        g = torch.zeros(4 * n, dtype=dt, device=device)
        dist.all_gather_into_tensor(g, (torch.arange(4) + rank).to(dt).to(device))
        out[f"all_gather/{dt}"] = g.cpu()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 4).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(3):
        gen = torch.Generator().manual_seed(10 * rank + step)
        x = torch.randn(5, 8, generator=gen).to(device)
        opt.zero_grad()
        model(x).square().sum().backward()
        opt.step()
    out["ddp"] = {k: v.cpu() for k, v in model.module.state_dict().items()}
    torch.save(out, f"{sys.argv[2]}/{device}.rank{rank}.pt")
    dist.destroy_process_group()
    """
)


def test_cuda_equals_cpu(tmp_path: Path, request: pytest.FixtureRequest) -> None:
    # conftest's autouse fixture runs every test once per device path; the child job chooses its own path
    if request.node.callspec.params.get("gpu_path", "staged") != "staged":
        pytest.skip("the child job is the same under every path of this session: it runs once, under 'staged'")
    for device in ("cpu", "cuda"):
        # the path's override (HPCDIST_CUDA_AWARE=1 on an MPI that is not CUDA-aware) is not the child's: unset
        res = run_mpi(2, PROGRAM, tmp_path, args=[device, str(tmp_path)], env={"HPCDIST_CUDA_AWARE": ""}, limit=240)
        assert res.returncode == 0 and not res.timed_out, res.output[-3000:]
    for r in range(2):
        cpu = torch.load(tmp_path / f"cpu.rank{r}.pt")
        gpu = torch.load(tmp_path / f"cuda.rank{r}.pt")
        for k, v in cpu.items():
            if isinstance(v, dict):
                for p in v:
                    torch.testing.assert_close(gpu[k][p], v[p], rtol=1e-5, atol=1e-6)
            else:
                assert torch.equal(gpu[k], v), (r, k)
