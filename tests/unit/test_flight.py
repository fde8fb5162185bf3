"""The flight recorder's ring and dump (no MPI), and ``hpcdist debug analyze`` on synthetic dumps.

The analyzer's decisions are checked against dumps built by hand, where the
right answer (which rank diverged, at which sequence number, how) is known
by construction; tests/integration/test_fault_suite.py runs it on the dumps
of real hung jobs.
"""

from __future__ import annotations

import json
import os

import pytest

from hpcdist import config, flight
from hpcdist.debug_analyze import analyze, format_report, load_dumps, main
from hpcdist.flight import END, Ring, attach
from hpcdist.work import Work

# ------------------------------------------------------------------ the ring


def test_ring_keeps_the_last_entries_in_order_with_separate_sequences():
    ring = Ring(4)
    for i in range(6):
        ring.coll("all_reduce", "float32", i, -1)[END] = True
    ring.p2p("send", "float64", 3, 1)
    snap = ring.snapshot([10, 11, 12])
    colls = [e for e in snap if not e["p2p"]]
    assert [e["seq"] for e in colls] == [3, 4, 5, 6]  # the 4 newest of 6
    assert [e["count"] for e in colls] == [2, 3, 4, 5]
    assert all(e["state"] == "completed" and e["root"] is None for e in colls)
    (p2p,) = [e for e in snap if e["p2p"]]
    assert p2p["seq"] == 1 and p2p["peer"] == 11 and p2p["state"] == "started"  # group rank 1 -> global 11
    assert ring.n_coll == 6 and ring.n_p2p == 1


def test_ring_root_and_any_source_are_named():
    ring = Ring(8)
    ring.coll("broadcast", "int64", 4, 2)
    ring.p2p("irecv", "int64", 4, -2)  # MPI.ANY_SOURCE is negative
    snap = ring.snapshot([5, 6, 7])
    assert snap[0]["root"] == 7 and snap[0]["state"] == "started"
    assert snap[1]["peer"] == "any"


def test_async_entries_follow_their_work():
    ring = Ring(8)
    pending = Work((), None, None, 1.0, "all_reduce")
    done = Work((), None, None, 1.0, "all_reduce")
    failed = Work((), None, None, 1.0, "all_reduce")
    attach(ring.coll("all_reduce", "float32", 1, -1), pending)
    attach(ring.coll("all_reduce", "float32", 1, -1), done)
    attach(ring.coll("all_reduce", "float32", 1, -1), failed)
    attach(ring.coll("all_reduce", "float32", 1, -1), Work((), None, None, 1.0, "x"))  # dropped at once
    done._finish()
    failed._exc = RuntimeError("boom")
    states = [e["state"] for e in ring.snapshot([0])]
    assert states == ["started", "completed", "failed", "unknown"]
    assert all(e["async"] for e in ring.snapshot([0]))


def test_ring_size_knob(monkeypatch):
    monkeypatch.setenv("HPCDIST_FLIGHT_RECORDER", "0")
    assert flight.new_ring() is None
    monkeypatch.setenv("HPCDIST_FLIGHT_RECORDER", "16")
    ring = flight.new_ring()
    assert ring is not None and ring.cap == 16
    monkeypatch.delenv("HPCDIST_FLIGHT_RECORDER")
    assert config.flight_recorder_size() == config.DEFAULT_FLIGHT_ENTRIES
    for bad in ("many", "-1"):
        monkeypatch.setenv("HPCDIST_FLIGHT_RECORDER", bad)
        with pytest.raises(ValueError, match="HPCDIST_FLIGHT_RECORDER"):
            config.flight_recorder_size()


def test_dump_writes_a_json_file_that_names_its_reason(tmp_path, monkeypatch):
    monkeypatch.setitem(flight._STATE, "dir", str(tmp_path / "fr"))
    path = flight.dump_flight_recorder("checking the layout")
    assert path is not None and os.path.dirname(path) == str(tmp_path / "fr")
    with open(path) as f:
        data = json.load(f)
    assert data["version"] == flight.FORMAT_VERSION and data["reason"] == "checking the layout"
    assert data["pid"] == os.getpid() and isinstance(data["groups"], list)
    assert any("test_dump_writes_a_json_file" in s for s in data["stacks"].values())


def test_dump_never_raises(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setitem(flight._STATE, "dir", str(blocker / "sub"))
    assert flight.dump("x") is None


# ------------------------------------------------------------------ the analyzer on synthetic dumps


def _entry(seq, op="all_reduce", dtype="float32", count=8, root=None, state="completed", t=100.0, p2p=False, peer=None):
    e = {"seq": seq, "p2p": p2p, "op": op, "dtype": dtype, "count": count, "state": state, "started_at": t}
    e["completed_at"], e["async"] = None, False
    if p2p:
        e["peer"] = peer
    else:
        e["root"] = root
    return e


def _dump(rank, world, groups, stack="", cap=2000, t=200.0):
    gs = []
    for name, (ranks, entries) in groups.items():
        colls = [e["seq"] for e in entries if not e["p2p"]]
        p2ps = [e["seq"] for e in entries if e["p2p"]]
        gs.append(
            {
                "name": name,
                "desc": name,
                "ranks": ranks,
                "rank": ranks.index(rank),
                "size": len(ranks),
                "backend": "mpi",
                "timeout_s": 5.0,
                "collectives": max(colls, default=0),
                "p2p_ops": max(p2ps, default=0),
                "capacity": cap,
                "entries": entries,
            }
        )
    return {
        "version": 1,
        "rank": rank,
        "world_size": world,
        "job": "42",
        "time": t,
        "reason": f"timeout on rank {rank}",
        "groups": gs,
        "stacks": {"MainThread": stack},
    }


def _same(n):
    return [_entry(s, t=100.0 + s) for s in range(1, n + 1)]


def test_no_divergence_when_every_rank_completed_the_same_calls():
    dumps = {r: _dump(r, 3, {"default_pg": ([0, 1, 2], _same(5))}) for r in range(3)}
    rep = analyze(dumps)
    assert rep.divergences == [] and rep.no_dump == [] and rep.p2p == []
    assert "no divergence" in format_report(rep)


def test_a_rank_that_never_entered_is_named_with_what_it_was_doing():
    stuck = [*_same(4), _entry(5, state="started", t=150.0)]
    stack = '  File "train.py", line 42, in <module>\n    time.sleep(600)\n'
    dumps = {r: _dump(r, 3, {"default_pg": ([0, 1, 2], stuck)}) for r in (0, 2)}
    dumps[1] = _dump(1, 3, {"default_pg": ([0, 1, 2], _same(4))}, stack=stack)
    rep = analyze(dumps)
    (div,) = rep.divergences
    assert (div.group, div.seq, div.kind, div.missing) == ("default_pg", 5, "missing", [1])
    assert sorted(div.calls) == [0, 2]
    assert "train.py" in rep.doing[1] and "time.sleep(600)" in rep.doing[1]
    text = format_report(rep)
    assert "collective #5" in text and "rank(s) 1 never entered it" in text and "rank(s) 0, 2 entered" in text


def test_a_missing_rank_blocked_in_another_operation_shows_it():
    stuck = [*_same(2), _entry(3, state="started", t=150.0)]
    other = [*_same(2), _entry(1, op="recv", p2p=True, peer=0, state="started", t=140.0)]
    dumps = {0: _dump(0, 2, {"default_pg": ([0, 1], stuck)}), 1: _dump(1, 2, {"default_pg": ([0, 1], other)})}
    rep = analyze(dumps)
    assert rep.divergences[0].missing == [1]
    assert "recv" in rep.doing[1] and "peer 0" in rep.doing[1] and "60.0s" in rep.doing[1]


@pytest.mark.parametrize(
    ("theirs", "shown"),
    [
        (_entry(3, op="broadcast", root=0, state="started"), "broadcast(float32, count 8, root 0)"),
        (_entry(3, dtype="float64", state="started"), "all_reduce(float64, count 8)"),
        (_entry(3, count=16, state="started"), "all_reduce(float32, count 16)"),
    ],
)
def test_a_rank_that_entered_another_call_is_a_mismatch(theirs, shown):
    mine = [*_same(2), _entry(3, state="started")]
    dumps = {r: _dump(r, 3, {"default_pg": ([0, 1, 2], mine)}) for r in (0, 1)}
    dumps[2] = _dump(2, 3, {"default_pg": ([0, 1, 2], [*_same(2), theirs])})
    rep = analyze(dumps)
    (div,) = rep.divergences
    assert (div.seq, div.kind, div.missing) == (3, "mismatch", [])
    text = format_report(rep)
    assert f"rank(s) 2: {shown}" in text and "rank(s) 0, 1: all_reduce(float32, count 8)" in text


def test_a_rank_without_dump_is_the_suspect():
    stuck = [*_same(6), _entry(7, state="started")]
    dumps = {r: _dump(r, 3, {"default_pg": ([0, 1, 2], stuck)}) for r in (0, 1)}
    rep = analyze(dumps)
    assert rep.no_dump == [2]
    (div,) = rep.divergences
    assert (div.seq, div.kind, div.no_dump) == (7, "stuck", [2])
    assert "rank(s) 2 left no dump" in format_report(rep)


def test_wrapped_rings_are_compared_where_both_still_hold_entries():
    a = [_entry(s) for s in range(50, 61)]  # rank 0 holds 50..60, entered 60
    b = [_entry(s) for s in range(40, 56)]  # rank 1 holds 40..55, entered 55
    dumps = {0: _dump(0, 2, {"g": ([0, 1], a)}, cap=11), 1: _dump(1, 2, {"g": ([0, 1], b)}, cap=16)}
    rep = analyze(dumps)
    (div,) = rep.divergences
    assert (div.seq, div.kind, div.missing) == (56, "missing", [1])


def test_the_divergence_that_started_first_comes_first():
    late = {"late": ([0, 1], [_entry(1, t=500.0, state="started")])}
    early = {"early": ([0, 1], [_entry(1, t=100.0, state="started")])}
    dumps = {
        0: _dump(0, 2, {**late, **early}),
        1: _dump(1, 2, {"late": ([0, 1], []), "early": ([0, 1], [])}),
    }
    rep = analyze(dumps)
    assert [d.group for d in rep.divergences] == ["early", "late"]
    assert format_report(rep).index("FIRST DIVERGENCE: group 'early'") >= 0


def test_a_receive_whose_sender_sent_less_names_the_sender():
    recvs = [
        _entry(1, op="recv", p2p=True, peer=1, t=100.0),
        _entry(2, op="recv", p2p=True, peer=1, state="started", t=110.0),
    ]
    sends = [_entry(1, op="send", p2p=True, peer=0, t=100.0)]
    dumps = {0: _dump(0, 2, {"g": ([0, 1], recvs)}), 1: _dump(1, 2, {"g": ([0, 1], sends)})}
    rep = analyze(dumps)
    (finding,) = rep.p2p
    assert finding.startswith("rank 0 waits in recv") and "rank 1 sent it 1 message(s)" in finding
    assert "posted 2 receive(s)" in finding


def test_load_and_main(tmp_path, capsys):
    assert main(["analyze", str(tmp_path)]) == 2
    assert "no flight recorder dumps" in capsys.readouterr().err
    stuck = [*_same(1), _entry(2, state="started")]
    for r in (0, 1):
        (tmp_path / f"rank-{r}.json").write_text(json.dumps(_dump(r, 3, {"default_pg": ([0, 1, 2], stuck)})))
    (tmp_path / "unrelated.txt").write_text("ignored")
    assert sorted(load_dumps(str(tmp_path))) == [0, 1]
    assert main(["analyze", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "dumps of 2 of 3 ranks (job 42)" in out and "collective #2" in out
    assert main(["analyze", "--json", str(tmp_path)]) == 0
    assert json.loads(capsys.readouterr().out)["no_dump"] == [2]
    (tmp_path / "rank-2.json").write_text("{not json")
    assert main(["analyze", str(tmp_path)]) == 2
    assert "rank-2.json: not a readable flight recorder dump" in capsys.readouterr().err


_SIGNAL_PROBE = """
import os, signal, sys, time
os.environ["HPCDIST_FLIGHT_DIR"] = sys.argv[1]
from hpcdist import flight

mode = sys.argv[2]
if mode == "own":
    signal.signal(signal.SIGUSR2, lambda *_: print("OWN HANDLER", flush=True))
elif mode == "wakeup":  # the program (say asyncio) has a wakeup fd: hpcdist keeps it
    r, w = os.pipe()
    os.set_blocking(w, False)
    signal.set_wakeup_fd(w)
flight.install()
if mode == "replaced":  # the program (say asyncio) sets its own wakeup fd after init
    r2, w2 = os.pipe()
    os.set_blocking(w2, False)
    signal.set_wakeup_fd(w2)
os.kill(os.getpid(), signal.SIGUSR2)
for _ in range(100):
    time.sleep(0.02)
ours = signal.getsignal(signal.SIGUSR2) is flight._on_sigusr2
kept = signal.set_wakeup_fd(-1) == w if mode == "wakeup" else True
print("OURS", ours, "READER", flight._STATE["reader"] is not None, "KEPT", kept, flush=True)
"""


@pytest.mark.parametrize(
    ("mode", "ours", "reader", "dumped"),
    [
        ("none", True, True, True),
        ("own", False, False, False),
        ("wakeup", True, False, True),
        ("replaced", True, True, True),
    ],
)
def test_sigusr2_handler_only_where_the_program_has_none(tmp_path, mode, ours, reader, dumped):
    import subprocess
    import sys

    out = subprocess.run(
        [sys.executable, "-c", _SIGNAL_PROBE, str(tmp_path / "fr"), mode],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "HPCDIST_FLIGHT_RECORDER": "8"},
    )
    assert out.returncode == 0, out.stderr
    assert f"OURS {ours} READER {reader} KEPT True" in out.stdout, out.stdout
    files = list((tmp_path / "fr").glob("rank-*.json")) if (tmp_path / "fr").exists() else []
    assert bool(files) == dumped, (files, out.stderr)
    if dumped:
        with open(files[0]) as f:
            assert json.load(f)["reason"] == "SIGUSR2"
    assert ("OWN HANDLER" in out.stdout) == (mode == "own")


def test_a_rank_that_aborted_is_shown_with_its_exception():
    stuck = [*_same(1), _entry(2, state="started")]
    dumps = {r: _dump(r, 2, {"default_pg": ([0, 1], stuck if r == 0 else _same(1))}) for r in (0, 1)}
    dumps[1]["reason"] = (
        "abort: [rank 1] Traceback (most recent call last):\n"
        '[rank 1]   File "job.py", line 7, in <module>\n'
        '[rank 1]     raise KeyError("lr")\n'
        "[rank 1] KeyError: 'lr'\n"
        "[rank 1] hpcdist: unhandled exception; aborting the MPI job so the other ranks do not hang\n"
    )
    rep = analyze(dumps)
    assert rep.divergences[0].missing == [1]
    assert rep.doing[1] == "aborting: KeyError: 'lr'"
