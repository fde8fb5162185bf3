"""hpcdist.checkpoint under mpiexec: round trips, resharding, corruption, structure errors, async save.

Every checkpoint lives in a directory made by world rank 0 and shared with the
others (the ranks of one host see one file system). References are NumPy
arrays built independently of the checkpoint code (``np.arange`` globals,
the original state's copies).
"""

from __future__ import annotations

import os
import shutil
import signal
import tempfile
from datetime import date
from pathlib import Path, PurePosixPath

import numpy as np
import pytest

import hpcdist as dist

h5py = pytest.importorskip("h5py")
ck = pytest.importorskip("hpcdist.checkpoint")

try:
    import torch
except ImportError:  # pragma: no cover - torch is optional
    torch = None

try:
    import ml_dtypes
except ImportError:
    ml_dtypes = None


pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")  # the complex32 entry


@pytest.fixture
def ckdir():
    """A fresh directory shared by all ranks (made by rank 0, removed after the test)."""
    box = [tempfile.mkdtemp(prefix="hpcdist-ck-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    yield Path(box[0])
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(box[0], ignore_errors=True)


def _global(shape, dtype=np.float64):
    return (np.arange(int(np.prod(shape))) % 251).astype(dtype).reshape(shape)


def _numeric_state(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    st = {
        "f16": rng.standard_normal((3, 5)).astype(np.float16),
        "f32": rng.standard_normal(7).astype(np.float32),
        "f64": rng.standard_normal((2, 2, 3)),
        "c64": (rng.standard_normal(4) + 1j * rng.standard_normal(4)).astype(np.complex64),
        "c128": np.array(3 - 4j),
        "bool": rng.standard_normal(9) > 0,
        "ints": {
            str(dt): rng.integers(-100 if dt.kind == "i" else 0, 100, 6).astype(dt)
            for dt in map(np.dtype, ["i1", "i2", "i4", "i8", "u1", "u2", "u4", "u8"])
        },
        "empty": np.zeros((0, 3), np.float32),
    }
    if ml_dtypes is not None:
        st["ml_bf16"] = rng.standard_normal(5).astype(ml_dtypes.bfloat16)
    if torch is not None:
        g = torch.Generator().manual_seed(seed)
        st["torch"] = {
            "bf16": torch.randn(4, 3, generator=g).to(torch.bfloat16),
            "f16": torch.randn(6, generator=g).half(),
            "f32": torch.randn(2, 3, generator=g),
            "i64": torch.arange(5),
            "bool": torch.tensor([True, False, True]),
            "c64": torch.randn(3, dtype=torch.complex64, generator=g),
            "param": torch.nn.Parameter(torch.randn(3, generator=g)),
            "strided": torch.arange(12.0).reshape(3, 4).t(),
            # dtypes NumPy lacks, stored as their bits (NaN patterns among the random bytes)
            "f8": torch.randint(0, 256, (2, 5), dtype=torch.uint8, generator=g).view(torch.float8_e4m3fn),
            "f8_e5m2_strided": torch.randint(0, 256, (4, 3), dtype=torch.uint8, generator=g)
            .view(torch.float8_e5m2)
            .t(),
            "c32": torch.randint(0, 256, (12,), dtype=torch.uint8, generator=g).view(torch.complex32),
        }
    return st


def _values() -> dict:
    return {
        "int": 12345678901,
        "big": 2**80,
        "float": 0.1,
        "bool": True,
        "complex": 1.5 - 2j,
        "str": "grüße ∑",
        "empty_str": "",
        "bytes": b"\x00\x01\xff",
        "none": None,
        "np_scalar": np.float32(2.5),
        "object": {"lr": [0.1, 0.01], "when": date(2026, 1, 2), "t": (1, "a")},
        7: {"int_key": 1},
    }


def _zeros_like(st):
    if isinstance(st, dict):
        return {k: _zeros_like(v) for k, v in st.items()}
    if torch is not None and isinstance(st, torch.Tensor):
        z = torch.zeros_like(st.detach())
        return torch.nn.Parameter(z) if isinstance(st, torch.nn.Parameter) else z
    if isinstance(st, np.ndarray):
        return np.zeros_like(st)
    return None


def _assert_same(got, want, path=""):
    if isinstance(want, dict):
        assert set(got) == set(want), path
        for k in want:
            _assert_same(got[k], want[k], f"{path}[{k!r}]")
    elif torch is not None and isinstance(want, torch.Tensor):
        assert isinstance(got, torch.Tensor) and got.dtype == want.dtype and got.shape == want.shape, path
        if want.dtype in (torch.float8_e4m3fn, torch.float8_e5m2, torch.complex32):  # no torch.equal: bit for bit
            raw = [bytes(t.contiguous().view(torch.uint8).numpy()) for t in (got, want)]
            assert raw[0] == raw[1], path
        else:
            assert torch.equal(got.detach(), want.detach()), path
    elif isinstance(want, np.ndarray):
        assert isinstance(got, np.ndarray) and got.dtype == want.dtype and got.shape == want.shape, path
        assert got.tobytes() == want.tobytes(), path  # bit for bit
    else:
        assert type(got) is type(want) and got == want, path


def _path_for(ckdir, members, name):
    return ckdir / f"{name}_g{min(members)}"  # the split groups save side by side


def test_round_trip_every_kind_and_dtype(ckdir, group, members):
    if not members:
        return
    want = {"arrays": _numeric_state(42), "values": _values()}
    path = _path_for(ckdir, members, "kinds")
    assert ck.save(want, path, group=group) == path.absolute()
    got = _zeros_like(want)  # values (not arrays) become None: load replaces them
    arrays_before = got["arrays"]
    out = ck.load(got, path, group=group, trusted=True)
    assert out is got and got["arrays"] is arrays_before  # filled in place
    _assert_same(got, want)


def test_values_load_restricted_by_default(ckdir):
    path = ckdir / "custom"
    ck.save({"plain": {"a": [1, 2]}, "custom": PurePosixPath("/x")}, path)  # not on the restricted allow-list
    got = {"plain": {"a": None}, "custom": None}
    with pytest.raises(ck.CheckpointError, match="restricted"):
        ck.load(got, path)
    ck.load(got, path, trusted=True)
    assert got["custom"] == PurePosixPath("/x")
    got = {"plain": {"a": None}}
    ck.load(got, path, strict=False)
    assert got == {"plain": {"a": [1, 2]}}


def test_replicated_array_written_once_and_readable_by_plain_h5py(ckdir):
    n = dist.get_world_size()
    state = {"w": _global((5, 3)), "b": _global(4, np.float32), "step": 9}
    path = ckdir / "rep"
    ck.save(state, path, layout="per-rank")
    if dist.get_rank() == 0:
        import json

        meta = json.loads((path / "hpcdist-checkpoint.json").read_text())
        assert meta["world_size"] == n and meta["layout"] == "per-rank"
        for e in meta["entries"]:
            assert len(e["pieces"]) == 1, e  # one copy of each replicated dataset
        found = {}
        for f in sorted(path.glob("rank-*.h5")):
            with h5py.File(f, "r") as h:
                h.visititems(
                    lambda name, obj, h=h: found.__setitem__(name, obj[()]) if isinstance(obj, h5py.Dataset) else None
                )
        assert np.array_equal(found["w"], state["w"]) and np.array_equal(found["b"], state["b"]) and found["step"] == 9


def test_values_come_from_rank_0_and_replicated_arrays_from_one_rank(ckdir):
    r = dist.get_rank()
    ck.save({"who": f"rank {r}", "arr": np.full(3, float(r))}, ckdir / "from0")
    got = {"who": None, "arr": np.full(3, -1.0)}
    ck.load(got, ckdir / "from0")
    # the replicated array is written by one rank: with equal arrays (the contract) it does not matter which
    assert got["who"] == "rank 0" and got["arr"].tolist() in ([float(q)] * 3 for q in range(dist.get_world_size()))


def test_sharded_reshard_in_one_run(ckdir):
    n, r = dist.get_world_size(), dist.get_rank()
    shape = (7, 5)  # 7 rows over 3 ranks: uneven
    ref = _global(shape)
    s0 = ck.Shard.even(shape, 0, r, n)
    path = ckdir / "sharded"
    ck.save({"x": ck.Sharded(ref[s0.slices()].copy(), s0), "meta": {"n": n}}, path)
    for target in (ck.Shard.even(shape, 1, r, n), ck.Shard.even(shape, 0, n - 1 - r, n), ck.Shard.whole(shape)):
        local = np.full(target.sizes, -1.0)
        got = {"x": ck.Sharded(local, target), "meta": {"n": None}}
        ck.load(got, path)
        assert np.array_equal(local, ref[target.slices()]) and got["meta"]["n"] == n
    whole = np.zeros(shape)
    ck.load({"x": whole, "meta": {"n": 0}}, path, verify=False)
    assert np.array_equal(whole, ref)


def test_mesh_placements_replicas_written_once(ckdir):
    n = dist.get_world_size()
    mshape = (2, n // 2) if n % 2 == 0 else (n, 1)
    mesh = dist.init_device_mesh("cpu", mshape, mesh_dim_names=("dp", "tp"))
    shape = (6, 4)
    ref = _global(shape, np.float32)
    sh = ck.Shard.from_mesh(shape, mesh, [("shard", 0), "replicate"])
    path = ckdir / "mesh"
    ck.save({"w": ck.Sharded(ref[sh.slices()].copy(), sh)}, path)
    if dist.get_rank() == 0:
        import json

        meta = json.loads((path / "hpcdist-checkpoint.json").read_text())
        assert len(meta["entries"][0]["pieces"]) == mshape[0]  # one per distinct box, not one per rank
    sh2 = ck.Shard.from_mesh(shape, mesh, ["replicate", ("shard", 1)])
    local = np.zeros(sh2.sizes, np.float32)
    ck.load({"w": ck.Sharded(local, sh2)}, path)
    assert np.array_equal(local, ref[sh2.slices()])


def test_mesh_over_part_of_the_world_saves_the_members_boxes(ckdir):
    """A mesh over all ranks but the last: the members' boxes make the whole array, the rank outside holds an
    empty box and writes nothing, and every rank loads the whole array back."""
    n = dist.get_world_size()
    if n < 2:
        pytest.skip("needs at least 2 ranks")
    mesh = dist.init_device_mesh("cpu", (n - 1,))
    shape = (6, 4)
    ref = _global(shape, np.float32)
    sh = ck.Shard.from_mesh(shape, mesh, [("shard", 0)])
    assert (sh.sizes == (0, 0)) is (dist.get_rank() == n - 1)
    path = ckdir / "part"
    ck.save({"w": ck.Sharded(ref[sh.slices()].copy(), sh)}, path)
    whole = np.zeros(shape, np.float32)
    ck.load({"w": whole}, path)
    assert np.array_equal(whole, ref)


def test_flipped_byte_names_file_and_key(ckdir):
    r = dist.get_rank()
    state = {"good": _global(64), "model": {"weight": _global((32, 16), np.float32)}}
    path = ckdir / "corrupt"
    ck.save(state, path, layout="per-rank")
    if r == 0:
        import json

        meta = json.loads((path / "hpcdist-checkpoint.json").read_text())
        (piece,) = next(e for e in meta["entries"] if e["name"] == "model/weight")["pieces"]
        fname = path / piece["file"]
        with h5py.File(fname, "r") as h:
            offset = h["model/weight"].id.get_offset()
        with open(fname, "r+b") as fh:
            fh.seek(offset + 100)
            b = fh.read(1)
            fh.seek(offset + 100)
            fh.write(bytes([b[0] ^ 0x10]))
    dist.barrier()
    with pytest.raises(ck.CheckpointError) as err:
        ck.load(_zeros_like(state), path)
    assert "model/weight" in str(err.value) and "rank-" in str(err.value) and "checksum" in str(err.value)
    # without verification the corrupt value comes through: the checksum is what caught it
    got = _zeros_like(state)
    ck.load(got, path, verify=False)
    assert not np.array_equal(got["model"]["weight"], state["model"]["weight"])
    assert np.array_equal(got["good"], state["good"])


def test_wrong_structure_is_named(ckdir):
    path = ckdir / "struct"
    ck.save({"a": np.zeros(3), "b": {"c": np.zeros((2, 2), np.float32)}, "d": 1}, path)
    with pytest.raises(ck.StructureError) as err:
        ck.load({"a": np.zeros(4), "b": {"c": np.zeros((2, 2), np.float64)}, "e": np.zeros(1)}, path)
    msg = str(err.value)
    assert "['e']" in msg and "'d'" in msg and "(3,)" in msg and "(4,)" in msg and "float32" in msg
    untouched = {"a": np.full(3, 7.0)}
    with pytest.raises(ck.StructureError, match="not in the state"):
        ck.load(untouched, path)
    ck.load(untouched, path, strict=False)
    assert np.array_equal(untouched["a"], np.zeros(3))
    with pytest.raises(ck.CheckpointError, match="does not exist"):
        ck.load({"a": np.zeros(3)}, ckdir / "nope")


def test_save_errors_reach_every_rank(ckdir):
    r, n = dist.get_rank(), dist.get_world_size()
    path = ckdir / "err"
    keys = {"a": np.zeros(2)} if r != n - 1 or n == 1 else {"a": np.zeros(2), "extra": np.zeros(1)}
    if n > 1:
        with pytest.raises(ck.CheckpointError, match="extra"):
            ck.save(keys, path)
    assert not path.exists() and ck.latest(ckdir) is None
    ck.save({"a": np.ones(2)}, path)
    with pytest.raises(ck.CheckpointError, match="exists already"):
        ck.save({"a": np.ones(2)}, path)
    ck.save({"a": np.full(2, 5.0)}, path, overwrite=True)
    got = {"a": np.zeros(2)}
    ck.load(got, path)
    assert got["a"].tolist() == [5.0, 5.0]
    with pytest.raises(TypeError, match="cannot checkpoint"):
        ck.save({"f": lambda: 1}, ckdir / "lambda")
    bad = ck.Shard((4,), (0,), (2,))  # every rank holds the first half: the rest is missing
    with pytest.raises(ck.CheckpointError, match="cover"):
        ck.save({"x": ck.Sharded(np.zeros(2), bad)}, ckdir / "gap")
    assert not list(ckdir.glob(".gap.tmp-*")) and not (ckdir / "gap").exists()  # nothing left behind
    with pytest.raises(ValueError, match="does not fit"):
        ck.Shard((4,), (3,), (2,))
    with pytest.raises(ValueError, match="keys must"):
        ck.save({"a/b": 1}, ckdir / "slash")


def test_latest_orders_by_step_and_skips_partial(ckdir):
    for step in (9, 10, 2):
        ck.save({"step": step}, ckdir / f"step_{step}")
    if dist.get_rank() == 0:
        (ckdir / ".step_11.tmp-dead").mkdir()
        (ckdir / "step_12").mkdir()  # no metadata: never committed
    dist.barrier()
    assert ck.latest(ckdir) == (ckdir / "step_10").absolute() or ck.latest(ckdir) == ckdir / "step_10"
    assert ck.latest(ckdir / "missing") is None


def test_async_save_overlaps_computation(ckdir):
    n = dist.get_world_size()
    state = {"w": _global((256, 256), np.float32), "step": 1}
    want = {"w": state["w"].copy(), "step": 1}
    work = ck.async_save(state, ckdir / "a1")
    state["w"] += 1.0  # the host copy was taken: changing the state now is safe
    state["step"] = 2
    acc = np.zeros(1)
    for _ in range(20):  # computation (and MPI) while the background thread writes
        x = np.ones(1)
        dist.all_reduce(x)
        acc += x
    assert acc[0] == 20 * n
    work2 = ck.async_save(state, ckdir / "a2")  # waits for the first (one in flight per group)
    assert work.is_completed() and work.exception() is None
    assert work2.wait() is True and work2.is_completed() and work2.done()
    assert work2.result() == (ckdir / "a2").absolute()
    got = {"w": np.zeros((256, 256), np.float32), "step": 0}
    ck.load(got, ckdir / "a1")
    _assert_same(got, want)
    ck.load(got, ckdir / "a2")
    assert np.array_equal(got["w"], want["w"] + 1.0) and got["step"] == 2
    assert ck.latest(ckdir) == (ckdir / "a2").absolute()


def test_async_save_error_reaches_every_rank(ckdir):
    ck.save({"a": 1}, ckdir / "taken")
    with pytest.raises(ck.CheckpointError, match="exists already"):
        ck.async_save({"a": 2}, ckdir / "taken")


@pytest.mark.skipif(
    not h5py.get_config().mpi, reason="h5py is not built with parallel HDF5 (h5py.get_config().mpi is False)"
)
def test_single_file_layout(ckdir):
    n, r = dist.get_world_size(), dist.get_rank()
    shape = (9, 4)
    ref = _global(shape)
    sh = ck.Shard.even(shape, 0, r, n)
    state = {"x": ck.Sharded(ref[sh.slices()].copy(), sh), "rep": _global(3), "s": "hi"}
    ck.save(state, ckdir / "one", layout="single-file")
    if r == 0:
        assert sorted(p.name for p in (ckdir / "one").iterdir()) == ["data.h5", "hpcdist-checkpoint.json"]
        with h5py.File(ckdir / "one" / "data.h5", "r") as h:
            assert np.array_equal(h["x"][()], ref)
    sh2 = ck.Shard.even(shape, 1, n - 1 - r, n)
    local = np.zeros(sh2.sizes)
    ck.load({"x": ck.Sharded(local, sh2), "rep": np.zeros(3), "s": None}, ckdir / "one")
    assert np.array_equal(local, ref[sh2.slices()])


def test_single_file_layout_refused_without_parallel_h5py(ckdir):
    if h5py.get_config().mpi:
        pytest.skip("h5py has parallel HDF5 here")
    with pytest.raises(ValueError, match="parallel HDF5"):
        ck.save({"a": 1}, ckdir / "x", layout="single-file")


def test_preemption_flag_is_agreed(ckdir):
    r, n = dist.get_rank(), dist.get_world_size()
    with ck.Preemption() as pre:
        assert pre.should_stop() is False
        if r == n - 1:
            os.kill(os.getpid(), signal.SIGUSR1)  # as Slurm's warning signal, on one rank only
            assert pre.requested and pre.received == signal.SIGUSR1
        assert pre.should_stop() is True  # every rank stops at the same step
        env_job = os.environ.pop("SLURM_JOB_ID", None)
        try:
            assert pre.requeue() is False  # outside Slurm: nothing to requeue
            os.environ["SLURM_JOB_ID"] = "424242"
            with pytest.raises(RuntimeError, match="scontrol requeue 424242 failed"):  # on every rank
                pre.requeue(scontrol="false")
        finally:
            os.environ.pop("SLURM_JOB_ID", None)
            if env_job is not None:
                os.environ["SLURM_JOB_ID"] = env_job
    assert signal.getsignal(signal.SIGUSR1) is not pre._handler


@pytest.mark.skipif(torch is None, reason="torch is not installed")
def test_dtensor_save_and_reshard(ckdir):
    import torch.distributed as tdist
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor, init_device_mesh

    r, n = dist.get_rank(), dist.get_world_size()
    if not tdist.is_initialized():
        port = [None]
        if r == 0:
            import socket

            with socket.socket() as s:
                s.bind(("127.0.0.1", 0))
                port[0] = s.getsockname()[1]
        dist.broadcast_object_list(port, src=0)
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port[0]))
        tdist.init_process_group("gloo", rank=r, world_size=n)
    mesh = init_device_mesh("cpu", (n,))
    ref = torch.arange(7 * 6, dtype=torch.float32).reshape(7, 6)
    dt = distribute_tensor(ref, mesh, [Shard(0)])
    assert ck.Shard.from_dtensor(dt) == ck.Shard.even((7, 6), 0, r, n)  # torch's chunking = ours
    ck.save({"w": dt, "bf": distribute_tensor(ref.to(torch.bfloat16), mesh, [Replicate()])}, ckdir / "dt")
    target = distribute_tensor(torch.zeros(7, 6), mesh, [Shard(1)])
    bf = torch.zeros(7, 6, dtype=torch.bfloat16)
    ck.load({"w": target, "bf": bf}, ckdir / "dt")
    assert torch.equal(target.full_tensor(), ref)
    assert torch.equal(bf, ref.to(torch.bfloat16))


def test_lists_are_values(ckdir):
    """Lists and tuples are values (pickled); NumPy arrays inside them load with the restricted unpickler."""
    path = ckdir / "list"
    ck.save({"l": [np.arange(3), (1, "x")]}, path)
    got = {"l": None}
    ck.load(got, path)
    assert np.array_equal(got["l"][0], np.arange(3)) and got["l"][1] == (1, "x")


def test_many_checksum_blocks_reshard(ckdir, monkeypatch):
    """Pieces of many small checksum blocks, read a few blocks at a time, under every slicing."""
    from hpcdist.checkpoint import layout, read

    monkeypatch.setattr(layout, "BLOCK_BYTES", 3 * 5 * 8)  # 3 rows of 5 float64 per block
    monkeypatch.setattr(read, "_CHUNK_BLOCKS", 2)
    n, r = dist.get_world_size(), dist.get_rank()
    shape = (37, 5)
    ref = _global(shape)
    sh = ck.Shard.even(shape, 0, r, n)
    ck.save({"x": ck.Sharded(ref[sh.slices()].copy(), sh)}, ckdir / "blocks")
    wants = [
        ck.Shard.even(shape, 0, (r + 1) % n, n),
        ck.Shard.even(shape, 1, r, n),
        ck.Shard((37, 5), (r % 7 + 1, 1), (20, 3)),
        ck.Shard.whole(shape),
    ]
    for want in wants:
        for verify in (True, False):
            local = np.full(want.sizes, -1.0)
            ck.load({"x": ck.Sharded(local, want)}, ckdir / "blocks", verify=verify)
            assert np.array_equal(local, ref[want.slices()]), (want, verify)
