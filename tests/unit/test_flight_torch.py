"""hpcdist's flight recorder dumps in torch's format (``hpcdist.flight_torch``), on dumps written by hand.

Each field of the export is checked against the hpcdist entry it comes from,
and torch's own parser (``Op``, ``build_groups_memberships``) reads every
exported entry where torch is installed; tests/integration/test_flight_torch.py
runs torch's whole analyzer on the dumps of real jobs.
"""

from __future__ import annotations

import json
import os
import pickle

import pytest

from hpcdist.debug_analyze import main
from hpcdist.flight_torch import PREFIX, TORCH_VERSION, export, to_torch, traps

HPCDIST = os.path.dirname(os.path.abspath(__import__("hpcdist").__file__))


def _entry(seq, op="all_reduce", t=100.0, dtype="float32", count=8, state="completed", p2p=False, **extra):
    e = {"seq": seq, "p2p": p2p, "op": op, "dtype": dtype, "count": count, "state": state, "started_at": t}
    e.update({"completed_at": None, "async": False}, **extra)
    if p2p:
        e.setdefault("peer", 0)
    else:
        e.setdefault("root", None)
    return e


def _group(name, ranks, entries, desc=None, cap=2000, collectives=None, p2p_ops=None, backend="mpi"):
    return {
        "name": name,
        "desc": desc or name,
        "ranks": ranks,
        "rank": 0,
        "size": len(ranks),
        "backend": backend,
        "timeout_s": 5.0,
        "collectives": max([e["seq"] for e in entries if not e["p2p"]], default=0)
        if collectives is None
        else collectives,
        "p2p_ops": max([e["seq"] for e in entries if e["p2p"]], default=0) if p2p_ops is None else p2p_ops,
        "capacity": cap,
        "entries": entries,
    }


def _dump(rank, world, groups, stack=""):
    return {
        "version": 1,
        "hpcdist": "0.1.0",
        "rank": rank,
        "world_size": world,
        "job": "",
        "run": "r1",
        "time": 200.0,
        "reason": "test",
        "groups": groups,
        "stacks": {"MainThread": stack},
    }


def _by_name(data):
    return {e["profiling_name"]: e for e in data["entries"]}


# ------------------------------------------------------------------ one dump


def test_the_header_groups_and_status():
    world = _group("default_pg", [0, 1, 2], [_entry(1), _entry(2, t=101.0, state="started")])
    sub = _group("7", [2, 0], [], desc="undefined")
    data, left_out = to_torch(_dump(0, 3, [world, sub]))
    assert left_out == []
    assert data["version"] == TORCH_VERSION == "2.10" and data["comm_lib_version"] == "hpcdist 0.1.0"
    assert data["pg_config"] == {
        "default_pg": {"name": "default_pg", "desc": "default_pg", "ranks": "[0, 1, 2]"},
        "7": {"name": "7", "desc": "undefined", "ranks": "[2, 0]"},
    }
    assert data["pg_status"]["default_pg"] == {
        "last_enqueued_collective": 2,
        "last_started_collective": 2,
        "last_completed_collective": 1,
    }
    assert data["pg_status"]["7"]["last_completed_collective"] == -1


def test_entry_fields_follow_the_hpcdist_entry():
    e = _entry(3, "all_reduce", t=100.5, dtype="float32", count=8, state="completed")
    data, _ = to_torch(_dump(1, 2, [_group("default_pg", [0, 1], [e])]))
    (t,) = data["entries"]
    assert t["record_id"] == 0 and t["pg_id"] == 0 and t["process_group"] == ("default_pg", "default_pg")
    assert (t["collective_seq_id"], t["p2p_seq_id"], t["op_id"]) == (3, 0, 3)
    assert t["profiling_name"] == "nccl:all_reduce"  # torch's analyzer refuses an "mpi:" backend
    assert t["time_created_ns"] == t["time_discovered_started_ns"] == 100_500_000_000
    assert t["time_discovered_completed_ns"] is None  # a blocking call records no completion time
    assert (t["input_sizes"], t["output_sizes"]) == ([[8]], [[8]])
    assert (t["input_dtypes"], t["output_dtypes"]) == (["Float"], ["Float"])
    assert (t["state"], t["retired"], t["timeout_ms"], t["is_p2p"], t["frames"]) == ("completed", True, 5000, False, [])


def test_sizes_are_counts_gathered_and_scattered_over_the_group():
    entries = [
        _entry(1, "all_gather_into", count=4),
        _entry(2, "reduce_scatter_tensor", t=101.0, count=4),
        _entry(3, "all_gather", t=102.0, count=4),
        _entry(4, "reduce_scatter", t=103.0, count=4),
        _entry(5, "gather", t=104.0, count=4, root=0),
        _entry(6, "scatter", t=105.0, count=4, root=2),
        _entry(7, "all_to_all_single", t=106.0, count=6),
        _entry(8, "barrier", t=107.0, dtype=None, count=0),
        _entry(9, "broadcast_object_list", t=108.0, dtype=None, count=0, root=0),
    ]
    data, _ = to_torch(_dump(0, 3, [_group("default_pg", [0, 1, 2], entries)]))
    got = [(e["profiling_name"], e["input_sizes"], e["output_sizes"], e["input_dtypes"]) for e in data["entries"]]
    assert got == [
        ("nccl:_all_gather_base", [[4]], [[12]], ["Float"]),
        ("nccl:_reduce_scatter_base", [[12]], [[4]], ["Float"]),
        ("nccl:all_gather", [[4]], [[12]], ["Float"]),
        ("nccl:reduce_scatter", [[12]], [[4]], ["Float"]),
        ("nccl:gather", [[4]], [[12]], ["Float"]),  # rank 0 is gather's root
        ("nccl:scatter", [], [[4]], []),  # rank 2 is scatter's root: nothing scattered from here
        ("nccl:all_to_all", [[6]], [[6]], ["Float"]),
        ("nccl:barrier", [[0]], [[0]], []),
        ("nccl:broadcast", [[0]], [[0]], []),
    ]


@pytest.mark.parametrize(
    ("dtype", "torch_name"),
    [("float64", "Double"), ("torch.bfloat16", "BFloat16"), ("int64", "Long"), ("uint8", "Byte"), ("odd", "odd")],
)
def test_dtypes_take_torch_scalar_type_names(dtype, torch_name):
    data, _ = to_torch(_dump(0, 1, [_group("default_pg", [0], [_entry(1, dtype=dtype)])]))
    assert data["entries"][0]["input_dtypes"] == [torch_name]


@pytest.mark.parametrize(
    ("state", "torch_state", "discovered"),
    [
        ("started", "started", True),
        ("completed", "completed", True),
        ("failed", "started", True),
        ("unknown", "scheduled", False),
    ],
)
def test_states_map_to_torch_states(state, torch_state, discovered):
    data, _ = to_torch(_dump(0, 1, [_group("default_pg", [0], [_entry(1, state=state, **{"async": True})])]))
    t = data["entries"][0]
    assert t["state"] == torch_state and (t["time_discovered_started_ns"] is not None) == discovered
    assert t["retired"] == (torch_state == "completed")


def test_object_operations_keep_their_completion_time():
    e = _entry(1, "all_gather_object", dtype=None, count=0, completed_at=100.25)
    data, _ = to_torch(_dump(0, 2, [_group("default_pg", [0, 1], [e])]))
    t = data["entries"][0]
    assert t["profiling_name"] == "nccl:all_gather" and t["time_discovered_completed_ns"] == 100_250_000_000


def test_entries_of_all_groups_in_start_order_with_both_counters():
    world = [_entry(1, t=1.0), _entry(2, t=4.0)]
    pair = [
        _entry(1, "all_reduce", t=2.0),
        _entry(1, "send", t=3.0, p2p=True, peer=5),
        _entry(2, "all_reduce", t=5.0),
    ]
    data, _ = to_torch(_dump(3, 6, [_group("default_pg", list(range(6)), world), _group("1", [3, 5], pair)]))
    got = [
        (t["record_id"], t["pg_id"], t["collective_seq_id"], t["p2p_seq_id"], t["op_id"], t["profiling_name"])
        for t in data["entries"]
    ]
    assert got == [
        (0, 0, 1, 0, 1, "nccl:all_reduce"),
        (1, 1, 1, 0, 1, "nccl:all_reduce"),
        (2, 1, 1, 1, 2, "nccl:send 0->1"),  # group ranks: 3 is 0, 5 is 1
        (3, 0, 2, 0, 2, "nccl:all_reduce"),
        (4, 1, 2, 1, 3, "nccl:all_reduce"),
    ]
    assert data["entries"][2]["is_p2p"] and data["entries"][2]["input_sizes"] == [[8]]


def test_record_ids_count_the_entries_the_rings_overwrote():
    entries = [_entry(s, t=float(s)) for s in (5, 6)]  # a ring of 2 that recorded 6 collectives
    data, _ = to_torch(_dump(0, 1, [_group("default_pg", [0], entries, cap=2)]))
    assert [t["record_id"] for t in data["entries"]] == [4, 5]
    assert [t["p2p_seq_id"] for t in data["entries"]] == [0, 0]


def test_point_to_point_names_use_sorted_group_ranks():
    """torch's Op maps group ranks to global ones through the sorted ranks: a group [7, 2, 4] has 2 as 0."""
    entries = [
        _entry(1, "isend", t=1.0, p2p=True, peer=2),
        _entry(2, "recv", t=2.0, p2p=True, peer=4),
        _entry(3, "recv_object_list", t=3.0, p2p=True, peer=2, dtype=None, count=0),
    ]
    data, _ = to_torch(_dump(7, 8, [_group("g", [7, 2, 4], entries)]))
    assert [t["profiling_name"] for t in data["entries"]] == ["nccl:send 2->0", "nccl:recv 2<-1", "nccl:recv 2<-0"]


def test_receives_from_any_source_and_unknown_operations_are_left_out_and_said():
    entries = [
        _entry(1, "recv", t=1.0, p2p=True, peer="any"),
        _entry(1, "monitored_barrier", t=2.0),
        _entry(2, "all_reduce", t=3.0),
    ]
    data, left_out = to_torch(_dump(0, 2, [_group("default_pg", [0, 1], entries)]))
    assert [t["profiling_name"] for t in data["entries"]] == ["nccl:all_reduce"]
    assert data["entries"][0]["collective_seq_id"] == 2 and data["entries"][0]["p2p_seq_id"] == 1
    assert left_out == [
        "recv (p2p #1 on group 'default_pg'): a receive from any source (torch's recv needs its peer)",
        "monitored_barrier (collective #1 on group 'default_pg'): an operation torch's analyzer does not know",
    ]


def test_p2p_false_leaves_point_to_point_out():
    entries = [_entry(1, t=1.0), _entry(1, "send", t=2.0, p2p=True, peer=1)]
    dump = _dump(0, 2, [_group("default_pg", [0, 1], entries)])
    assert len(to_torch(dump)[0]["entries"]) == 2
    assert [t["profiling_name"] for t in to_torch(dump, p2p=False)[0]["entries"]] == ["nccl:all_reduce"]


def test_gloo_groups_keep_their_backend():
    data, _ = to_torch(_dump(0, 1, [_group("default_pg", [0], [_entry(1)], backend="gloo")]))
    assert data["entries"][0]["profiling_name"] == "gloo:all_reduce"


# ------------------------------------------------------------------ frames


def _stack(*frames):
    return "".join(f'  File "{f}", line {n}, in {fn}\n    code()\n' for f, n, fn in frames)


def test_the_main_thread_stack_goes_to_the_newest_blocking_call_in_flight():
    stack = _stack(("/home/me/train.py", 9, "<module>"), (os.path.join(HPCDIST, "collectives.py"), 254, "all_reduce"))
    entries = [
        _entry(1, t=1.0, state="started"),
        _entry(2, t=2.0, state="started"),
        _entry(3, t=3.0, **{"async": True}),
    ]
    entries[2]["state"] = "started"  # async: its Work is pending, the main thread is elsewhere
    data, _ = to_torch(_dump(0, 2, [_group("default_pg", [0, 1], entries)], stack=stack))
    assert [t["frames"] for t in data["entries"]] == [
        [],
        [
            {"name": "all_reduce", "filename": os.path.join(HPCDIST, "collectives.py"), "line": "254"},
            {"name": "<module>", "filename": "/home/me/train.py", "line": "9"},
        ],
        [],
    ]


def test_a_main_thread_outside_hpcdist_gives_no_frames():
    stack = _stack(("/home/me/train.py", 12, "<module>"))
    data, _ = to_torch(_dump(0, 2, [_group("default_pg", [0, 1], [_entry(1, state="started")])], stack=stack))
    assert data["entries"][0]["frames"] == []


# ------------------------------------------------------------------ where torch's analyzer stops


def test_traps_name_a_collective_and_a_p2p_op_sharing_a_number():
    entries = [
        _entry(1, t=1.0),
        _entry(1, "send", t=2.0, p2p=True, peer=1),
        _entry(2, t=3.0),
        _entry(3, t=4.0),
        _entry(2, "send", t=5.0, p2p=True, peer=1),
    ]
    assert traps(_dump(0, 2, [_group("default_pg", [0, 1], entries)])) == [
        "rank 0, group 'default_pg': collective #1 (all_reduce) then p2p #1 (send)"
    ]


# ------------------------------------------------------------------ torch reads it


def test_torch_parses_every_exported_entry():
    types = pytest.importorskip("torch.distributed.flight_recorder.components.types")
    builder = pytest.importorskip("torch.distributed.flight_recorder.components.builder")
    entries = [
        _entry(1, "all_reduce", t=1.0),
        _entry(2, "broadcast", t=2.0, root=4),
        _entry(1, "isend", t=3.0, p2p=True, peer=2),
        _entry(2, "recv", t=4.0, p2p=True, peer=7),
        _entry(3, "all_to_all", t=5.0),
        _entry(4, "scatter_object_list", t=6.0, dtype=None, count=0, root=4),
        _entry(5, "barrier", t=7.0, dtype=None, count=0),
        _entry(6, "all_reduce_coalesced", t=8.0, count=24),
    ]
    data, _ = to_torch(_dump(4, 8, [_group("g", [7, 2, 4], entries)]))
    _, _, _, memberships, pg_guids = builder.build_groups_memberships({4: data["pg_config"]})
    guid = pg_guids[("g", 4)]
    ops = [types.Op(t, memberships, guid) for t in data["entries"]]
    assert [o.type for o in ops] == [
        "all_reduce",
        "broadcast",
        "send",
        "recv",
        "all_to_all",
        "scatter",
        "barrier",
        "allreduce_coalesced",
    ]
    assert (ops[2]._src_g, ops[2]._dst_g) == (4, 2) and (ops[3]._src_g, ops[3]._dst_g) == (7, 4)
    assert ops[0].match(ops[0]).state.name == "FULLY_MATCHED"


# ------------------------------------------------------------------ export and the command line


def _write(directory, dumps):
    directory.mkdir(exist_ok=True)
    for d in dumps:
        (directory / f"rank-{d['rank']}.json").write_text(json.dumps(d))


def _two_ranks():
    return [_dump(r, 2, [_group("default_pg", [0, 1], [_entry(1), _entry(2, t=101.0)])]) for r in (0, 1)]


def test_export_writes_one_pickle_per_rank(tmp_path):
    _write(tmp_path / "flight", _two_ranks())
    done = export(str(tmp_path / "flight"), str(tmp_path / "out"))
    assert sorted(os.listdir(tmp_path / "out")) == [f"{PREFIX}0", f"{PREFIX}1"]
    assert done.paths == [str(tmp_path / "out" / f"{PREFIX}{r}") for r in (0, 1)] and done.left_out == []
    with open(done.paths[1], "rb") as f:
        data = pickle.load(f)
    assert data["version"] == "2.10" and [t["collective_seq_id"] for t in data["entries"]] == [1, 2]


def test_the_command_line_exports_and_says_how_to_read_it(tmp_path, capsys):
    _write(tmp_path / "flight", _two_ranks())
    (tmp_path / "out").mkdir()  # an empty directory is fine
    assert main(["export-torch", str(tmp_path / "flight"), str(tmp_path / "out")]) == 0
    out = capsys.readouterr().out
    assert f"wrote 2 file(s) in torch's flight recorder format to {tmp_path / 'out'}" in out
    assert f"python -m torch.distributed.flight_recorder.fr_trace {tmp_path / 'out'}" in out


def test_the_command_line_warns_where_torch_will_stop_and_no_p2p_avoids_it(tmp_path, capsys):
    entries = [_entry(1, t=1.0), _entry(1, "send", t=2.0, p2p=True, peer=1)]
    _write(tmp_path / "flight", [_dump(r, 2, [_group("default_pg", [0, 1], entries)]) for r in (0, 1)])
    assert main(["export-torch", str(tmp_path / "flight"), str(tmp_path / "a")]) == 0
    out = capsys.readouterr().out
    assert "torch's analyzer will stop" in out and "collective #1 (all_reduce) then p2p #1 (send)" in out, out
    assert main(["export-torch", str(tmp_path / "flight"), str(tmp_path / "b"), "--no-p2p"]) == 0
    assert "will stop" not in capsys.readouterr().out


@pytest.mark.parametrize("problem", ["missing", "empty", "damaged", "out-not-empty", "out-a-file"])
def test_the_command_line_refuses_clearly(tmp_path, capsys, problem):
    flight, out = tmp_path / "flight", tmp_path / "out"
    if problem != "missing":
        flight.mkdir()
    if problem not in ("missing", "empty"):
        _write(flight, _two_ranks())
    if problem == "damaged":
        (flight / "rank-1.json").write_text('{"version": 1, "groups": [')
    if problem == "out-not-empty":
        out.mkdir()
        (out / "old").write_text("x")
    if problem == "out-a-file":
        out.write_text("x")
    assert main(["export-torch", str(flight), str(out)]) == 2
    err = capsys.readouterr().err
    expected = {
        "missing": "is not a directory",
        "empty": "no flight recorder dumps (rank-*.json)",
        "damaged": "rank-1.json: not a readable flight recorder dump",
        "out-not-empty": "is a directory that is not empty",
        "out-a-file": "is a file",
    }[problem]
    assert err.startswith("hpcdist debug export-torch: ") and expected in err, err
    if problem in ("missing", "empty", "damaged"):
        assert not out.exists()  # nothing written before the dumps were read
