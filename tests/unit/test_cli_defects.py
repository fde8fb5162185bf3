"""`hpcdist run`'s arguments and bootstrap pieces found wrong by an adversarial pass, in-process.

Each test failed before its fix; the launched counterparts are in tests/integration/test_cli_launch_defects.py.
"""

from __future__ import annotations

import io
import json

import pytest

from hpcdist import cli
from hpcdist.launch import run as runmod
from hpcdist.launch._bootstrap import PrefixWriter, _record
from hpcdist.launch.launchers import LaunchError
from hpcdist.launch.run import UsageError, build_command, parse_args

PY = "/opt/py/bin/python"


def which_all(name):
    return f"/usr/bin/{name}"


@pytest.mark.parametrize(
    ("argv", "field", "value"),
    [
        (["--nproc", "2"], "nprocs", 2),  # argparse's abbreviation of --nprocs: '2' was taken for the script
        (["--timeo", "5"], "timeout", 5.0),
        (["--host", "a", "-n", "2"], None, None),  # ambiguous (--hosts, --hostfile): argparse says so
    ],
)
def test_abbreviated_value_option_takes_its_value(script, argv, field, value):
    if field is None:
        with pytest.raises(UsageError, match="ambiguous option: --host"):
            parse_args([*argv, script])
        return
    opts = parse_args([*argv, script, "-n", "3"])
    assert getattr(opts, field) == value
    assert opts.program == [script, "-n", "3"]


def test_unknown_launcher_is_a_usage_error(script, capsys):
    """It exited 1 (a launcher that cannot start) though nothing was launched: an argument error is 2."""
    assert runmod.main(["--launcher", "mpich", script]) == 2
    err = capsys.readouterr().err
    assert err == (
        "hpcdist run: --launcher: expected auto, mpiexec or one of generic, hydra, openmpi, srun; got 'mpich'\n"
    )


def test_unreadable_hostfile_is_a_usage_error(script, capsys):
    assert runmod.main(["--hostfile", "nope.txt", script]) == 2
    assert capsys.readouterr().err.startswith("hpcdist run: --hostfile: cannot read 'nope.txt'")


@pytest.mark.parametrize("value", ["", " ", ","])
def test_empty_hosts_are_refused(script, value):
    """``--hosts "$HOSTS"`` with the variable empty ran every rank on this host, silently."""
    with pytest.raises(UsageError, match=r"--hosts: expected at least one host name, got "):
        parse_args(["--hosts", value, script])


def test_srun_refuses_a_hostfile(script, tmp_path):
    """srun ignored --hostfile (the ranks ran anywhere in the allocation, MASTER_ADDR named the file's first host)."""
    (tmp_path / "hosts").write_text("n1:4\nn2:4\n")
    opts = parse_args(["-n", "8", "--hostfile", "hosts", script])
    with pytest.raises(LaunchError, match=r"--hostfile: srun does not read hostfiles .*--hosts"):
        build_command(opts, {"SLURM_JOB_ID": "7"}, None, python=PY, which=which_all)


def test_directory_as_script_says_so(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "proj").mkdir()
    with pytest.raises(UsageError) as info:
        parse_args(["proj"])
    assert str(info.value) == "script 'proj': expected a Python file, got a directory"


def test_no_command_prints_usage_on_stderr(capsys):
    assert cli.main([]) == 2
    out = capsys.readouterr()
    assert out.out == "" and out.err.startswith("usage: hpcdist COMMAND")
    assert cli.main(["--help"]) == 0
    assert capsys.readouterr().out.startswith("usage: hpcdist COMMAND")


def test_prefix_writer_has_the_text_stream_api():
    """writelines, buffer and reconfigure raised AttributeError under --prefix-output."""
    raw = io.BytesIO()
    text = io.TextIOWrapper(raw, encoding="utf-8", write_through=True)
    w = PrefixWriter(text, "[rank 1] ")
    w.writelines(["a\n", "b\n"])
    w.write("part")
    w.buffer.write(b" bytes\n")  # the pending text goes first; bytes go as they are
    w.reconfigure(line_buffering=True)
    assert text.line_buffering and not w.closed
    assert raw.getvalue().decode() == "[rank 1] a\n[rank 1] b\n[rank 1] part bytes\n"


@pytest.mark.parametrize(
    ("exc", "code", "error", "status"),
    [
        (None, 3, "exited with status 3", 3),
        (None, "fatal thing", "exited with status 1: fatal thing", 1),  # it said 'exited with status fatal thing'
        (ValueError("bad\nshard"), None, "ValueError: bad", 1),
    ],
)
def test_record_keeps_the_exit_status(tmp_path, exc, code, error, status):
    _record(str(tmp_path), 2, exc, code)
    rec = json.loads((tmp_path / "rank-2.json").read_text())
    assert rec.pop("time") > 0 and rec.pop("host")  # when and where: the summary orders and names by them
    assert rec == {"rank": 2, "error": error, "status": status}


def test_record_never_shows_hpcdist_run_a_half_written_status(tmp_path, monkeypatch):
    """`hpcdist run` polls for ``rank-*.json``: the status is written under another name, then renamed."""
    from pathlib import Path

    seen_while_writing: list[list[str]] = []
    real = Path.write_text

    def write_text(self, data, *args, **kwargs):
        real(self, data[: len(data) // 2], *args, **kwargs)  # half written: what a poller may meet
        seen_while_writing.append([p.name for p in tmp_path.glob("rank-*.json")])  # run.py's _failures glob
        return real(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", write_text)
    _record(str(tmp_path), 4, RuntimeError("boom"))
    monkeypatch.undo()
    assert seen_while_writing == [[]]
    [rec] = runmod._failures(str(tmp_path))
    assert {k: rec[k] for k in ("rank", "error", "status")} == {"rank": 4, "error": "RuntimeError: boom", "status": 1}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["rank-4.json"]


@pytest.mark.parametrize(("recorded", "want"), [({"status": 3}, 3), ({"status": 300}, 1), ({}, 1)])
def test_failed_status_is_the_ranks(tmp_path, recorded, want):
    (tmp_path / "rank-1.json").write_text(json.dumps({"rank": 1, "error": "x", **recorded}))
    assert runmod._failed_status(str(tmp_path)) == want
