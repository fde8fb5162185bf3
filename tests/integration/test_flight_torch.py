"""``hpcdist debug export-torch`` on the dumps of real jobs, read by torch's own flight recorder analyzer.

torch's analyzer (``python -m torch.distributed.flight_recorder.fr_trace``)
is the independent reference for ``hpcdist debug analyze``: each scenario
launches one real job (``mpiexec``, a hard time limit), exports its dumps and
asks both analyzers, at 2 and 3 ranks:

- ``same``: every rank runs the same collectives (two groups, a send/receive
  on the pair group), all complete, every rank dumps: no finding on either side;
- ``skip``: the last rank skips an ``all_reduce`` (the block-mode watchdog
  ends the job; every rank dumps): both name collective #7 of
  ``default_pg`` and the last rank as missing;
- ``op`` (2 ranks): rank 1 calls ``broadcast`` where rank 0 calls
  ``all_reduce`` (the watchdog ends the job); ``size`` (3 ranks): the last
  rank broadcasts 16 elements where the others broadcast 8 (the others
  complete; MPICH refuses it on the last rank, whose exception aborts the job
  after every rank dumped): both name collective #7 and split the ranks alike.

torch's analyzer runs in this process (its ``main``, with the arguments of
the command line: one torch import for the file), once with ``-o`` (its
findings as a pickled database) and once with ``-j`` (every entry); one case
runs the module as ``python -m`` does (``runpy``).
"""

from __future__ import annotations

import contextlib
import gc
import io
import json
import logging
import pickle
import runpy
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from mpirun import Result, run_mpi

from hpcdist import debug_analyze

pytestmark = pytest.mark.timeout(300)

fr_trace = pytest.importorskip("torch.distributed.flight_recorder.fr_trace")
from torch.distributed.flight_recorder.components import utils as fr_utils  # noqa: E402

SEQ = 7  # the collective where the ranks diverge: 6 before it on default_pg (see JOB)

JOB = """
import os, sys, time
from datetime import timedelta
import numpy as np
import hpcdist as dist

scenario = sys.argv[1]
dist.init_process_group("mpi", timeout=timedelta(seconds=2))
rank, size = dist.get_rank(), dist.get_world_size()
last = size - 1
pair = dist.new_group([0, 1], group_desc="pair")
x = np.ones(8, dtype=np.float32)
dist.all_reduce(x)                                   # default_pg #1
dist.broadcast(x, src=0)                             # #2
if rank < 2:
    y = np.ones(3)
    dist.all_reduce(y, group=pair)                   # pair #1
    dist.all_reduce(y, group=pair)                   # pair #2, then p2p #1 (no number shared with its neighbours)
    if rank == 0:
        dist.send(y, 1, group=pair)
    else:
        dist.recv(y, 0, group=pair)
    dist.all_reduce(y, group=pair)                   # pair #3
out = np.zeros(8 * size, dtype=np.float32)
dist.all_gather_into_tensor(out, x)                  # #3
dist.reduce_scatter_tensor(x, out)                   # #4
dist.barrier()                                       # #5
dist.all_reduce(np.arange(4))                        # #6
if scenario == "same":
    dist.all_reduce(x)                               # #7
elif scenario == "skip":
    if rank == last:
        time.sleep(30)                               # skips #7: the watchdog ends the job
    else:
        dist.all_reduce(x)
elif scenario == "op":
    if rank == last:
        dist.broadcast(x, src=0)
    else:
        dist.all_reduce(x)
elif scenario == "size":
    dist.broadcast(np.ones(16, dtype=np.float32) if rank == last else x, src=0)
dist.dump_flight_recorder()
dist.barrier()
dist.destroy_process_group()
"""

#: (scenario, ranks): one launch each, shared by the tests below
CASES = [("same", 2), ("same", 3), ("skip", 2), ("skip", 3), ("op", 2), ("size", 3)]


@dataclass
class Case:
    scenario: str
    n: int
    job: Result
    dumps: Path
    out: Path
    exported: str  # what `hpcdist debug export-torch` printed
    hpcdist: dict[str, Any]  # `hpcdist debug analyze --json`
    db: Any  # torch's database (`fr_trace -o`)
    log: str  # what torch's analyzer printed
    entries: str  # torch's `-j` output


def _cli(argv: list[str]) -> tuple[int, str]:
    """``hpcdist debug ARGV``, in this process: (exit status, stdout)."""
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        code = debug_analyze.main(argv)
    return code, buf.getvalue()


def _tabulate(rows: Any, headers: Any = None) -> str:
    """A stand-in for ``tabulate`` where it is not installed: torch 2.13's ``-j`` calls it unguarded."""
    return "\n".join("  |  ".join(map(str, row)) for row in ([headers] if headers else []) + list(rows))


def _torch(run: list[str] | Callable[[], Any]) -> str:
    """torch's analyzer, ``fr_trace.main(argv)`` (or ``run()``), in this process: what it logged."""
    logger = logging.getLogger("Flight Recorder")
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    handler.setFormatter(logging.Formatter("%(message)s"))
    logger.addHandler(handler)
    gc_was = gc.isenabled()
    try:
        with contextlib.suppress(SystemExit):  # -j ends with sys.exit(0)
            run() if callable(run) else fr_trace.main(run)
    finally:
        logger.removeHandler(handler)
        if gc_was:
            gc.enable()  # its loader disables the garbage collector for good
    return buf.getvalue()


def _launch(tmp: Path, scenario: str, n: int) -> Case:
    """Run the job of ``scenario`` on ``n`` ranks, then both analyzers on its dumps."""
    dumps = tmp / "flight"
    job = run_mpi(
        n,
        JOB,
        tmp,
        env={"HPCDIST_FLIGHT_DIR": str(dumps), "HPCDIST_WAIT": "block", "HPCDIST_SHM": "0"},
        limit=60,
        args=[scenario],
    )
    assert not job.timed_out, job.output[-3000:]
    assert (job.returncode == 0) == (scenario == "same"), job.output[-3000:]
    found = sorted(p.name for p in dumps.iterdir()) if dumps.is_dir() else []
    assert found == [f"rank-{r}.json" for r in range(n)], job.output[-3000:]
    code, text = _cli(["analyze", str(dumps), "--json"])
    assert code == 0, text
    out = tmp / "torch"
    code, exported = _cli(["export-torch", str(dumps), str(out)])
    assert code == 0, exported
    if not hasattr(fr_utils, "tabulate"):
        fr_utils.tabulate = _tabulate  # type: ignore[attr-defined]
    log = _torch([str(out), "-o", str(tmp / "db.pkl")])
    _types, db = pickle.loads((tmp / "db.pkl").read_bytes())
    entries = _torch([str(out), "-j"])
    return Case(scenario, n, job, dumps, out, exported, json.loads(text), db, log, entries)


@pytest.fixture(scope="module")
def cases(tmp_path_factory) -> Callable[[str, int], Case]:
    """``cases(scenario, n)``: that launch, run the first time a test asks for it."""
    done: dict[tuple[str, int], Case] = {}

    def get(scenario: str, n: int) -> Case:
        if (scenario, n) not in done:
            done[scenario, n] = _launch(tmp_path_factory.mktemp(f"{scenario}{n}"), scenario, n)
        return done[scenario, n]

    return get


@pytest.fixture(params=CASES, ids=[f"{s}-{n}" for s, n in CASES])
def case(request, cases) -> Case:
    return cases(*request.param)


def _failures(db: Any) -> list[Any]:
    """torch's findings, in its order: mismatched collectives, and those some ranks never joined (torch stores
    these with ``pass_check=True`` and ``missing_ranks`` set)."""
    return [c for c in db.collectives if not c.pass_check or c.missing_ranks]


def _torch_split(c: Any) -> dict[str, list[int]]:
    """torch's mismatch as {collective (name, input sizes): ranks}: the culprits' calls and the first rank's."""
    culprits = c.mismatch_collectives or {}
    split: dict[str, list[int]] = {}
    for r in sorted(c.expected_ranks):
        call = culprits.get(r, c)
        split.setdefault(f"{call.collective_name} {call.input_sizes}", []).append(r)
    return split


def _hpcdist_split(div: dict[str, Any]) -> dict[str, list[int]]:
    split: dict[tuple[Any, ...], list[int]] = {}
    for r, e in sorted(div["calls"].items(), key=lambda kv: int(kv[0])):
        split.setdefault((e["op"], e["dtype"], e["count"], e["root"]), []).append(int(r))
    return {str(k): v for k, v in split.items()}


def test_the_export_names_one_file_per_rank_that_torch_reads(case):
    names = sorted(p.name for p in case.out.iterdir())
    assert names == [f"hpcdist_trace_rank_{r}" for r in range(case.n)]
    assert f"wrote {case.n} file(s)" in case.exported and "will stop" not in case.exported, case.exported
    assert {m.global_rank for m in case.db.memberships} == set(range(case.n))
    assert sorted(g.size for g in case.db.groups) == sorted([2, case.n])  # default_pg and the pair group
    assert "pair" in {g.desc for g in case.db.groups}


def test_torch_and_hpcdist_agree(case):
    hp = case.hpcdist["divergences"]
    failed = _failures(case.db)
    if case.scenario == "same":
        assert hp == [], hp
        assert failed == [], case.log
        assert "Not all ranks" not in case.log and "has errors" not in case.log, case.log
        # every collective of both groups, and the send/receive pair, matched across its ranks
        names = sorted(c.collective_name for c in case.db.collectives)
        assert names.count("nccl:all_reduce") == 3 + 3 and "nccl:recv 1<-0" in names, names
        assert {"nccl:broadcast", "nccl:_all_gather_base", "nccl:_reduce_scatter_base", "nccl:barrier"} <= set(names)
        return
    first = hp[0]
    assert (first["group"], first["seq"]) == ("default_pg", SEQ), case.hpcdist
    bad = failed[0]
    assert (bad.pg_desc, bad.collective_seq_id) == ("default_pg:default_pg", SEQ), case.log
    assert all(c.pg_desc == "default_pg:default_pg" for c in failed), case.log  # the pair group matched
    last = case.n - 1
    if case.scenario == "skip":
        assert first["kind"] == "missing" and first["missing"] == [last], first
        assert bad.missing_ranks == {last} and bad.collective_name == "nccl:all_reduce", bad
        assert f"Not all ranks joining collective, sequence number: {SEQ}" in case.log, case.log
        assert f"missing ranks: {{{last}}}" in case.log, case.log
        # the stuck ranks' main thread stack, at the job's line
        assert "<module> at " in case.log and "script_" in case.log, case.log
    else:
        assert first["kind"] == "mismatch", first
        assert f"Collective sequence number: {SEQ} has errors" in case.log, case.log
        expected = "COLLECTIVE_TYPE_MISMATCH" if case.scenario == "op" else "SIZE_OR_SYNTAX_MISMATCH"
        assert {c.type_of_mismatch.state.name for c in bad.mismatch_collectives.values()} == {expected}, case.log
        # the same split of the ranks: whichever rank torch started from, each side holds the same ranks
        assert sorted(_torch_split(bad).values()) == sorted(_hpcdist_split(first).values()), (case.log, first)
        assert len(_torch_split(bad)) == 2


def test_just_print_entries_shows_every_rank_and_the_stuck_call(case):
    text = case.entries
    assert all(f"Rank {r}" in text.splitlines()[0] for r in range(case.n)), text  # one column per rank
    assert "send(s=0 d=1, input_sizes=[[3]], state=completed)" in text, text
    assert "_all_gather_base(input_sizes=[[8]], state=completed)" in text, text
    if case.scenario != "same":
        assert "state=started" in text, text
    else:
        assert "state=started" not in text, text


def test_the_command_line_of_torch_analyzer_reads_the_export(cases, monkeypatch):
    """``python -m torch.distributed.flight_recorder.fr_trace OUT``, the documented command, as ``python -m`` runs
    it (``runpy``, in this process: a second torch import would cost seconds on the 2-core host)."""
    case = cases("skip", 3)
    monkeypatch.setattr(sys, "argv", ["fr_trace", str(case.out)])
    with warnings.catch_warnings():  # runpy: "found in sys.modules ... prior to execution": imported above, on purpose
        warnings.simplefilter("ignore", RuntimeWarning)
        log = _torch(lambda: runpy.run_module("torch.distributed.flight_recorder.fr_trace", run_name="__main__"))
    assert f"Not all ranks joining collective, sequence number: {SEQ}" in log, log
    assert "missing ranks: {2}" in log and "collective: nccl:all_reduce" in log, log


def test_export_refuses_a_directory_that_is_not_empty_and_a_missing_one(cases, tmp_path):
    case = cases("same", 2)
    with contextlib.redirect_stderr(io.StringIO()) as err:
        code, _ = _cli(["export-torch", str(case.dumps), str(case.out)])
    assert code == 2 and "is a directory that is not empty" in err.getvalue(), err.getvalue()
    with contextlib.redirect_stderr(io.StringIO()) as err:
        code, _ = _cli(["export-torch", str(tmp_path / "nothing"), str(tmp_path / "o")])
    assert code == 2 and "is not a directory" in err.getvalue(), err.getvalue()
    assert not (tmp_path / "o").exists()
