"""Decisions of the shared-memory engine and the bench that need no MPI: table windows, knobs, plans, sizes."""

from __future__ import annotations

import importlib.util

import pytest

from hpcdist import bucket_indices, config
from hpcdist.backends.shm import table
from hpcdist.bench import human_size, parse_sizes


def test_window_modes_and_rank_rows(monkeypatch):
    monkeypatch.setitem(table.TABLE, "all_reduce", {2: (100, 1000), 4: (200, table.INF)})
    assert table.window("all_reduce", 2) == (100, 1000)
    assert table.window("all_reduce", 3) == (200, table.INF)  # the next larger listed size
    assert table.window("all_reduce", 64) == (200, table.INF)  # beyond the table: the largest
    assert table.window("all_reduce", 2, "on") == table.ALWAYS
    assert table.window("all_reduce", 2, "off") == table.NEVER
    assert table.window("all_reduce", 1, "auto") == table.NEVER
    assert table.window("all_to_all", 2) == table.NEVER  # not a shared-memory op


def test_an_oversubscribed_node_takes_shared_memory_at_every_size_unless_turned_off(monkeypatch):
    monkeypatch.setitem(table.TABLE, "barrier", {2: table.NEVER})
    for op in ("all_reduce", "barrier", "all_to_all_single"):
        assert table.window(op, 2, "auto", oversubscribed=True) == table.ALWAYS
    assert table.window("all_reduce", 2, "off", oversubscribed=True) == table.NEVER  # HPCDIST_SHM=0 wins
    assert table.window("all_reduce", 1, "auto", oversubscribed=True) == table.NEVER  # nobody to share with
    assert table.window("all_to_all", 2, "auto", oversubscribed=True) == table.NEVER  # not a shared-memory op
    assert table.describe("barrier", 2, "auto", oversubscribed=True) == "shm"


def test_oversubscription_is_ranks_on_this_node_against_its_cpus(monkeypatch):
    from hpcdist._world import WORLD
    from hpcdist.backends.shm import engine

    class _PG:
        _rank = 1

    monkeypatch.setattr(WORLD, "default_pg", _PG())
    monkeypatch.setattr(WORLD, "node_cpus", [2, 2, 2, 2])  # what init's layout exchange found
    monkeypatch.setattr(WORLD, "node_of", [0, 0, 0, 1])  # rank 1 shares node 0 with two others
    assert engine.oversubscribed_node()
    monkeypatch.setattr(WORLD, "node_of", [0, 0, 1, 1])
    assert not engine.oversubscribed_node()
    monkeypatch.setattr(WORLD, "node_cpus", [1, 1, 2, 2])  # node 0's ranks may run on one CPU
    assert engine.oversubscribed_node()
    monkeypatch.setattr(WORLD, "node_of", [])  # not initialised: no layout
    assert not engine.oversubscribed_node()


def test_node_cpus_are_the_union_of_the_nodes_affinity_sets(monkeypatch):
    """A node's CPUs are the union of its ranks' affinity sets (bitmasks OR-ed per node): ranks sharing one set
    count it once, ranks bound to their own CPUs add up, overlapping sets count their union (two unbound ranks on
    CPUs {0, 1} beside one pinned to {1} made 3 when sets were summed per distinct set: the node looked not
    oversubscribed); nodes are counted apart; CPUs from 1024 up count once per distinct set of them."""
    import numpy as np

    from hpcdist import topology

    class _Comm:
        def Get_size(self):
            return 1

    def row(node: int, cpus: list[int], high: tuple[int, int] = (0, 0)) -> list[int]:
        mask = np.zeros(topology._MASK_WORDS, dtype=np.uint64)
        for c in cpus:
            mask[c // 64] |= np.uint64(1) << np.uint64(c % 64)
        return [node, high[0], high[1], *mask.view(np.int64).tolist()]

    cases = {
        "same": ([row(7, [0, 1, 2, 3]), row(7, [0, 1, 2, 3]), row(9, [0, 1]), row(9, [0, 1])], [4, 4, 2, 2]),
        "bound": ([row(7, [0]), row(7, [1]), row(7, [2]), row(9, list(range(8)))], [3, 3, 3, 8]),
        "overlap": ([row(7, [0, 1]), row(7, [0, 1]), row(7, [1])], [2, 2, 2]),
        "wide": ([row(7, [0, 63, 64, 1023]), row(7, [1023], (2, 5)), row(7, [], (2, 5))], [6, 6, 6]),
    }
    for name, (rows, want) in cases.items():
        monkeypatch.setattr(topology, "_gather_words", lambda *a, rows=rows: np.array(rows, dtype=np.int64))
        layout, cpus = topology.node_layout_and_cpus(_Comm())
        assert cpus == want, name
        assert layout == [0 if r[0] == rows[0][0] else 1 for r in rows], name


def test_table_rows_are_well_formed():
    assert table.MACHINE and table.DATE
    for op, rows in table.TABLE.items():
        assert op in table.OPS
        for k, (lo, hi) in rows.items():
            assert k >= 2 and 0 <= lo <= hi


@pytest.mark.parametrize(("raw", "mode"), [(None, "auto"), ("auto", "auto"), ("1", "on"), ("on", "on"), ("0", "off")])
def test_shm_mode(monkeypatch, raw, mode):
    if raw is None:
        monkeypatch.delenv("HPCDIST_SHM", raising=False)
    else:
        monkeypatch.setenv("HPCDIST_SHM", raw)
    assert config.shm_mode() == mode


def test_shm_knobs_reject_garbage(monkeypatch):
    monkeypatch.setenv("HPCDIST_SHM", "maybe")
    with pytest.raises(ValueError, match="HPCDIST_SHM"):
        config.shm_mode()
    monkeypatch.setenv("HPCDIST_SHM_SLOT", "100")
    with pytest.raises(ValueError, match="multiple of 64"):
        config.shm_slot_bytes()
    monkeypatch.setenv("HPCDIST_SHM_SLOT", "4096")
    assert config.shm_slot_bytes() == 4096


def test_bucket_plan():
    nb = [10, 10, 10, 50, 10, 4]
    keys = ["f", "f", "i", "f", "f", "i"]
    assert bucket_indices(nb, keys, 25) == [[0, 1], [2, 5], [3], [4]]
    assert bucket_indices(nb, keys, 1000) == [[0, 1, 3, 4], [2, 5]]
    # "at most cap_bytes": buckets filled exactly to the cap, one kind and several
    assert bucket_indices([4, 4, 4, 4], ["f"] * 4, 8) == [[0, 1], [2, 3]]
    assert bucket_indices([4, 4, 4, 4], ["f", "i", "f", "i"], 8) == [[0, 2], [1, 3]]
    with pytest.raises(ValueError, match="cap"):
        bucket_indices(nb, keys, 0)
    with pytest.raises(ValueError, match="same length"):
        bucket_indices(nb, keys[:2], 10)


def test_parse_sizes():
    assert parse_sizes("1K:8K") == [1024, 2048, 4096, 8192]
    assert parse_sizes("1K:64K:4") == [1024, 4096, 16384, 65536]
    assert parse_sizes("8,1MiB") == [8, 1 << 20]
    with pytest.raises(ValueError, match="--sizes"):
        parse_sizes("1X")
    assert parse_sizes("4k,64kb,1mb,1G") == [4096, 65536, 1 << 20, 1 << 30]  # what bench_hierarchical.py took


def test_human_size_reads_back_through_parse_sizes():
    sizes = [8, 1000, 1024, 3 << 10, 1 << 20, 3 << 20, 1 << 30]
    assert [human_size(n) for n in sizes[2:5]] == ["1 KiB", "3 KiB", "1 MiB"]
    assert human_size(1536) == "1536 B"  # not a whole KiB: bytes, never a rounded 1.5 KiB
    assert parse_sizes(",".join(human_size(n).replace(" ", "") for n in sizes)) == sizes


@pytest.mark.parametrize(("raw", "want"), [("0", "mpi"), ("1", "shm")])
def test_info_reports_the_path_per_op(monkeypatch, raw, want):
    from hpcdist.info import collect

    monkeypatch.setenv("HPCDIST_SHM", raw)
    paths = collect()["shared_memory"]["paths"]
    assert set(paths) == set(table.OPS)
    assert all(p == f"2 ranks: {want}; 4 ranks: {want}" for p in paths.values())


@pytest.mark.parametrize(
    ("knob", "raw", "key", "want"),
    [
        ("HPCDIST_SHM_DIRECT", None, "direct_reads", "off"),
        ("HPCDIST_SHM_DIRECT", "1", "direct_reads", "on where"),
        ("HPCDIST_SHM_DIRECT", "x", "direct_reads", "environment variable HPCDIST_SHM_DIRECT must be"),
        ("HPCDIST_SHM", None, "symmetric_memory", "arrays of hpcdist.symmetric_memory"),
        ("HPCDIST_SHM", "0", "symmetric_memory", "allocations work"),
    ],
)
def test_info_reports_direct_reads_and_symmetric_memory(monkeypatch, knob, raw, key, want):
    from hpcdist.info import collect

    if raw is None:
        monkeypatch.delenv(knob, raising=False)
    else:
        monkeypatch.setenv(knob, raw)
    assert collect()["shared_memory"][key].startswith(want)


def test_describe_a_window(monkeypatch):
    monkeypatch.setitem(table.TABLE, "broadcast", {2: (1 << 20, 64 << 20)})
    assert table.describe("broadcast", 2) == "mpi below 1 MiB, shm 1 MiB-64 MiB, mpi from 64 MiB"


def test_bucket_plan_of_one_kind_matches_the_greedy_fill():
    """The one-dtype fast path (cumulative sums) plans exactly what the greedy per-key fill does."""
    import random

    def greedy(nbytes, cap):
        out, cur, fill = [], [], 0
        for i, nb in enumerate(nbytes):
            if cur and fill + nb > cap:
                out.append(cur)
                cur, fill = [], 0
            cur.append(i)
            fill += nb
        return out + ([cur] if cur else [])

    rng = random.Random(7)
    for _ in range(300):
        nbytes = [rng.choice([0, 1, 4, 64, 4096, 10_000, 1 << 20]) for _ in range(rng.randrange(1, 60))]
        cap = rng.choice([1, 64, 4096, 25 << 20, 100_000])
        assert bucket_indices(nbytes, ["f4"] * len(nbytes), cap) == greedy(nbytes, cap), (nbytes, cap)


def test_bench_passes_keep_each_cells_best():
    from hpcdist.bench import best_of

    def row(variant, t, path="shm"):
        return {"op": "all_reduce", "ranks": 2, "bytes": 1024, "variant": variant, "path": path, "time_us": t}

    merged = best_of([[row("hpcdist", 5.0), row("raw", 3.0)], [row("hpcdist", 4.0), row("raw", 9.0)]])
    assert sorted((r["variant"], r["time_us"]) for r in merged) == [("hpcdist", 4.0), ("raw", 3.0)]


@pytest.mark.parametrize(("raw", "want"), [(None, False), ("1", True), ("on", True), ("0", False)])
def test_shm_direct_knob(monkeypatch, raw, want):
    if raw is None:
        monkeypatch.delenv("HPCDIST_SHM_DIRECT", raising=False)
    else:
        monkeypatch.setenv("HPCDIST_SHM_DIRECT", raw)
    assert config.shm_direct() is want
    monkeypatch.setenv("HPCDIST_SHM_DIRECT", "sometimes")
    with pytest.raises(ValueError, match="HPCDIST_SHM_DIRECT"):
        config.shm_direct()


def _reader(pids):
    from hpcdist.backends.shm import cma

    fn = cma._call()
    if fn is None:
        pytest.skip("no process_vm_readv in this libc / OS")
    return cma.Reader(fn, pids)


def test_reader_copies_another_process_memory_by_address():
    """A child holds known bytes; the reader copies them by the child's pid and address (several MiB: the
    kernel may copy in parts, which the reader continues), and raises naming the process once it is gone."""
    import subprocess
    import sys

    import numpy as np

    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import numpy as np, sys\n"
            "a = (np.arange(3 << 20, dtype=np.int64) * 7 + 3)\n"
            "print(a.ctypes.data, flush=True)\n"
            "sys.stdin.readline()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        addr = int(child.stdout.readline())
        rd = _reader([child.pid])
        got = np.zeros(3 << 20, np.int64)
        try:
            rd.read(0, addr, got.ctypes.data, got.nbytes)
        except OSError as e:  # ptrace rules forbid it here: the engine's probe would say no as well
            pytest.skip(f"this OS forbids reading a child's memory: {e}")
        assert np.array_equal(got, np.arange(3 << 20, dtype=np.int64) * 7 + 3)
        part = np.zeros(5, np.int64)
        rd.read(0, addr + 8 * 100, part.ctypes.data, part.nbytes)  # from an offset
        assert part.tolist() == [7 * i + 3 for i in range(100, 105)]
    finally:
        child.communicate("\n", timeout=30)
    with pytest.raises(OSError, match=f"process {child.pid}"):
        rd.read(0, addr, got.ctypes.data, 8)  # reaped: no such process


def test_reader_scratch_is_kept_per_dtype_and_size():
    import numpy as np

    rd = _reader([0])
    a = rd.scratch(np.dtype(np.float32), 2, 16)
    assert len(a) == 2 and all(x.dtype == np.float32 and x.size == 16 for x in a)
    assert rd.scratch(np.dtype(np.float32), 1, 16)[0] is a[0]  # reused, not reallocated
    assert rd.scratch(np.dtype(np.float64), 3, 16)[2].dtype == np.float64


def test_bench_from_csv_merges_launches_without_mpi(tmp_path, capsys):
    """2 ranks and 4 ranks measured in separate launches: --from-csv prints, merges and plots them together."""
    from hpcdist.bench import main, read_csv, write_csv

    def row(ranks, nbytes, variant, t):
        bw = nbytes / t / 1e3
        return {"op": "all_reduce", "ranks": ranks, "bytes": nbytes, "variant": variant, "path": "shm",
                "time_us": t, "algbw_GBps": bw, "busbw_GBps": bw * 2 * (ranks - 1) / ranks}  # fmt: skip

    two = [row(2, 1 << 20, "hpcdist", 50.0), row(2, 1 << 20, "raw", 100.0)]
    four = [row(4, 1 << 20, "hpcdist", 80.0), row(4, 1 << 20, "raw", 120.0)]
    a, b, merged = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "m.csv"
    write_csv(two, str(a))
    write_csv(four, str(b))
    assert read_csv([str(a)]) == two  # typed back as measured
    assert main(["--from-csv", str(a), str(b), "--csv", str(merged)]) == 0
    out = capsys.readouterr().out
    assert "### all_reduce, 2 ranks" in out and "### all_reduce, 4 ranks" in out
    assert "| 2.00x |" in out and "| 1.50x |" in out  # hpcdist/raw per launch: 100/50, 120/80
    assert read_csv([str(merged)]) == two + four
    if importlib.util.find_spec("matplotlib"):
        assert main(["--from-csv", str(merged), "--plot", str(tmp_path / "p.png")]) == 0
        assert (tmp_path / "p.png").read_bytes()[:4] == b"\x89PNG"


def _dead_pid() -> int:
    import subprocess
    import sys

    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait(timeout=60)
    return child.pid


def test_sweep_removes_only_files_of_dead_creators_of_this_namespace_and_user(tmp_path):
    import os

    from hpcdist.backends.shm import segment

    ns, dead = segment._pid_namespace(), _dead_pid()
    names = {
        "left": f"hpcdist-{ns}-{dead}-0123456789ab",  # its creator is gone: removed
        "live": f"hpcdist-{ns}-{os.getpid()}-0123456789ab",  # this process: a setup in progress, kept
        "other_ns": f"hpcdist-{ns}1-{dead}-0123456789ab",  # another PID namespace: its pids mean nothing here
        "odd": f"hpcdist-{ns}-notapid-0123456789ab",
        "foreign": "something-else",
    }
    for n in names.values():
        (tmp_path / n).write_bytes(b"x")
    assert segment.sweep(str(tmp_path)) == [f"{tmp_path}/{names['left']}"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(v for k, v in names.items() if k != "left")
    assert segment.sweep(str(tmp_path / "missing")) == []  # no such directory: nothing to do


def test_bench_symmetric_ops_are_the_engines():
    """``hpcdist bench`` names the symmetric operations without importing the engine (no MPI at parse time)."""
    from hpcdist.backends.shm import symmetric
    from hpcdist.bench import SYMMETRIC_OPS

    assert SYMMETRIC_OPS == symmetric.OPS
