"""Defects found in the flight recorder's ring and the dump analyzer (adversarial round); each failed before."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from hpcdist import flight
from hpcdist.debug_analyze import load_dumps, main
from hpcdist.flight import END, Ring

# ------------------------------------------------------------------ the ring: memory follows the calls, not the knob


@pytest.mark.parametrize("size", ["1000000000000", "99999999999999999999"])
def test_a_huge_ring_size_allocates_nothing_up_front(monkeypatch, size):
    """HPCDIST_FLIGHT_RECORDER=10**12 made every group allocate 8 TB (MemoryError at init); 10**20 OverflowError."""
    monkeypatch.setenv("HPCDIST_FLIGHT_RECORDER", size)
    ring = flight.new_ring()
    assert ring is not None and ring.cap == int(size)
    for i in range(5):
        ring.coll("all_reduce", "float32", i, -1)[END] = True
    ring.p2p("send", "float32", 1, 0)
    assert [e["seq"] for e in ring.snapshot([0]) if not e["p2p"]] == [1, 2, 3, 4, 5]


def test_a_ring_of_one_keeps_the_newest():
    ring = Ring(1)
    for i in range(3):
        ring.coll("all_reduce", "float32", i, -1)
        ring.p2p("send", "float32", i, 0)
    assert [(e["seq"], e["p2p"]) for e in ring.snapshot([0])] == [(3, False), (3, True)]


def test_a_wrapped_ring_overwrites_the_oldest_entry():
    ring = Ring(3)
    for i in range(7):
        ring.coll("all_reduce", "float32", i, -1)
    assert sorted(e["seq"] for e in ring.snapshot([0])) == [5, 6, 7]


# ------------------------------------------------------------------ the analyzer on damaged and mixed dumps


def _dump(who: int, world: int = 2, **changes) -> dict:
    entry = {"seq": 1, "p2p": False, "op": "all_reduce", "dtype": "float32", "count": 4, "state": "started"}
    group = {"name": "default_pg", "ranks": list(range(world)), "collectives": 1, "p2p_ops": 0, "capacity": 10}
    data = {"version": 1, "rank": who, "world_size": world, "job": "", "time": 100.0, "reason": "timeout: x"}
    data["groups"] = [{**group, "entries": [{**entry, "started_at": 99.0, "root": None}]}]
    data["stacks"] = {}
    data.update(changes)
    return data


_GROUP = _dump(0)["groups"][0]
_DAMAGED: dict[str, tuple[dict[str, Any], str]] = {
    "rank null": ({"rank": None}, "'rank' is None"),
    "groups null": ({"groups": None}, "'groups' is None, expected list"),
    "groups an object": ({"groups": {"a": 1}}, "'groups' is {'a': 1}"),
    "group without entries": ({"groups": [{"name": "g", "ranks": [0, 1]}]}, "groups[0]: 'collectives' is None"),
    "entry without seq": ({"groups": [{**_GROUP, "entries": [{"op": "x"}]}]}, "groups[0].entries[0]: 'seq' is None"),
    "entry a number": ({"groups": [{**_GROUP, "entries": [3]}]}, "groups[0].entries[0] is 3"),
    "time a string": ({"time": "late"}, "'time' is 'late'"),
    "stacks a list": ({"stacks": ["a"]}, "'stacks' is ['a']"),
    "rank beyond world": ({"rank": 5}, "'rank' is 5, expected an int below world_size 2"),
    "huge world": ({"world_size": 10**12}, "'world_size' is 1000000000000"),  # it allocated range(10**12): hung
}


@pytest.mark.timeout(30)
@pytest.mark.parametrize("case", list(_DAMAGED))
def test_a_damaged_dump_is_named_not_a_traceback(tmp_path: Path, capsys, case):
    changes, said = _DAMAGED[case]
    (tmp_path / "rank-0.json").write_text(json.dumps(_dump(0, **changes)))
    (tmp_path / "rank-1.json").write_text(json.dumps(_dump(1)))
    with pytest.raises(ValueError, match=r"rank-0\.json: not a readable flight recorder dump") as info:
        load_dumps(str(tmp_path))
    assert said in str(info.value)
    assert main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("hpcdist debug analyze: ") and said in err and "Traceback" not in err


def test_dumps_of_jobs_of_different_sizes_are_refused(tmp_path: Path, capsys):
    """A stale rank-2.json of an earlier 4-rank run beside a 2-rank run's files: analysed as one job before."""
    for r in (0, 1):
        (tmp_path / f"rank-{r}.json").write_text(json.dumps(_dump(r)))
    for r in (2, 3):
        (tmp_path / f"rank-{r}.json").write_text(json.dumps(_dump(r, world=4)))
    assert main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "come from different jobs" in err and "world size 4: rank-2.json, rank-3.json" in err


def test_dumps_of_two_runs_of_one_size_are_refused(tmp_path: Path, capsys):
    """Equal world sizes: a later run replaced rank-0.json and left rank-1.json of the earlier one."""
    (tmp_path / "rank-0.json").write_text(json.dumps(_dump(0, run="00000000000000bb")))
    (tmp_path / "rank-1.json").write_text(json.dumps(_dump(1, run="00000000000000aa")))
    assert main(["analyze", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "come from different runs" in err, err
    assert "run 00000000000000aa: rank-1.json; run 00000000000000bb: rank-0.json" in err, err
    (tmp_path / "rank-1.json").write_text(json.dumps(_dump(1, run="00000000000000bb")))
    assert sorted(load_dumps(str(tmp_path))) == [0, 1]
    (tmp_path / "rank-1.json").write_text(json.dumps(_dump(1)))  # a dump without a run id (an older hpcdist)
    assert sorted(load_dumps(str(tmp_path))) == [0, 1]


def test_a_dump_without_process_group_is_still_read(tmp_path: Path):
    (tmp_path / "rank-0.json").write_text(json.dumps(_dump(0)))
    (tmp_path / "rank-pid42.json").write_text(json.dumps(_dump(-1, world=-1, groups=[])))
    (tmp_path / "rank-pid43.json").write_text(json.dumps(_dump(-1, world=-1, groups=[])))
    assert sorted(load_dumps(str(tmp_path))) == [-3, -2, 0]
