"""``hpcdist bench``'s arguments: every bad value is refused before MPI starts (or, for what needs the launch,
before the first measurement), naming the flag, what it expects and what it got; the rows report the bytes
that moved. The launches themselves are in tests/integration/test_cli_bench.py."""

from __future__ import annotations

import argparse
import csv

import pytest

from hpcdist import bench


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("1K:64M:1.5", "an integer FACTOR >= 2, got '1K:64M:1.5'"),  # was int()'s message, naming nothing
        ("1K:64M:x", "an integer FACTOR >= 2, got '1K:64M:x'"),
        ("1K:64M:1", "an integer FACTOR >= 2, got '1K:64M:1'"),
        ("1M:1K", "0 < LO <= HI"),
        ("1:2:3:4", "LO:HI[:FACTOR]"),
        ("inf", "a size such as 8, 4K, 1M or 64MiB, got 'inf'"),  # was a bare OverflowError
        ("1e400", "got '1e400'"),
        ("0", "a size of at least 1 byte, got '0'"),  # was accepted: rows of 0 bytes
        ("-1", "at least 1 byte, got '-1'"),
        ("0.1", "at least 1 byte, got '0.1'"),
        ("0:1K", "at least 1 byte, got '0'"),
        (",", "at least one size"),  # was an empty sweep
        ("", "at least one size"),
        ("1Q", "got '1Q'"),
    ],
)
def test_bad_sizes_name_the_flag_and_the_value(spec, message):
    with pytest.raises(ValueError) as info:
        bench.parse_sizes(spec)
    assert str(info.value).startswith("--sizes: ") and message in str(info.value)


@pytest.mark.parametrize(("spec", "want"), [("6", [6]), ("1.5K", [1536]), ("1K:4K:2", [1024, 2048, 4096])])
def test_good_sizes(spec, want):
    assert bench.parse_sizes(spec) == want


@pytest.mark.parametrize(("spec", "message"), [(",", "got ','"), ("foo,all_reduce", "unknown 'foo'"), ("", "got ''")])
def test_bad_ops(spec, message):
    with pytest.raises(ValueError) as info:
        bench.parse_ops(spec)
    assert str(info.value).startswith("--ops: expected a comma-separated list of all_reduce, broadcast")
    assert message in str(info.value)


def test_ranks():
    assert bench.parse_ranks("4,2,2") == [2, 4]
    assert bench.parse_ranks("") == []
    assert bench.parse_ranks("1,3", 3) == [1, 3]
    for spec, size, message in (
        ("abc", None, "--ranks: expected comma-separated integers such as 2,4, got 'abc'"),
        ("5", 2, "--ranks: expected group sizes of at least 1 and at most the 2 ranks of this launch, got '5'"),
        ("-1,0,1", None, "--ranks: expected group sizes of at least 1, got '-1,0,1'"),
    ):  # "5" at 2 ranks was silently replaced by all ranks
        with pytest.raises(ValueError) as info:
            bench.parse_ranks(spec, size)
        assert str(info.value) == message


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rounds", "0"], "argument --rounds: expected an integer >= 1, got '0'"),  # was a table of inf
        (["--passes", "-3"], "argument --passes: expected an integer >= 1, got '-3'"),
        (["--iters", "nan"], "argument --iters: expected a number > 0, got 'nan'"),  # was a traceback mid-run
        (["--sizes", "0"], "--sizes: expected a size of at least 1 byte, got '0'"),
        (["--ops", "nope"], "--ops: expected a comma-separated list of"),  # was found after MPI started
        (["--ranks", "x"], "--ranks: expected comma-separated integers"),
        (["--ops", "barrier", "--plot", "p.png"], "--plot: barrier has no sizes to plot"),  # was exit 0, no PNG
    ],
)
def test_main_refuses_before_mpi(argv, message, capsys):
    """Exit status 2 and argparse's one-line error; MPI is never imported, let alone started."""
    import sys

    had_mpi = "mpi4py.MPI" in sys.modules
    with pytest.raises(SystemExit) as info:
        bench.main(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert f"hpcdist bench: error: {message}" in err
    assert ("mpi4py.MPI" in sys.modules) == had_mpi


@pytest.mark.parametrize(
    ("op", "nbytes", "n", "moved"),
    [
        ("all_reduce", 6, 2, 4),  # labelled 6, moved one float32
        ("all_reduce", 1 << 20, 2, 1 << 20),
        ("all_gather_into_tensor", 8, 3, 12),  # three rows of one item
        ("all_gather_into_tensor", 1024, 3, 1020),
        ("reduce_scatter_tensor", 1, 2, 8),
        ("all_to_all_single", 4096, 4, 4096),
    ],
)
def test_rows_report_the_bytes_that_moved(op, nbytes, n, moved):
    """A row's size is the full array the calls used (as nccl-tests reports the size it rounded to)."""
    count = bench._count(op, nbytes, n)
    assert 4 * count == moved
    if op in ("all_gather_into_tensor", "reduce_scatter_tensor", "all_to_all_single"):
        assert count % n == 0


def _args(**kw):
    return argparse.Namespace(**{"csv": None, "plot": None, "table_file": None, **kw})


def test_outputs_checked_before_the_sweep(tmp_path):
    assert bench._check_outputs(_args(csv=str(tmp_path / "a.csv"))) is None
    assert "got the directory" in bench._check_outputs(_args(csv=str(tmp_path)))
    missing = bench._check_outputs(_args(csv=str(tmp_path / "no" / "a.csv")))
    assert missing.startswith("--csv: expected a file in a writable directory")
    ro = tmp_path / "ro"
    ro.mkdir(mode=0o500)
    import os

    if os.access(ro, os.W_OK):  # root writes anywhere
        pytest.skip("this user can write into a read-only directory (root)")
    assert bench._check_outputs(_args(plot=str(ro / "p.png"))).startswith("--plot: expected a file")


def _write(path, rows, header=("op", "ranks", "bytes", "variant", "path", "time_us", "algbw_GBps", "busbw_GBps")):
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        if header:
            w.writerow(header)
        w.writerows(rows)
    return str(path)


GOOD = ["all_reduce", "2", "1024", "hpcdist", "shm", "10.0", "0.1", "0.1"]


@pytest.mark.parametrize(
    ("rows", "header", "message"),
    [
        ([GOOD], ("op", "bytes"), "its header lacks ranks, variant, path, time_us"),
        ([], None, "got an empty file"),
        ([], ..., "expected rows of measurements, got none"),
        ([[*GOOD[:1], "2.0", *GOOD[2:]]], ..., "line 2: ranks: expected an integer, got '2.0'"),
        ([[*GOOD[:5], "fast", *GOOD[6:]]], ..., "line 2: time_us: expected a number, got 'fast'"),
        ([["all_sum", *GOOD[1:]]], ..., "line 2: op: expected one of all_reduce"),
        ([GOOD, [*GOOD[:3], "nccl", *GOOD[4:]]], ..., "line 3: variant: expected one of hpcdist"),
    ],
)
def test_from_csv_errors_name_the_file_and_line(tmp_path, rows, header, message, capsys):
    path = _write(tmp_path / "x.csv", rows, *(() if header is ... else (header,)))
    with pytest.raises(ValueError) as info:
        bench.read_csv([path])
    assert str(info.value).startswith(f"--from-csv {path!r}") and message in str(info.value)
    with pytest.raises(SystemExit) as ex:
        bench.main(["--from-csv", path])
    assert ex.value.code == 2 and message in capsys.readouterr().err


def test_from_csv_missing_file(tmp_path, capsys):
    with pytest.raises(SystemExit) as ex:
        bench.main(["--from-csv", str(tmp_path / "gone.csv")])
    assert ex.value.code == 2
    assert f"--from-csv: cannot read '{tmp_path / 'gone.csv'}': No such file or directory" in capsys.readouterr().err


def test_tables_of_a_csv_without_raw_rows(tmp_path):
    """A CSV filtered to some variants still prints: the missing cells and ratios show ``-``."""
    rows = bench.read_csv([_write(tmp_path / "x.csv", [GOOD])])
    table = bench.format_tables(rows)
    assert "| 1024 | shm | 10.0 | 0.10 | - |" in table
