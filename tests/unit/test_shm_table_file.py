"""A selection table of one's own machine: ``hpcdist bench --table-file`` writes it, ``HPCDIST_SHM_TABLE`` loads it.

The reference for what a file means is the built-in table's own lookup (:func:`table.window` over rows given as
Python), and for what the bench writes, crossovers computed by hand from made-up timings.
"""

from __future__ import annotations

import argparse
import csv
import json
import os

import pytest

from hpcdist import bench, config
from hpcdist.backends.shm import table

MiB = 1 << 20


def _file(tmp_path, doc, name="t.json"):
    path = tmp_path / name
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))
    return str(path)


def _doc(ops, **head):
    return {"format": table.FORMAT, "machine": "test box", "date": "today", **head, "ops": ops}


def test_a_file_round_trips_and_replaces_only_its_operations(tmp_path):
    rows = {
        "all_reduce": {2: (MiB, table.INF), 4: (0, 4 * MiB)},
        "barrier": {2: table.ALWAYS},
        "reduce": {2: table.NEVER},
    }
    path = _file(tmp_path, table.dumps(rows, "a 2-socket box", "2026-11-28"))
    sel = table.load(path)
    assert (sel.machine, sel.date, sel.source) == ("a 2-socket box", "2026-11-28", path)
    for op in table.OPS:  # the file's operations as written; every other one as built in
        for k in (2, 3, 4, 8):
            want = table.window(op, k, rows=rows if op in rows else table.TABLE)
            assert table.window(op, k, rows=sel.rows) == want, (op, k)
    assert table.window("all_reduce", 4, rows=sel.rows) == (0, 4 * MiB)  # a bounded window survives
    assert table.describe("reduce", 2, rows=sel.rows) == "mpi"


def test_never_and_always_and_an_open_end(tmp_path):
    sel = table.load(_file(tmp_path, _doc({"broadcast": {"2": "never", "4": "always", "8": [64, None]}})))
    assert sel.rows["broadcast"] == {2: table.NEVER, 4: table.ALWAYS, 8: (64, table.INF)}


BAD = [
    ("{", "a file that is not JSON"),
    ("[]", "expected a table of format 'hpcdist-shm-table/1' (hpcdist bench --table-file), got format 'list'"),
    (json.dumps({"format": "other/2", "machine": "m", "ops": {}}), "got format 'other/2'"),
    (_doc({"all_reduce": {"2": "never"}}, machine=""), "expected 'machine'"),
    (_doc({"all_reduce": {"2": "never"}}, date=7), "expected 'date' as text, got 7"),
    (_doc({}), "expected 'ops': an object of operation -> rows, got {}"),
    (_doc({"all_sum": {"2": "never"}}), "expected operations among all_reduce, "),
    (_doc({"all_reduce": []}), "all_reduce: expected an object of group size -> range, got []"),
    (_doc({"all_reduce": {"1": "never"}}), "all_reduce: expected group sizes of 2 or more, got '1'"),
    (_doc({"all_reduce": {"two": "never"}}), "got 'two'"),
    (_doc({"all_reduce": {"2": "sometimes"}}), 'all_reduce, 2 ranks: expected "never", "always" or [lo, hi]'),
    (_doc({"all_reduce": {"2": [5, 1]}}), "got [5, 1]"),
    (_doc({"all_reduce": {"2": [-1, None]}}), "got [-1, null]"),
    (_doc({"all_reduce": {"2": [1.5, None]}}), "got [1.5, null]"),
    (_doc({"all_reduce": {"2": [True, None]}}), "got [true, null]"),
    (_doc({"all_reduce": {"2": [1]}}), "got [1]"),
]


@pytest.mark.parametrize(("doc", "message"), BAD)
def test_a_wrong_file_names_the_variable_the_file_and_the_fault(tmp_path, monkeypatch, doc, message):
    path = _file(tmp_path, doc if isinstance(doc, str) else json.dumps(doc))
    with pytest.raises(ValueError) as info:
        table.load(path)
    assert str(info.value).startswith(f"HPCDIST_SHM_TABLE={path!r}: ") and message in str(info.value)
    monkeypatch.setenv("HPCDIST_SHM_TABLE", path)  # and where it is read: a group's engine, hpcdist info
    with pytest.raises(ValueError, match="HPCDIST_SHM_TABLE"):
        table.active()
    assert message in config.problems()["HPCDIST_SHM_TABLE"]


def test_active_follows_the_variable_and_the_file(tmp_path, monkeypatch):
    monkeypatch.delenv("HPCDIST_SHM_TABLE", raising=False)
    assert table.active() is table.BUILTIN
    monkeypatch.setenv("HPCDIST_SHM_TABLE", "  ")  # empty: the built-in table
    assert table.active() is table.BUILTIN
    path = _file(tmp_path, _doc({"all_reduce": {"2": [100, None]}}))
    monkeypatch.setenv("HPCDIST_SHM_TABLE", path)
    first = table.active()
    assert first.rows["all_reduce"] == {2: (100, table.INF)} and table.active() is first  # parsed once
    with open(path, "w") as f:  # rewritten (another size, so even a coarse clock sees the change)
        json.dump(_doc({"all_reduce": {"2": [2000, None]}}), f)
    assert table.active().rows["all_reduce"] == {2: (2000, table.INF)}
    monkeypatch.setenv("HPCDIST_SHM_TABLE", str(tmp_path / "gone.json"))
    with pytest.raises(ValueError, match=r"must name a table file written by hpcdist bench --table-file.*gone\.json"):
        table.active()


def test_info_names_the_file_and_its_paths(tmp_path, monkeypatch):
    from hpcdist.info import collect

    monkeypatch.delenv("HPCDIST_SHM", raising=False)
    path = _file(tmp_path, _doc({"all_reduce": {"2": "always", "4": [MiB, None]}}))
    monkeypatch.setenv("HPCDIST_SHM_TABLE", path)
    shm = collect()["shared_memory"]
    assert shm["table"] == f"test box; today (HPCDIST_SHM_TABLE={path})"
    assert shm["paths"]["all_reduce"] == "2 ranks: shm; 4 ranks: mpi below 1 MiB, shm from 1 MiB"
    assert shm["paths"]["reduce"] == "; ".join(f"{k} ranks: {table.describe('reduce', k)}" for k in (2, 4))
    monkeypatch.setenv("HPCDIST_SHM", "1")  # forced on: the table does not apply, nor is it read
    monkeypatch.setenv("HPCDIST_SHM_TABLE", str(tmp_path / "gone.json"))
    assert collect()["shared_memory"]["paths"]["all_reduce"] == "2 ranks: shm; 4 ranks: shm"
    monkeypatch.delenv("HPCDIST_SHM")
    assert "gone.json" in collect()["shared_memory"]["table"]


def _rows(times):
    """bench rows from ``{(op, ranks, bytes): (shm µs, raw µs)}``."""
    out = []
    for (op, k, b), (shm, raw) in times.items():
        for variant, t in (("shm", shm), ("raw", raw), ("hpcdist", min(shm, raw))):
            out.append({"op": op, "ranks": k, "bytes": b, "variant": variant, "path": "", "time_us": t})
    return out


def test_the_bench_writes_the_measured_crossovers(tmp_path, monkeypatch):
    times = {
        ("all_reduce", 2, 256 << 10): (30.0, 20.0),  # MPI wins: the window starts above
        ("all_reduce", 2, MiB): (80.0, 120.0),
        ("all_reduce", 2, 4 * MiB): (300.0, 500.0),
        ("all_reduce", 4, MiB): (70.0, 60.0),  # shared memory wins below, loses at 4 MiB: never
        ("all_reduce", 4, 256 << 10): (10.0, 20.0),
        ("all_reduce", 4, 4 * MiB): (600.0, 500.0),
        ("reduce_scatter_tensor", 2, MiB): (40.0, 90.0),
        ("barrier", 2, 0): (1.0, 2.0),
    }
    rows = _rows(times)
    want = {
        "all_reduce": {2: (MiB, table.INF), 4: table.NEVER},
        "reduce_scatter_tensor": {2: (MiB, table.INF)},
        "reduce_scatter": {2: (MiB, table.INF)},  # the list form, unmeasured, follows its tensor form
        "barrier": {2: table.ALWAYS},
    }
    path = tmp_path / "mine.json"
    path.write_text(bench.table_file(rows, "the box"))
    sel = table.load(str(path))
    assert {op: sel.rows[op] for op in want} == want
    assert sel.rows["broadcast"] == table.TABLE["broadcast"]  # not measured: built in
    assert sel.machine == "the box" and "hpcdist bench --table-file" in sel.date
    assert "'all_reduce': {2: (1048576, INF), 4: NEVER}" in bench.selection_rows(rows)  # the Python form agrees


def test_table_file_from_csv_through_the_command(tmp_path, monkeypatch, capsys):
    src = tmp_path / "m.csv"
    times = {("broadcast", 2, MiB): (30.0, 40.0), ("broadcast", 2, 256 << 10): (30.0, 20.0)}
    with open(src, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=["op", "ranks", "bytes", "variant", "path", "time_us", "algbw_GBps",
                                          "busbw_GBps"])  # fmt: skip
        w.writeheader()
        w.writerows({**r, "algbw_GBps": 1.0, "busbw_GBps": 1.0} for r in _rows(times))
    out = tmp_path / "t.json"
    assert bench.main(["--from-csv", str(src), "--table-file", str(out), "--machine", "box 7"]) == 0
    monkeypatch.setenv("HPCDIST_SHM_TABLE", str(out))
    sel = table.active()
    assert sel.machine == "box 7" and sel.rows["broadcast"] == {2: (MiB, table.INF)}
    unnamed = tmp_path / "u.json"
    assert bench.main(["--from-csv", str(src), "--table-file", str(unnamed)]) == 0
    assert table.load(str(unnamed)).machine.startswith("unknown (--from-csv")
    with pytest.raises(SystemExit) as ex:  # an unwritable --table-file is refused before anything is printed
        bench.main(["--from-csv", str(src), "--table-file", str(tmp_path)])
    assert ex.value.code == 2 and "--table-file: expected a file to write, got the directory" in capsys.readouterr().err


def test_the_bench_refuses_a_wrong_table_before_mpi(tmp_path, monkeypatch, capsys):
    import sys

    monkeypatch.setenv("HPCDIST_SHM_TABLE", _file(tmp_path, "{"))
    had_mpi = "mpi4py.MPI" in sys.modules
    with pytest.raises(SystemExit) as ex:
        bench.main(["--ops", "all_reduce"])
    assert ex.value.code == 2 and "HPCDIST_SHM_TABLE=" in capsys.readouterr().err
    assert ("mpi4py.MPI" in sys.modules) == had_mpi


def test_the_shipped_xeon_table_is_what_its_csv_gives():
    """docs/benchmarks/shm-table-xeon16.json is the table of shm-xeon16.csv beside it (as shm.md says)."""
    here = os.path.join(os.path.dirname(__file__), "..", "..", "docs", "benchmarks")
    shipped = table.load(os.path.join(here, "shm-table-xeon16.json"))
    rows = bench.read_csv([os.path.join(here, "shm-xeon16.csv")])
    want = {
        op: {k: table.NEVER if lo is None else (lo, table.INF) for k, lo in per.items()}
        for op, per in bench.crossovers(rows).items()
    }
    assert want and all(shipped.rows[op] == per for op, per in want.items())
    assert shipped.rows["all_gather"] == want["all_gather_into_tensor"]
    assert shipped.rows["all_reduce"] != table.TABLE["all_reduce"]  # not the VM's: 1 MiB, not 512 KiB


def test_the_bench_reads_the_table_only_where_it_applies(tmp_path, monkeypatch):
    """With HPCDIST_SHM=1 (or 0) no group reads the table, so the bench neither refuses nor names a wrong one."""
    monkeypatch.setenv("HPCDIST_SHM_TABLE", _file(tmp_path, "{"))
    monkeypatch.setenv("HPCDIST_SHM", "1")
    args = argparse.Namespace(sizes="1K", ops="all_reduce", ranks="", plot=None)
    bench._check_args(args)  # no error: the table does not apply
    monkeypatch.setenv("HPCDIST_SHM", "auto")
    with pytest.raises(ValueError, match="HPCDIST_SHM_TABLE="):
        bench._check_args(args)
