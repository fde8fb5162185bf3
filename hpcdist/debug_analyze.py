"""``hpcdist debug analyze DIR``: why is my job stuck? Read every rank's flight recorder dump.

(``hpcdist debug export-torch DIR OUT`` writes the dumps in torch's format:
:mod:`hpcdist.flight_torch`.)

The dumps (``rank-<R>.json``, written by :mod:`hpcdist.flight`) hold each
group's last collectives, numbered alike on every rank of the group, and its
point-to-point operations. For each group this finds the first collective
sequence number where the ranks disagree:

- ranks that never entered it (their last collective on the group is older),
- ranks that entered a different operation, dtype, element count or root,
- or, when all entered the same, that it never completed anywhere;

then picks the divergence that started first across groups (the one the
others are waiting behind), and says what each missing rank was doing
instead: its last operation still in flight, or the line its main thread
was on. Point-to-point receives still pending are matched against the
sender's history (a receive with no send left to match names the sender).
Ranks with no dump file are listed: they ended before dumping (killed,
or not in an hpcdist call when the job was aborted).

Decisions are made by :func:`analyze` on loaded dumps (plain dicts), so they
test without MPI; :func:`main` is the command line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from ._ranklist import ranks_text as _ranks_text

__all__ = ["Divergence", "Report", "analyze", "format_report", "load_dumps", "main"]

#: what identifies a collective call: compared across the ranks of a group
_SIGNATURE = ("op", "dtype", "count", "root")


@dataclass
class Divergence:
    """The first collective of one group on which the ranks do not agree."""

    group: str
    seq: int
    kind: str  # "missing" (some ranks never entered), "mismatch" (different calls), "stuck" (entered, never done)
    calls: dict[int, dict[str, Any]]  # global rank -> its entry for this seq
    missing: list[int]  # members that never entered it (with a dump)
    no_dump: list[int]  # members without a dump file
    started_at: float  # earliest start of the op among the ranks that entered


@dataclass
class Report:
    """What :func:`analyze` found; :func:`format_report` prints it."""

    world_size: int
    ranks: list[int]  # ranks with a dump
    no_dump: list[int]
    jobs: list[str]
    reasons: dict[int, str]
    divergences: list[Divergence] = field(default_factory=list)  # first one per group, earliest first
    doing: dict[int, str] = field(default_factory=dict)  # global rank -> what it was doing instead
    p2p: list[str] = field(default_factory=list)  # pending point-to-point findings
    dump_time: float = 0.0


def load_dumps(directory: str) -> dict[int, dict[str, Any]]:
    """Every ``rank-*.json`` in ``directory``: global rank -> dump.

    Raises ValueError naming the file when one is not a well-formed dump, and
    when there is none or the files come from jobs of different sizes.
    """
    if not os.path.isdir(directory):
        raise ValueError(f"{directory!r} is not a directory (expected the flight recorder's dump directory)")
    out: dict[int, dict[str, Any]] = {}
    paths: dict[int, list[str]] = {}  # world size -> the files that name it
    runs: dict[str, list[str]] = {}  # run id (one per init_process_group) -> the files that name it
    for name in sorted(os.listdir(directory)):
        if not (name.startswith("rank-") and name.endswith(".json")):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as exc:
            raise ValueError(f"{path}: not a readable flight recorder dump ({exc})") from None
        if not isinstance(data, dict) or data.get("version") != 1 or "groups" not in data:
            raise ValueError(f"{path}: not a flight recorder dump of format version 1")
        problem = _malformed(data)
        if problem:
            raise ValueError(f"{path}: not a readable flight recorder dump ({problem}; truncated or edited?)")
        data.setdefault("rank", -1)
        rank = data["rank"]
        if rank >= 0 and rank in out:
            raise ValueError(f"{path}: a second dump of rank {rank} (the files come from different jobs?)")
        out[rank if rank >= 0 else -1 - len(out)] = data
        if data["world_size"] >= 0:  # not a dump of a process without a process group (rank-pid<PID>.json)
            paths.setdefault(data["world_size"], []).append(name)
            if isinstance(data.get("run"), str) and data["run"]:
                runs.setdefault(data["run"], []).append(name)
    if not out:
        raise ValueError(f"no flight recorder dumps (rank-*.json) in {directory!r}")
    if len(paths) > 1:  # a stale file of an earlier job of another size (the default directory is reused)
        sizes = "; ".join(f"world size {size}: {', '.join(names)}" for size, names in sorted(paths.items()))
        raise ValueError(
            f"the dumps in {directory!r} come from different jobs ({sizes}); "
            "remove the stale files, or move one job's files to a directory of their own"
        )
    if len(runs) > 1:  # equal sizes: a later run overwrote some ranks' files and left the others' stale
        which = "; ".join(f"run {run}: {', '.join(names)}" for run, names in sorted(runs.items()))
        raise ValueError(
            f"the dumps in {directory!r} come from different runs of a job of one size ({which}); "
            "remove the stale files, or move one run's files to a directory of their own"
        )
    return out


#: what the analyzer reads of a dump, of its groups and of their entries: field -> accepted types
_TOP_FIELDS: dict[str, tuple[type, ...]] = {"world_size": (int,), "groups": (list,), "time": (int, float)}
_GROUP_FIELDS: dict[str, tuple[type, ...]] = {
    "name": (str,),
    "ranks": (list,),
    "collectives": (int,),
    "p2p_ops": (int,),
    "capacity": (int,),
    "entries": (list,),
}
_ENTRY_FIELDS: dict[str, tuple[type, ...]] = {
    "seq": (int,),
    "p2p": (bool,),
    "op": (str,),
    "state": (str,),
    "started_at": (int, float),
}
#: the largest world size a dump may name (MPI counts ranks in a C int)
_MAX_WORLD = 2**31 - 1


def _bad_field(record: dict[str, Any], fields: dict[str, tuple[type, ...]], where: str) -> str:
    """The first of ``fields`` missing from ``record`` or of another type, as a phrase ('' when all are fine)."""
    for key, types in fields.items():
        value = record.get(key)
        if not isinstance(value, types) or (isinstance(value, bool) and bool not in types):
            return f"{where}{key!r} is {value!r}, expected {' or '.join(t.__name__ for t in types)}"
    return ""


def _malformed(data: dict[str, Any]) -> str:
    """What makes ``data`` unusable by :func:`analyze`, as a phrase ('' when nothing does)."""
    problem = _bad_field(data, _TOP_FIELDS, "")
    if problem:
        return problem
    world, rank = data["world_size"], data.get("rank", -1)
    if not -1 <= world <= _MAX_WORLD:
        return f"'world_size' is {world!r}, expected 0..{_MAX_WORLD} (-1: no process group)"
    if (not isinstance(rank, int) or isinstance(rank, bool) or not -1 <= rank < max(world, 0)) and not (
        rank == -1 and world == -1
    ):
        return f"'rank' is {rank!r}, expected an int below world_size {world} (-1: no process group)"
    if not isinstance(data.get("stacks", {}), dict):
        return f"'stacks' is {data['stacks']!r}, expected an object"
    for i, group in enumerate(data["groups"]):
        if not isinstance(group, dict):
            return f"groups[{i}] is {group!r}, expected an object"
        problem = _bad_field(group, _GROUP_FIELDS, f"groups[{i}]: ")
        if not problem and not all(isinstance(r, int) and 0 <= r < world for r in group["ranks"]):
            problem = f"groups[{i}]: 'ranks' is {group['ranks']!r}, expected ranks below world_size {world}"
        for j, entry in enumerate(group["entries"] if not problem else []):
            where = f"groups[{i}].entries[{j}]"
            problem = (
                _bad_field(entry, _ENTRY_FIELDS, f"{where}: ") if isinstance(entry, dict) else f"{where} is {entry!r}"
            )
            if problem:
                break
        if problem:
            return problem
    return ""


def _signature(entry: dict[str, Any]) -> tuple[Any, ...]:
    return tuple(entry.get(k) for k in _SIGNATURE)


def _group_view(dumps: dict[int, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """group name -> {"ranks": members, "per_rank": {global rank: group record}}."""
    groups: dict[str, dict[str, Any]] = {}
    for rank, dump in dumps.items():
        for g in dump["groups"]:
            view = groups.setdefault(g["name"], {"ranks": list(g["ranks"]), "per_rank": {}})
            view["per_rank"][rank] = g
    return groups


def _first_divergence(name: str, view: dict[str, Any], no_dump_all: list[int]) -> Divergence | None:
    per_rank: dict[int, dict[str, Any]] = view["per_rank"]
    members = view["ranks"]
    no_dump = [r for r in members if r in no_dump_all]
    colls = {r: {e["seq"]: e for e in g["entries"] if not e["p2p"]} for r, g in per_rank.items()}
    entered = {r: int(g["collectives"]) for r, g in per_rank.items()}
    if not entered:
        return None
    # compare from the oldest seq every rank still holds (rings overwrite old entries) up to the newest any entered
    oldest = max((min(c) if c else entered[r] + 1) for r, c in colls.items())
    newest = max(entered.values())
    for seq in range(oldest, newest + 1):
        calls = {r: c[seq] for r, c in colls.items() if seq in c}
        missing = sorted(r for r in per_rank if entered[r] < seq)
        started = min((e["started_at"] for e in calls.values()), default=0.0)
        if len({_signature(e) for e in calls.values()}) > 1:
            return Divergence(name, seq, "mismatch", calls, missing, no_dump, started)
        if missing:
            return Divergence(name, seq, "missing", calls, missing, no_dump, started)
        if calls and all(e["state"] in ("started", "failed") for e in calls.values()) and seq == newest:
            return Divergence(name, seq, "stuck", calls, [], no_dump, started)
    if no_dump and newest > 0:
        last = {r: c[newest] for r, c in colls.items() if newest in c}
        if last and any(e["state"] != "completed" for e in last.values()):
            started = min(e["started_at"] for e in last.values())
            return Divergence(name, newest, "stuck", last, [], no_dump, started)
    return None


def _describe(entry: dict[str, Any], group: str) -> str:
    parts = [entry["op"]]
    if entry.get("dtype"):
        parts.append(f"{entry['dtype']}[{entry['count']}]")
    if entry["p2p"]:
        parts.append(f"peer {entry.get('peer')}")
    elif entry.get("root") is not None:
        parts.append(f"root {entry['root']}")
    kind = "p2p" if entry["p2p"] else "collective"
    return f"{' '.join(parts)} ({kind} #{entry['seq']} on group {group!r}, {entry['state']})"


def _last_line(stack: str) -> str:
    lines = [ln.strip() for ln in stack.strip().splitlines() if ln.strip()]
    frames = [ln for ln in lines if ln.startswith("File ")]
    if not frames:
        return ""
    code = lines[-1] if not lines[-1].startswith("File ") else ""
    return f"{frames[-1]}: {code}".rstrip(": ")


def _error_line(reason: str) -> str:
    """The exception line of an abort's reason (its traceback's last line, without the ``[rank N]`` prefix)."""
    lines = []
    for raw in reason.splitlines():
        line = raw.split("] ", 1)[1] if raw.startswith("[rank ") and "] " in raw else raw
        if line and not line[0].isspace() and not line.startswith(("Traceback", "hpcdist:", "abort:")):
            lines.append(line)
    return lines[-1] if lines else reason.splitlines()[0] if reason else ""


def _doing(dump: dict[str, Any]) -> str:
    """What a rank was doing at dump time: aborting, its newest operation not completed, or its main thread's line."""
    reason = str(dump.get("reason", ""))
    if reason.startswith("abort: [rank "):  # this rank's own unhandled exception
        return f"aborting: {_error_line(reason)}"
    pending = [
        (e["started_at"], _describe(e, g["name"]))
        for g in dump["groups"]
        for e in g["entries"]
        if e["state"] in ("started", "failed")
    ]
    where = _last_line(dump.get("stacks", {}).get("MainThread", ""))
    if pending:
        t, desc = max(pending)
        return f"in {desc}, since {max(0.0, dump['time'] - t):.1f}s before its dump"
    return f"in no hpcdist operation; main thread at {where}" if where else "in no hpcdist operation"


def _p2p_findings(dumps: dict[int, dict[str, Any]], groups: dict[str, dict[str, Any]]) -> list[str]:
    """Pending receives whose sender sent fewer messages than the receiver waits for (full histories only)."""
    out = []
    for name, view in groups.items():
        per_rank = view["per_rank"]
        complete = {r for r, g in per_rank.items() if g["p2p_ops"] <= g["capacity"]}  # nothing overwritten
        for r, g in per_rank.items():
            for e in g["entries"]:
                if not e["p2p"] or e["state"] != "started" or e["op"] not in ("recv", "irecv", "recv_object_list"):
                    continue
                src = e.get("peer")
                if src == "any" or src not in per_rank:
                    hint = "" if src == "any" else f" (rank {src} has no dump)"
                    out.append(f"rank {r} waits in {_describe(e, name)}{hint}")
                    continue
                sends_op = "send_object_list" if e["op"] == "recv_object_list" else None
                recvs = [
                    x
                    for x in g["entries"]
                    if x["p2p"] and x["op"] in ("recv", "irecv", "recv_object_list") and x.get("peer") == src
                ]
                sends = [
                    x
                    for x in per_rank[src]["entries"]
                    if x["p2p"]
                    and x.get("peer") == r
                    and (x["op"] == sends_op if sends_op else x["op"] in ("send", "isend"))
                ]
                if r in complete and src in complete and len(sends) < len(recvs):
                    out.append(
                        f"rank {r} waits in {_describe(e, name)}: rank {src} sent it {len(sends)} message(s), "
                        f"rank {r} posted {len(recvs)} receive(s) from it; rank {src} is {_doing(dumps[src])}"
                    )
                else:
                    out.append(f"rank {r} waits in {_describe(e, name)}")
    return out


def analyze(dumps: dict[int, dict[str, Any]]) -> Report:
    """Find where the ranks of the dumped job diverge (see the module docstring)."""
    world = max(int(d.get("world_size", 0)) for d in dumps.values())
    ranks = sorted(r for r in dumps if r >= 0)
    no_dump = sorted(set(range(world)) - set(ranks))
    report = Report(
        world_size=world,
        ranks=ranks,
        no_dump=no_dump,
        jobs=sorted({str(d.get("job", "")) for d in dumps.values()}),
        reasons={r: str(d.get("reason", "")) for r, d in dumps.items()},
        dump_time=max(float(d.get("time", 0.0)) for d in dumps.values()),
    )
    groups = _group_view(dumps)
    for name, view in groups.items():
        div = _first_divergence(name, view, no_dump)
        if div is not None:
            report.divergences.append(div)
    report.divergences.sort(key=lambda d: (d.started_at or float("inf"), d.group))
    if report.divergences:
        first = report.divergences[0]
        for r in first.missing:
            report.doing[r] = _doing(dumps[r])
    report.p2p = _p2p_findings(dumps, groups)
    return report


def _call_text(entry: dict[str, Any]) -> str:
    text = entry["op"]
    if entry.get("dtype"):
        text += f"({entry['dtype']}, count {entry['count']}"
        text += f", root {entry['root']})" if entry.get("root") is not None else ")"
    elif entry.get("root") is not None:
        text += f"(root {entry['root']})"
    return f"{text} [{entry['state']}]"


def format_report(report: Report) -> str:
    """The report as text for a terminal (one screen for a typical hang)."""
    lines = [
        f"flight recorder dumps of {len(report.ranks)} of {report.world_size} ranks"
        + (f" (job {', '.join(j for j in report.jobs if j)})" if any(report.jobs) else "")
    ]
    if len(report.jobs) > 1:
        lines.append("WARNING: the dumps come from different jobs; remove stale files from the directory")
    if report.no_dump:
        lines.append(
            f"no dump from rank(s) {_ranks_text(report.no_dump)}: they ended before dumping (killed, crashed, "
            "or not in an hpcdist call when the job was aborted)"
        )
    if not report.divergences:
        lines.append("no divergence: every group's ranks entered the same collectives, and all completed")
    for i, div in enumerate(report.divergences):
        head = "FIRST DIVERGENCE" if i == 0 else "also"
        lines.append("")
        lines.append(f"{head}: group {div.group!r}, collective #{div.seq}")
        if div.kind == "mismatch":
            by_sig: dict[tuple[Any, ...], list[int]] = {}
            for r, e in sorted(div.calls.items()):
                by_sig.setdefault(_signature(e), []).append(r)
            lines.append("  ranks called different collectives:")
            for sig_ranks in by_sig.values():
                lines.append(f"    rank(s) {_ranks_text(sig_ranks)}: {_call_text(div.calls[sig_ranks[0]])}")
        elif div.calls:
            sample = next(iter(div.calls.values()))
            lines.append(f"  rank(s) {_ranks_text(sorted(div.calls))} entered {_call_text(sample)}")
        if div.missing:
            lines.append(f"  rank(s) {_ranks_text(div.missing)} never entered it")
            if i == 0:
                for r in div.missing:
                    lines.append(f"    rank {r} is {report.doing.get(r, '?')}")
        if div.kind == "stuck" and div.no_dump:
            lines.append(
                f"  it did not complete: member rank(s) {_ranks_text(div.no_dump)} left no dump, so most likely "
                "never entered it (look at those ranks first)"
            )
        elif div.kind == "stuck":
            lines.append("  every member rank entered it and none saw it complete (a network or MPI problem?)")
        elif div.no_dump:
            lines.append(f"  no dump from member rank(s) {_ranks_text(div.no_dump)}")
    if report.p2p:
        lines.append("")
        lines.append("point-to-point operations still pending:")
        lines += [f"  {text}" for text in report.p2p[:12]]
        if len(report.p2p) > 12:
            lines.append(f"  ... and {len(report.p2p) - 12} more")
    reasons = sorted({why.splitlines()[0][:140] for why in report.reasons.values() if why})
    if reasons:
        lines.append("")
        lines.append("why the ranks dumped:")
        lines += [f"  {why}" for why in reasons[:6]]
    return "\n".join(lines)


def _export_torch(directory: str, out: str, p2p: bool) -> int:
    """``hpcdist debug export-torch DIR OUT [--no-p2p]`` (:mod:`hpcdist.flight_torch`)."""
    from .flight_torch import export

    try:
        done = export(directory, out, p2p)
    except (ValueError, OSError) as exc:
        print(f"hpcdist debug export-torch: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {len(done.paths)} file(s) in torch's flight recorder format to {out}")
    for title, lines in (
        ("left out (torch's analyzer cannot read them)", done.left_out),
        (
            "torch's analyzer will stop with `AssertionError: can't get dst of non-p2p op` (it reads a collective "
            "and a p2p op with one sequence number as a coalesced group); export again with --no-p2p, or use -j",
            done.traps,
        ),
    ):
        if lines:
            print(f"{title}:")
            print("\n".join(f"  {line}" for line in lines[:12]))
            if len(lines) > 12:
                print(f"  ... and {len(lines) - 12} more")
    print(f"read them with: python -m torch.distributed.flight_recorder.fr_trace {out}  (-j: print every entry)")
    return 0


def main(argv: list[str] | None = None) -> int:
    """``hpcdist debug analyze DIR [--json]``, ``hpcdist debug export-torch DIR OUT [--no-p2p]``; returns the
    exit status (2: no readable dumps, or OUT not usable)."""
    ap = argparse.ArgumentParser(prog="hpcdist debug", description="debugging tools for hpcdist jobs")
    sub = ap.add_subparsers(dest="command", required=True)
    an = sub.add_parser("analyze", help="read every rank's flight recorder dump; print where the ranks diverge")
    an.add_argument("directory", help="the dump directory (HPCDIST_FLIGHT_DIR, default ./hpcdist-flight)")
    an.add_argument("--json", action="store_true", help="print the findings as JSON")
    ex = sub.add_parser(
        "export-torch",
        help="write the dumps in torch's flight recorder format, for "
        "`python -m torch.distributed.flight_recorder.fr_trace OUT`",
    )
    ex.add_argument("directory", help="the dump directory (HPCDIST_FLIGHT_DIR, default ./hpcdist-flight)")
    ex.add_argument("out", help="a new or empty directory for torch's files (hpcdist_trace_rank_<R>)")
    ex.add_argument(
        "--no-p2p",
        action="store_true",
        help="leave point-to-point operations out (torch's analyzer stops on a collective and a p2p op of one "
        "group that follow each other with the same sequence number)",
    )
    args = ap.parse_args(argv)
    if args.command == "export-torch":
        return _export_torch(args.directory, args.out, not args.no_p2p)
    try:
        dumps = load_dumps(args.directory)
    except ValueError as exc:
        print(f"hpcdist debug analyze: {exc}", file=sys.stderr)
        return 2
    report = analyze(dumps)
    if args.json:
        from dataclasses import asdict

        print(json.dumps(asdict(report), indent=1, default=str))
    else:
        print(format_report(report))
    return 0
