"""hpcdist.checkpoint under mpiexec: damaged checkpoints, overwrite, crash recovery, paths, async failures.

Each test damages or arranges the files on disk directly (json, h5py, os) as a
bit flip, an edit or a killed process would, and checks the outcome against
NumPy references and listings of the directory: never against the checkpoint
code's own view.
"""

from __future__ import annotations

import enum
import errno
import json
import os
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from test_checkpoint import ckdir  # noqa: F401  (the shared-directory fixture)

import hpcdist as dist

h5py = pytest.importorskip("h5py")
ck = pytest.importorskip("hpcdist.checkpoint")

META = "hpcdist-checkpoint.json"


def _need_ranks(k: int) -> None:
    if dist.get_world_size() < k:
        pytest.skip(f"needs at least {k} ranks")


def _edit_meta(path: Path, edit) -> None:
    """Rank 0 rewrites the metadata with ``edit(meta)``; every rank waits for it."""
    if dist.get_rank() == 0:
        meta = json.loads((path / META).read_text())
        edit(meta)
        (path / META).write_text(json.dumps(meta))
    dist.barrier()


def _entry(meta: dict, name: str) -> dict:
    return next(e for e in meta["entries"] if e["name"] == name)


def _save_rows(path: Path, ref: np.ndarray, **kw) -> None:
    n, r = dist.get_world_size(), dist.get_rank()
    sh = ck.Shard.even(ref.shape, 0, r, n)
    ck.save({"w": ck.Sharded(ref[sh.slices()].copy(), sh), "z": "value"}, path, layout="per-rank", **kw)


def _hidden(d: Path) -> list[str]:
    return sorted(p.name for p in d.iterdir() if p.name.startswith("."))


# ------------------------------------------------------------------ D1: metadata that lies about the pieces


def test_offsets_edited_to_overlap_and_leave_a_gap_is_refused(ckdir):  # noqa: F811
    _need_ranks(2)
    ref = np.arange(32, dtype=np.float64).reshape(8, 4)
    path = ckdir / "shifted"
    _save_rows(path, ref)

    def shift(meta):  # one digit: the second piece starts one row early (overlap), its last row is in no piece
        _entry(meta, "w")["pieces"][1]["offsets"][0] -= 1

    _edit_meta(path, shift)
    out = np.full((8, 4), -1.0)
    for verify in (True, False):
        with pytest.raises(ck.CheckpointError, match=r"damaged.*do not tile.*overlap"):
            ck.load({"w": out, "z": None}, path, verify=verify)
    assert (out == -1.0).all()  # refused before anything was read


def test_pieces_pointing_at_each_others_datasets_are_refused(ckdir):  # noqa: F811
    _need_ranks(2)
    ref = np.arange(32, dtype=np.float64).reshape(8, 4)
    path = ckdir / "swapped"
    _save_rows(path, ref)

    def swap_files(meta):  # the boxes still tile; each names the other's file (same sizes at 2 and 4 ranks)
        pieces = _entry(meta, "w")["pieces"]
        pieces[0]["file"], pieces[1]["file"] = pieces[1]["file"], pieces[0]["file"]

    _edit_meta(path, swap_files)
    with pytest.raises(ck.CheckpointError, match="hpcdist_offsets"):
        ck.load({"w": np.zeros((8, 4)), "z": None}, path, verify=False)


def test_value_checksum_list_emptied_is_refused(ckdir):  # noqa: F811
    path = ckdir / "nocrc"
    _save_rows(path, np.arange(8.0).reshape(4, 2))
    if dist.get_rank() == 0:
        with h5py.File(path / _pieces_of(path, "z")[0]["file"], "r+") as f:  # a corrupt value as well
            raw = f["z"][()]
            raw[0] ^= 1
            f["z"][...] = raw

    def drop(meta):
        _entry(meta, "z")["pieces"][0]["crc32"] = []

    _edit_meta(path, drop)
    with pytest.raises(ck.ChecksumError, match=r"'z'.*0 checksums"):
        ck.load({"w": np.zeros((4, 2)), "z": None}, path)


def _pieces_of(path: Path, name: str) -> list[dict]:
    return _entry(json.loads((path / META).read_text()), name)["pieces"]


# ------------------------------------------------------------------ D8: damaged checkpoints name key, file, rank


@pytest.mark.parametrize(
    ("damage", "pattern"),
    [
        ("rm_file", r"key 'w', file 'rank-0000\d\.h5'.*FileNotFoundError"),
        ("rename_dataset", r"key 'w', file 'rank-0000\d\.h5'.*KeyError"),
        ("truncate_file", r"key 'w', file 'rank-0000\d\.h5'.*OSError"),
        ("short_crcs", r"hpcdist-checkpoint\.json' is damaged: entries\[\d\]\.pieces\[0\]\.crc32"),
        ("block_rows_0", r"hpcdist-checkpoint\.json' is damaged: entries\[\d\]\.pieces\[0\]\.block_rows"),
        ("no_entries", r"hpcdist-checkpoint\.json' is damaged: entries must be a list"),
        ("bad_at", r"hpcdist-checkpoint\.json' is damaged: entries\[\d\]\.pieces\[0\]\.at"),
        ("truncated_json", r"hpcdist-checkpoint\.json' is damaged: not valid JSON"),
    ],
)
def test_damaged_checkpoint_errors_name_what_is_wrong(ckdir, damage, pattern):  # noqa: F811
    path = ckdir / damage
    ref = np.arange(2 << 10, dtype=np.float64).reshape(-1, 4)
    _save_rows(path, ref)
    if dist.get_rank() == 0:
        piece = _pieces_of(path, "w")[0]
        data = path / piece["file"]
        meta = json.loads((path / META).read_text())
        w = _entry(meta, "w")
        if damage == "rm_file":
            data.unlink()
        elif damage == "rename_dataset":
            with h5py.File(data, "r+") as f:
                f.move("w", "w_renamed")
        elif damage == "truncate_file":
            os.truncate(data, 2000)
        elif damage == "short_crcs":
            w["pieces"][0]["crc32"] = w["pieces"][0]["crc32"][:-1]
        elif damage == "block_rows_0":
            w["pieces"][0]["block_rows"] = 0
        elif damage == "no_entries":
            del meta["entries"]
        elif damage == "bad_at":
            w["pieces"][0]["at"] = "0"
        if damage in ("short_crcs", "block_rows_0", "no_entries", "bad_at"):
            (path / META).write_text(json.dumps(meta))
        if damage == "truncated_json":
            text = (path / META).read_text()
            (path / META).write_text(text[: len(text) // 2])
    dist.barrier()
    with pytest.raises(ck.CheckpointError, match=pattern) as err:
        ck.load({"w": np.zeros(ref.shape), "z": None}, path)
    if damage in ("rm_file", "rename_dataset", "truncate_file"):
        assert "group rank" in str(err.value)  # the rank that read it (named on every rank)


def test_read_only_target_is_refused_before_anything_is_read(ckdir):  # noqa: F811
    path = ckdir / "ro"
    ck.save({"a": np.ones(3), "b": np.ones(3)}, path)
    a, b = np.zeros(3), np.zeros(3)
    b.flags.writeable = False
    with pytest.raises(ck.StructureError, match=r"'b'.*read-only"):
        ck.load({"a": a, "b": b}, path)
    assert (a == 0).all()  # 'a' comes first: it was not filled either


# ------------------------------------------------------------------ D2: what overwrite=True may replace


def test_overwrite_replaces_only_a_checkpoint_or_an_empty_directory(ckdir):  # noqa: F811
    results, parent, afile, empty = ckdir / "results", ckdir / "runs", ckdir / "afile", ckdir / "empty"
    if dist.get_rank() == 0:
        results.mkdir()
        (results / "notes.txt").write_text("keep me")
        afile.write_text("keep me too")
        empty.mkdir()
    dist.barrier()
    ck.save({"s": 1}, parent / "step_1")
    for target, what in ((results, "notes.txt"), (parent, "step_1"), (afile, "a file")):
        with pytest.raises(ck.CheckpointError, match=f"not .*checkpoint.*{what}|{what}, not a checkpoint"):
            ck.save({"s": 2}, target, overwrite=True)
    assert (results / "notes.txt").read_text() == "keep me" and afile.read_text() == "keep me too"
    assert (parent / "step_1" / META).is_file()
    assert _hidden(ckdir) == [] and _hidden(parent) == []  # no .old-/.tmp- left behind
    ck.save({"s": 3}, empty, overwrite=True)
    ck.save({"s": 4}, parent / "step_1", overwrite=True)
    got = {"s": None}
    ck.load(got, parent / "step_1")
    assert got["s"] == 4 and ck.load({"s": None}, empty)["s"] == 3
    assert _hidden(ckdir) == [] and _hidden(parent) == []


def test_overwrite_without_atomic_exchange_still_replaces(ckdir, monkeypatch):  # noqa: F811
    from hpcdist.checkpoint import swap

    monkeypatch.setattr(swap, "exchange", lambda a, b: False)  # as on a file system without RENAME_EXCHANGE
    ck.save({"s": 1}, ckdir / "last")
    ck.save({"s": 2}, ckdir / "last", overwrite=True)
    assert ck.load({"s": None}, ckdir / "last")["s"] == 2 and _hidden(ckdir) == []


# ------------------------------------------------------------------ D3: a crash between the renames of an overwrite


def _crash_between_renames(d: Path) -> None:
    """The directory as a commit killed after its first rename leaves it: old copy hidden, new copy complete."""
    ck.save({"s": 1}, d / "last")
    ck.save({"s": 2}, d / "new")
    if dist.get_rank() == 0:
        os.rename(d / "last", d / ".last.old-0123456789ab")
        os.rename(d / "new", d / ".last.tmp-ba9876543210")
    dist.barrier()


def test_crash_during_overwrite_keeps_the_previous_checkpoint_loadable(ckdir):  # noqa: F811
    _crash_between_renames(ckdir)
    found = ck.latest(ckdir)
    assert found is not None and found.name == ".last.old-0123456789ab"
    assert ck.load({"s": None}, found)["s"] == 1
    assert ck.load({"s": None}, ckdir / "last")["s"] == 1  # put back under its name
    assert (ckdir / "last" / META).is_file() and ck.latest(ckdir) == ckdir / "last"


def test_save_after_a_crash_during_overwrite_restores_then_cleans(ckdir):  # noqa: F811
    _crash_between_renames(ckdir)
    with pytest.raises(ck.CheckpointError, match="exists already"):  # the old copy is back under its name
        ck.save({"s": 3}, ckdir / "last")
    assert ck.load({"s": None}, ckdir / "last")["s"] == 1
    ck.save({"s": 3}, ckdir / "last", overwrite=True)
    assert ck.load({"s": None}, ckdir / "last")["s"] == 3
    assert sorted(p.name for p in ckdir.iterdir()) == ["last"]


# ------------------------------------------------------------------ D4: ranks that pass different paths


def test_ranks_passing_different_paths_are_refused(ckdir):  # noqa: F811
    _need_ranks(2)
    r = dist.get_rank()
    mine = ckdir / f"step_{10 + min(r, 1)}"
    with pytest.raises(ck.CheckpointError, match=r"different paths.*rank\(s\) 1.*step_11.*rank 0.*step_10"):
        ck.save({"a": np.ones(2)}, mine)
    assert not (ckdir / "step_10").exists() and not (ckdir / "step_11").exists() and _hidden(ckdir) == []
    for name, v in (("A", 1.0), ("B", 2.0)):
        ck.save({"a": np.full(2, v)}, ckdir / name)
    got = np.zeros(2)
    with pytest.raises(ck.CheckpointError, match=r"different paths.*'.*B'.*'.*A'"):
        ck.load({"a": got}, ckdir / ("A" if r == 0 else "B"))
    assert (got == 0).all()


# ------------------------------------------------------------------ D5, D6: a failed async save


def _fail_writes_on(monkeypatch, rank: int) -> None:
    """This rank's background write fills part of its file, then hits a full disk."""
    from hpcdist.checkpoint import write

    real = write._write_files

    def full_disk(plan, by_name, r, comm, crcs):
        if r == rank:
            (Path(plan.tmp) / write.rank_file(r)).write_bytes(b"\0" * 4096)
            raise OSError(errno.ENOSPC, "No space left on device (simulated)")
        return real(plan, by_name, r, comm, crcs)

    monkeypatch.setattr(write, "_write_files", full_disk)


def test_failed_async_save_leaves_nothing_and_names_the_rank_and_file(ckdir, monkeypatch):  # noqa: F811
    bad = dist.get_world_size() - 1
    _fail_writes_on(monkeypatch, bad)
    work = ck.async_save({"w": np.ones(64)}, ckdir / "step_1")
    with pytest.raises(ck.CheckpointError, match=rf"group rank {bad}: writing '.*rank-{bad:05d}\.h5'.*No space"):
        work.wait()
    dist.barrier()
    assert sorted(p.name for p in ckdir.iterdir()) == []  # no temporary directory, no marker, no data
    monkeypatch.undo()
    ck.save({"w": np.full(4, 2.0)}, ckdir / "step_2")  # the error was handled: it is not raised again
    assert ck.load({"w": np.zeros(4)}, ckdir / "step_2")["w"].tolist() == [2.0] * 4


def test_peers_never_read_a_half_written_failure_marker(ckdir, monkeypatch):  # noqa: F811
    """Rank 0's FAILED marker appears whole: a peer polling for it never reads it empty (a CI failure).

    The marker's write is slowed down on rank 0 (the file is created, stays
    empty for 0.5 s, then gets its content), the window a loaded machine opens
    by chance: every rank must still get the failing rank's error.
    """
    import time

    from hpcdist.checkpoint import layout

    bad = dist.get_world_size() - 1
    _fail_writes_on(monkeypatch, bad)
    real = layout.write_json

    def slow_write_json(path, obj):
        with open(path, "w") as fh:
            fh.flush()
            time.sleep(0.5)  # created and empty: what a peer polling for the marker may see
        real(path, obj)

    if dist.get_rank() == 0:
        monkeypatch.setattr(layout, "write_json", slow_write_json)
    work = ck.async_save({"w": np.ones(8)}, ckdir / "step_1")
    try:
        work.wait()
        said = "no error"
    except ck.CheckpointError as exc:
        said = str(exc)
    seen: list = [None] * dist.get_world_size()
    dist.all_gather_object(seen, said)  # every rank asserts on every rank's outcome: all pass or all fail
    for rank_said in seen:
        assert re.search(rf"group rank {bad}: writing '.*rank-{bad:05d}\.h5'.*No space", rank_said), seen
    dist.barrier()
    assert sorted(p.name for p in ckdir.iterdir()) == []


def test_unseen_async_error_surfaces_at_the_next_save_once(ckdir, monkeypatch):  # noqa: F811
    _fail_writes_on(monkeypatch, 0)
    work = ck.async_save({"w": np.ones(4)}, ckdir / "step_1")
    with pytest.raises(ck.CheckpointError, match="No space"):
        ck.save({"w": np.ones(4)}, ckdir / "step_2")  # nobody waited: the next save reports it
    assert not (ckdir / "step_2").exists()
    with pytest.raises(ck.CheckpointError, match="No space"):
        work.wait()  # the handle still tells its own outcome
    monkeypatch.undo()
    ck.save({"w": np.ones(4)}, ckdir / "step_2")
    assert (ckdir / "step_2" / META).is_file()


def test_async_save_on_a_full_tmpfs_cleans_up(ckdir):  # noqa: F811
    """A real full disk: a 1 MiB tmpfs (root only; skipped with the reason where mounting is refused)."""
    import subprocess

    mnt = ckdir / "tmpfs"
    ok = [False]
    if dist.get_rank() == 0:
        mnt.mkdir()
        try:
            proc = subprocess.run(
                ["mount", "-t", "tmpfs", "-o", "size=1M", "tmpfs", str(mnt)], capture_output=True, timeout=30
            )
            ok[0] = proc.returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok[0] = False
    dist.broadcast_object_list(ok, src=0)
    if not ok[0]:
        pytest.skip("cannot mount a tmpfs here (needs root and tmpfs support)")
    try:
        n, r = dist.get_world_size(), dist.get_rank()
        sh = ck.Shard.even((n, 300_000 // n), 0, r, n)  # 2.4 MB in all: does not fit in 1 MiB
        try:
            ck.async_save({"w": ck.Sharded(np.ones(sh.sizes), sh)}, mnt / "step_1").wait()
            said = "no error"
        except ck.CheckpointError as exc:
            said = str(exc)
        dist.barrier()
        seen: list = [None] * n  # every rank asserts on every rank's outcome: all pass or all fail, in step
        dist.all_gather_object(seen, (said, sorted(p.name for p in mnt.iterdir())))
        for rank_said, left in seen:
            assert re.search(r"group rank \d.*rank-\d{5}\.h5", rank_said), seen
            assert left == [], seen
        ck.save({"w": np.ones(1000)}, mnt / "step_2")  # 8 kB fit once the failed save's data is gone
        assert (mnt / "step_2" / META).is_file()
    finally:
        dist.barrier()
        if dist.get_rank() == 0:
            shutil.rmtree(mnt / "step_2", ignore_errors=True)
            subprocess.run(["umount", str(mnt)], capture_output=True, timeout=30)


# ------------------------------------------------------------------ D7, D9: values come back exactly


class Color(enum.IntEnum):
    RED = 1


def test_values_keep_their_exact_type_and_text(ckdir):  # noqa: F811
    want = {
        "nul": "ab\0",
        "nuls": "\0\0",
        "f64": np.float64(0.1),
        "c128": np.complex128(1 - 2j),
        "f32": np.float32(2.5),
        "color": Color.RED,
    }
    path = ckdir / "vals"
    ck.save(want, path)
    got = ck.load(dict.fromkeys(want), path, trusted=True)
    for k, v in want.items():
        assert type(got[k]) is type(v) and got[k] == v, k
    if dist.get_rank() == 0:
        files = sorted(path.glob("rank-*.h5"))
        with h5py.File(files[0], "r") as f:
            assert bytes(f["nul"][()]) == b"ab\0"  # plain h5py reads the exact UTF-8 bytes


def test_non_member_group_is_one_readable_error():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "does nothing and returns None" warning before the error
        with pytest.raises(ValueError, match=r"NON_GROUP_MEMBER.*not a member") as err:
            ck.save({"a": 1}, "/nonexistent/x", group=dist.GroupMember.NON_GROUP_MEMBER)
    assert "object at 0x" not in str(err.value)
