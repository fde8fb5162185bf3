"""torch.distributed.checkpoint over backend "hpcdist": save at 4 ranks (FSDP2 shards), load at 2 (resharded).

The saved values are known (a formula per parameter); after loading at 2
ranks every rank holds its half of each parameter and the full values equal
the formula.
"""

from __future__ import annotations

from pathlib import Path

from conftest import launch, load, same, torch


def test_save_at_4_load_at_2(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt"
    launch(4, "dcp.py", "hpcdist", tmp_path, args=["save", str(ckpt)])
    assert (ckpt / ".metadata").exists() and len(list(ckpt.glob("*.distcp"))) == 4
    launch(2, "dcp.py", "hpcdist", tmp_path, args=["load", str(ckpt)])
    saved = torch.load(tmp_path / "full.pt")
    names = sorted(saved)
    for i, name in enumerate(names):  # the formula progs/dcp.py wrote, in sorted parameter order
        p = saved[name]
        assert same(p, torch.arange(p.numel(), dtype=torch.float32).reshape(p.shape) / (i + 3) + i), name
    for r in range(2):
        loaded = load(tmp_path, "loaded", r)
        assert sorted(loaded) == names
        for name, (local, full) in loaded.items():
            assert same(full, saved[name]), (r, name)
            rows = saved[name].shape[0] // 2
            assert same(local, saved[name][r * rows : (r + 1) * rows]), (r, name)
