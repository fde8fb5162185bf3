"""hpcdist.checkpoint's pure parts, without MPI: Shard boxes against torch's DTensor arithmetic,
the save plan (checks, tiling, who writes what), value encodings, key flattening, checksums."""

from __future__ import annotations

import enum
import itertools
import pickle
import zlib
from fractions import Fraction

import numpy as np
import pytest

from hpcdist.checkpoint import Shard, Sharded, layout, schema, swap, values
from hpcdist.checkpoint.errors import CheckpointError
from hpcdist.checkpoint.plan import Entry, make_plans, tiling_problem


class FakeMesh:
    """What Shard.from_mesh reads of a DeviceMesh: this rank's coordinate and the mesh shape."""

    def __init__(self, shape, coord):
        self.shape = tuple(shape)
        self._coord = list(coord)

    def get_coordinate(self):
        return list(self._coord)


def test_from_mesh_matches_torch_dtensor_layout():
    torch_utils = pytest.importorskip("torch.distributed.tensor._utils")
    from torch.distributed.tensor import Replicate
    from torch.distributed.tensor import Shard as TShard

    kinds = [TShard(0), TShard(1), Replicate()]
    checked = 0
    for mesh_shape in [(4,), (3,), (2, 2), (3, 2), (2, 3)]:
        for placements in itertools.product(kinds, repeat=len(mesh_shape)):
            for gshape in [(7, 5), (4, 9), (1, 3), (2, 0)]:
                for coord in itertools.product(*(range(m) for m in mesh_shape)):
                    size, off = torch_utils._compute_local_shape_and_global_offset(
                        gshape, mesh_shape, list(coord), placements
                    )
                    mine = Shard.from_mesh(gshape, FakeMesh(mesh_shape, coord), placements)
                    assert mine.sizes == tuple(size), (mesh_shape, placements, gshape, coord)
                    if all(size):
                        assert mine.offsets == tuple(off), (mesh_shape, placements, gshape, coord)
                    checked += 1
    assert checked > 500


def test_shard_checks_and_helpers():
    s = Shard.even((10, 3), 0, 3, 4)  # torch.chunk: 3, 3, 3, 1
    assert s.offsets == (9, 0) and s.sizes == (1, 3) and s.slices() == (slice(9, 10), slice(0, 3))
    assert Shard.whole((2, 3)).is_whole and not s.is_whole
    assert Shard.from_mesh((6,), FakeMesh((2, 2), (1, 0)), [("shard", 0), "replicate"]).offsets == (3,)
    with pytest.raises(ValueError, match="does not fit"):
        Shard((4,), (3,), (2,))
    with pytest.raises(ValueError, match="one entry per dimension"):
        Shard((4, 4), (0,), (4,))
    with pytest.raises(ValueError, match="one entry per mesh dimension"):
        Shard.from_mesh((4,), FakeMesh((2,), (0,)), ["replicate", "replicate"])
    with pytest.raises(ValueError, match="placement"):
        Shard.from_mesh((4,), FakeMesh((2,), (0,)), ["bogus"])
    with pytest.raises(ValueError, match="shape"):
        Sharded(np.zeros(3), Shard((4,), (0,), (2,)))


def _e(name, kind="array", shape=(4,), offsets=None, sizes=None, dtype="float64"):
    offsets = offsets if offsets is not None else (0,) * len(shape)
    sizes = sizes if sizes is not None else shape
    return Entry(name, (name,), kind, dtype, np.dtype(dtype).str, shape, offsets, sizes)


def test_plan_assigns_one_writer_per_distinct_box_and_spreads_replicated_arrays():
    # 4 ranks; "w" sharded over 2 boxes (ranks 0,1 hold the first half, 2,3 the second)
    rows = [(0, 2), (0, 2), (2, 2), (2, 2)]
    summaries = [
        [
            _e("big", shape=(1000,)),
            _e("mid", shape=(600,)),
            _e("small", shape=(10,)),
            _e("w", "sharded", (4,), (o,), (s,)),
        ]
        for o, s in rows
    ]
    plans = make_plans(summaries, "/tmp/x", "tok", "per-rank")
    writers = {name: [r for r, p in enumerate(plans) if name in p.writes] for name in ("big", "mid", "small", "w")}
    assert writers["w"] == [0, 2]  # the lowest rank of each distinct box
    assert len(writers["big"]) == len(writers["mid"]) == len(writers["small"]) == 1
    assert len({writers["big"][0], writers["mid"][0]}) == 2  # the large ones land on different ranks


def test_plan_names_mismatches_and_gaps():
    with pytest.raises(CheckpointError, match=r"keys missing on rank 1: \['b'\]"):
        make_plans([[_e("a"), _e("b")], [_e("a")]], "/t", "x", "per-rank")
    with pytest.raises(CheckpointError, match=r"'a' is .* on rank 1"):
        make_plans([[_e("a", shape=(4,))], [_e("a", shape=(5,))]], "/t", "x", "per-rank")
    gap = [[_e("w", "sharded", (4,), (0,), (2,))], [_e("w", "sharded", (4,), (0,), (2,))]]
    with pytest.raises(CheckpointError, match="cover the whole array"):
        make_plans(gap, "/t", "x", "per-rank")
    overlap = [[_e("w", "sharded", (4,), (0,), (3,))], [_e("w", "sharded", (4,), (1,), (3,))]]
    with pytest.raises(CheckpointError, match="overlap"):
        make_plans(overlap, "/t", "x", "per-rank")


@pytest.mark.parametrize(
    "value",
    [None, True, -(2**63), 2**63, 1.25, 1j, "", "ünï\0x", b"\x00ab", np.int8(-3), [1, (2, 3)], Fraction(1, 3)],
)
def test_values_round_trip(value):
    enc, arr = values.encode(value)
    back = values.decode(enc, arr, trusted=False)
    assert back == value and type(back) is type(value)


def test_restricted_unpickling_refuses_code_objects():
    raw = np.frombuffer(pickle.dumps(pytest.raises), dtype=np.uint8)
    with pytest.raises(pickle.UnpicklingError, match="trusted=True"):
        values.decode("pickle", raw, trusted=False)
    assert values.decode("pickle", raw, trusted=True) is pytest.raises


def test_flatten_keys():
    leaves = layout.flatten({"b": {1: np.zeros(2), "x": 3}, "a": "s"})
    assert [(leaf.name, leaf.kind) for leaf in leaves] == [("a", "object"), ("b/1", "array"), ("b/x", "object")]
    for bad, err in [({"a/b": 1}, ValueError), ({"": 1}, ValueError), ({(1, 2): 1}, TypeError), ({True: 1}, TypeError)]:
        with pytest.raises(err, match="key"):
            layout.flatten(bad)
    with pytest.raises(ValueError, match="same name"):
        layout.flatten({1: 1, "1": 2})
    with pytest.raises(TypeError, match="must be a dict"):
        layout.flatten([1])


def test_checksums_are_zlib_crc32_per_block():
    a = np.arange(1000, dtype=np.float64).reshape(100, 10)
    rows = 7
    want = [zlib.crc32(a[i : i + rows].tobytes()) for i in range(0, 100, rows)]
    assert layout.checksums(a, rows) == want
    assert layout.block_rows((100, 10), 8) == layout.BLOCK_BYTES // 80
    assert layout.checksums(np.array(2.5), 1) == [zlib.crc32(np.array(2.5).tobytes())]


def test_latest_natural_order(tmp_path):
    for name in ("step_9", "step_10", "step_100a", ".step_200.tmp-x", "step_300"):
        (tmp_path / name).mkdir()
    for name in ("step_9", "step_10", ".step_200.tmp-x"):
        (tmp_path / name / layout.META_NAME).write_text("{}")
    assert layout.latest(tmp_path) == tmp_path / "step_10"
    assert layout.latest(tmp_path / "none") is None


def test_imports_are_lazy():
    """``import hpcdist`` does not import the checkpoint package, and neither imports h5py."""
    import subprocess
    import sys

    code = (
        "import sys, hpcdist\n"
        "assert 'hpcdist.checkpoint' not in sys.modules and 'h5py' not in sys.modules\n"
        "import hpcdist.checkpoint\n"
        "assert 'h5py' not in sys.modules\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr


# ------------------------------------------------------------------ defects found by the audit


class _Level(enum.IntEnum):
    LOW = 1


class _Mode(str, enum.Enum):
    FAST = "fast"


@pytest.mark.parametrize(
    "value", ["ab\0", "\0\0", "x\0y", np.float64(0.1), np.complex128(1 - 2j), np.bool_(True), np.str_("s")]
)
def test_values_keep_exact_type_and_trailing_nuls(value):
    enc, arr = values.encode(value)
    back = values.decode(enc, arr, trusted=False)
    assert type(back) is type(value) and back == value


@pytest.mark.parametrize("value", [_Level.LOW, _Mode.FAST])
def test_value_subclasses_are_pickled_not_narrowed(value):
    enc, arr = values.encode(value)
    assert enc == "pickle"
    back = values.decode(enc, arr, trusted=True)
    assert type(back) is type(value) and back is value
    with pytest.raises(pickle.UnpicklingError, match="trusted=True"):  # a user class: restricted says what to do
        values.decode(enc, arr, trusted=False)


def test_strings_of_the_old_fixed_length_format_still_load():
    assert values.decode("str", np.array("grüße".encode(), dtype="S7"), trusted=False) == "grüße"
    assert values.decode("str", np.array(b"", dtype="S1"), trusted=False) == ""


def _meta_piece(off, size, rows=4, crcs=None):
    n = -(-size[0] // rows) if size else 1
    return {"file": "rank-00000.h5", "dataset": "w", "offsets": list(off), "sizes": list(size), "at": [0] * len(off),
            "block_rows": rows, "crc32": [0] * n if crcs is None else crcs}  # fmt: skip


def _meta(*pieces, shape=(8, 4)):
    entry = {"key": ["w"], "name": "w", "kind": "sharded", "dtype": "float64", "stored_dtype": "<f8"}
    return {"entries": [{**entry, "shape": list(shape), "pieces": list(pieces)}]}


def test_metadata_whose_pieces_do_not_tile_is_damaged():
    ok = _meta(_meta_piece((0, 0), (4, 4)), _meta_piece((4, 0), (4, 4)))
    assert schema.validate(ok, "m.json") is ok
    shifted = _meta(_meta_piece((0, 0), (4, 4)), _meta_piece((3, 0), (4, 4)))  # overlap + a gap of equal volume
    with pytest.raises(CheckpointError, match=r"'m\.json' is damaged: entries\[0\]\.pieces do not tile.*overlap"):
        schema.validate(shifted, "m.json")
    gap = _meta(_meta_piece((0, 0), (4, 4)))
    with pytest.raises(CheckpointError, match="in no box"):
        schema.validate(gap, "m.json")
    outside = _meta(_meta_piece((0, 0), (4, 4)), _meta_piece((5, 0), (4, 4)))
    with pytest.raises(CheckpointError, match=r"pieces\[1\]\.offsets/sizes must be a box inside"):
        schema.validate(outside, "m.json")


@pytest.mark.parametrize(
    ("field", "value", "pattern"),
    [
        ("crc32", [], r"crc32 must be a list of 1 ints"),
        ("block_rows", 0, r"block_rows must be an int >= 1"),
        ("at", "0", r"\.at must be a list"),
        ("file", "../x.h5", r"\.file must be a file name"),
    ],
)
def test_metadata_fields_are_checked(field, value, pattern):
    piece = _meta_piece((0, 0), (8, 4), rows=8)
    piece[field] = value
    with pytest.raises(CheckpointError, match=pattern):
        schema.validate(_meta(piece), "m.json")
    with pytest.raises(CheckpointError, match="entries must be a list"):
        schema.validate({}, "m.json")


def test_tiling_check_is_exact_beyond_hundreds_of_boxes():
    boxes = [((i,), (1,)) for i in range(2000)]
    assert tiling_problem((2000,), boxes) is None
    boxes[1500] = ((1499,), (1,))  # overlap plus a gap: the volume alone would pass
    assert "overlap" in tiling_problem((2000,), boxes)


def test_tiling_check_of_a_2d_grid_against_a_cell_count():
    """Boxes of a 2-D grid (a DeviceMesh (2, 3) sharding) touch along both dimensions: a tiling, not an overlap. The
    reference: each element counted once per box that holds it (NumPy)."""
    shape = (4, 9)
    grid = [((r, c), (2, 3)) for r in (0, 2) for c in (0, 3, 6)]
    moved = [((1, 0), (2, 3)), *grid[1:]]  # shifted a row down: overlaps its lower neighbour, leaves row 0 bare
    shrunk = [*grid[:-1], ((2, 6), (2, 2))]  # one box a column short: a gap
    for boxes, want in ((grid, None), (moved, "overlap"), (shrunk, "no box")):
        count = np.zeros(shape, int)
        for (r, c), (h, w) in boxes:
            count[r : r + h, c : c + w] += 1
        assert (want is None) == bool((count == 1).all())
        got = tiling_problem(shape, boxes)
        assert (got is None) if want is None else (want in got), (boxes, got)


def test_exchange_swaps_two_directories(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    (a / "x").write_text("a")
    (b / "x").write_text("b")
    if not swap.exchange(a, b):
        pytest.skip("renameat2(RENAME_EXCHANGE) is not supported here: the commit falls back to two renames")
    assert (a / "x").read_text() == "b" and (b / "x").read_text() == "a"


def test_shard_refuses_non_integral_and_accepts_negative_dims():
    with pytest.raises(TypeError, match=r"global_shape must be a sequence of ints.*not truncated"):
        Shard((10.7,), (0.9,), (10.2,))
    with pytest.raises(ValueError, match="parts must be a positive int"):
        Shard.even((4,), 0, 0, 0)
    assert Shard.even((10, 3), -1, 1, 2) == Shard.even((10, 3), 1, 1, 2)
    assert Shard((np.int64(4),), (0,), (4.0,)).sizes == (4,)  # integral values of any number type are fine


def test_rank0_waiting_for_result_files_stats_each_about_once(tmp_path):
    """async_save's group rank 0 polls for one result file per rank. ``all(p.exists() ...)`` ran stat again, at
    every poll, on each file that had already arrived (up to one stat per rank per poll, 0.2 s apart, on a parallel file
    system's metadata server); ``_all_exist`` stats the missing ones only, stopping at the first."""
    from hpcdist.checkpoint.asyncsave import _all_exist

    stats = []

    class Counted(type(tmp_path)):  # a Path whose exists() is counted
        def exists(self, *args, **kwargs):  # type: ignore[override]
            stats.append(self.name)
            return super().exists(*args, **kwargs)

    paths = [Counted(tmp_path / f"r{i}") for i in range(100)]
    ready = _all_exist(paths)
    polls = 0
    for arrived in range(0, 101, 10):  # ten ranks more arrive between polls, in rank order
        for p in paths[:arrived]:
            p.touch()
        polls += 1
        assert ready() == (arrived == 100)
    assert len(stats) <= len(paths) + polls  # each file once when it arrived, plus one missing one per poll
    assert ready() and len(stats) <= len(paths) + polls  # and nothing once all arrived


def test_peers_polling_for_the_commit_back_off_further_in_large_groups():
    """4096 ranks polling for rank 0's commit every 0.2 s would be 20,000 metadata requests a second: the cap of
    the back-off grows with the number of ranks polling (0.2 s per 256)."""
    from hpcdist.checkpoint.asyncsave import _delays

    def first(peers: int, n: int = 16) -> list[float]:
        return list(itertools.islice(_delays(peers), n))

    assert first(1)[:3] == [0.002, 0.004, 0.008] and max(first(1)) == 0.2 == first(1)[-1]
    assert max(first(256)) == 0.2 and max(first(1024)) == 0.8 and max(first(4096)) == 3.2
    assert first(4096)[:7] == first(1)[:7]  # the first polls as quick: a small save is not slowed
