"""Run torch's distributed test suite on gloo or hpcdist and record every test's outcome.

The suite is ``DistributedTest._DistTestBase`` from
``torch/testing/_internal/distributed/distributed_test.py``, driven by
``suite_spawn.py`` as torch's ``test_distributed_spawn.py`` drives it (fresh
processes per test, ``file://`` rendezvous). Outcomes go, one JSON line per
test as it finishes, to ``records/<backend>-<ranks>.jsonl`` (``<backend>.mpi-<ranks>.jsonl``
under the ``mpi`` gating profile: see ``suite_spawn.py``); an interrupted run
resumes where it stopped.

Usage::

    python tests/torch_suite/run_suite.py run --backend gloo --ranks 2,3,4 [--limit S] [-k PATTERN]
    python tests/torch_suite/run_suite.py run --backend hpcdist --ranks 3 --only-passed-on gloo
    python tests/torch_suite/run_suite.py run --backend hpcdist --profile mpi  # what torch asks of its MPI backend
    python tests/torch_suite/run_suite.py merge      # records/*.jsonl -> results.json
    python tests/torch_suite/run_suite.py summary    # counts and differences, Markdown

Each launch runs under a hard time limit (``--limit``, whole launch) and each
test under the suite's own per-test limit (``--test-timeout``, which the
suite reads as ``DISTRIBUTED_TESTS_DEFAULT_TIMEOUT``).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
RECORDS = HERE / "records"
RESULTS = HERE / "results.json"
SUITE = HERE / "suite_spawn.py"
BACKENDS = ("gloo", "hpcdist")
PROFILES = ("gloo", "mpi")  # the backend name the suite decides which tests apply by (suite_spawn.py)


def suite_env(
    backend: str, ranks: int, test_timeout: int, record: Path | None, profile: str = "gloo"
) -> dict[str, str]:
    """The environment of one suite launch: backend, gating profile, world size, limits, where outcomes go."""
    env = dict(os.environ)
    env.update(
        HPCDIST_SUITE_BACKEND=backend,
        HPCDIST_SUITE_PROFILE=profile,
        WORLD_SIZE=str(ranks),
        DISTRIBUTED_TESTS_DEFAULT_TIMEOUT=str(test_timeout),
        PYTHONUNBUFFERED="1",
        PYTHONPATH=os.pathsep.join([str(ROOT), str(HERE), env.get("PYTHONPATH", "")]),
        OMP_NUM_THREADS=env.get("OMP_NUM_THREADS", "1"),
    )
    env.pop("HPCDIST_TIMEOUT", None)  # the suite passes its own timeouts to init_process_group
    if record is not None:
        env["HPCDIST_SUITE_RECORD"] = str(record)
    return env


def pytest_cmd(*args: str) -> list[str]:
    return [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "_record", "-q", *args]


def collect(pattern: str | None = None) -> list[str]:
    """Names of the suite's tests (the same for every backend and rank count)."""
    cmd = pytest_cmd(str(SUITE), "--collect-only", *(["-k", pattern] if pattern else []))
    out = subprocess.run(cmd, cwd=ROOT, env=suite_env("gloo", 2, 60, None), capture_output=True, text=True, check=False)
    names = [ln.rsplit("::", 1)[-1] for ln in out.stdout.splitlines() if "::" in ln]
    if not names:
        raise RuntimeError(f"collecting the suite found no tests:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}")
    return names


def read_record(path: Path) -> dict[str, dict]:
    """test name -> its last recorded outcome."""
    done: dict[str, dict] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            if line.strip():
                rec = json.loads(line)
                done[rec["test"]] = rec
    return done


def run_launch(cmd: list[str], env: dict[str, str], limit: float) -> int:
    """Run ``cmd`` in its own session; past ``limit`` seconds kill it with every rank it spawned."""
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, start_new_session=True)
    try:
        return proc.wait(timeout=limit)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        return 124


def record_name(backend: str, ranks: int, profile: str = "gloo") -> str:
    """The record file of a backend at a rank count under a gating profile."""
    return f"{backend}{'' if profile == 'gloo' else '.' + profile}-{ranks}.jsonl"


def run(
    backend: str,
    ranks: int,
    tests: list[str],
    *,
    limit: float,
    test_timeout: int,
    record: Path,
    retry: bool = False,
    profile: str = "gloo",
) -> dict[str, dict]:
    """Run ``tests`` not yet in ``record`` (all of them again with ``retry``) under the gating ``profile``; return the
    record."""
    record.parent.mkdir(parents=True, exist_ok=True)
    done = read_record(record)
    todo = [t for t in tests if retry or t not in done]
    t_end = time.monotonic() + limit
    stuck = 0
    while todo and time.monotonic() < t_end and stuck < 2:
        print(f"== {backend} at {ranks} ranks: {len(todo)} tests to run", flush=True)
        offset = record.stat().st_size if record.exists() else 0
        ids = [f"{SUITE.relative_to(ROOT)}::TestDistBackendWithSpawn::{t}" for t in todo]
        env = suite_env(backend, ranks, test_timeout, record, profile)
        rc = run_launch(pytest_cmd(*ids), env, max(1.0, t_end - time.monotonic()))
        with open(record) if record.exists() else open(os.devnull) as f:
            f.seek(offset)
            new = {json.loads(ln)["test"] for ln in f.read().splitlines() if ln.strip()}
        todo = [t for t in todo if t not in new]
        if not todo or not (rc < 0 or rc == 3):  # pytest finished, refused (2, 4, 5), or the time limit (124)
            break
        # pytest itself died under a test (a signal, an internal error): that test failed, go on after it
        stuck = 0 if new else stuck + 1
        crash = {
            "test": todo[0],
            "outcome": "failed",
            "when": "crash",
            "seconds": 0,
            "reason": f"the pytest launch died with exit code {rc} during this test",
        }
        with open(record, "a") as f:
            f.write(json.dumps(crash) + "\n")
        todo = todo[1:]
    return read_record(record)


def merge(records: Path = RECORDS) -> dict:
    """Every record file in ``records`` into the results dict (backend -> ranks -> test -> outcome and reason): a
    backend and rank count with a record replaces its entry in ``results.json``; the others are kept."""
    out: dict = {
        "suite": "torch/testing/_internal/distributed/distributed_test.py DistributedTest._DistTestBase",
        "torch": _torch_version(),
        "results": json.loads(RESULTS.read_text())["results"] if RESULTS.exists() else {},
    }
    for path in sorted(records.glob("*.jsonl")):
        backend, ranks = path.stem.rsplit("-", 1)
        recs = read_record(path)
        out["results"].setdefault(backend, {})[ranks] = {
            t: {"outcome": r["outcome"], "reason": r["reason"]} for t, r in sorted(recs.items())
        }
    return out


def _torch_version() -> str:
    try:
        import torch

        return str(torch.__version__)
    except ImportError:
        return "unknown"


def counts(res: dict[str, dict]) -> tuple[int, int, int]:
    o = [r["outcome"] for r in res.values()]
    return o.count("passed"), o.count("failed"), o.count("skipped")


def summary(results: dict) -> str:
    """Markdown: counts per backend, profile and rank count, then, per profile, each test whose outcome differs
    between gloo and hpcdist."""
    res = results["results"]
    lines = ["| ranks | backend | passed | failed | skipped | total |", "|---|---|---|---|---|---|"]
    ranks_all = sorted({r for b in res.values() for r in b}, key=int)
    suffixes = ["" if p == "gloo" else "." + p for p in PROFILES]
    for r in ranks_all:
        for b in (b + sfx for sfx in suffixes for b in BACKENDS):
            if r in res.get(b, {}):
                p, f, s = counts(res[b][r])
                lines.append(f"| {r} | {b} | {p} | {f} | {s} | {p + f + s} |")
    lines.append("")
    lines.append("| ranks | test | gloo | hpcdist | hpcdist's reason (gloo's where hpcdist passes) |")
    lines.append("|---|---|---|---|---|")
    for sfx in suffixes:
        for r in ranks_all:
            g, h = res.get("gloo" + sfx, {}).get(r, {}), res.get("hpcdist" + sfx, {}).get(r, {})
            for t in sorted(set(g) | set(h)):
                go, ho = g.get(t, {}).get("outcome", "-"), h.get(t, {}).get("outcome", "-")
                if go != ho and "-" not in (go, ho):  # a test one backend did not run is no difference
                    reason = h.get(t, {}).get("reason", "") if ho != "passed" else g.get(t, {}).get("reason", "")
                    reason = re.sub(r"\s+", " ", reason).replace("|", "\\|")[:200]
                    lines.append(f"| {r}{sfx} | `{t}` | {go} | {ho} | {reason} |")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("--backend", choices=BACKENDS, required=True)
    r.add_argument(
        "--profile",
        choices=PROFILES,
        default="gloo",
        help="the backend name the suite decides which tests apply by: gloo's tests, or those torch asks of its MPI "
        "backend",
    )
    r.add_argument("--ranks", default="2,3,4")
    r.add_argument("-k", dest="pattern", default=None, help="pytest -k expression selecting tests")
    r.add_argument("--tests", default=None, help="file with one test name per line")
    r.add_argument(
        "--only-passed-on",
        choices=BACKENDS,
        default=None,
        help="run only the tests that passed on this backend's record at the same rank count",
    )
    r.add_argument("--limit", type=float, default=3600, help="seconds for each rank count")
    r.add_argument("--test-timeout", type=int, default=120)
    r.add_argument("--retry", action="store_true", help="run tests already recorded again")
    r.add_argument("--failed", action="store_true", help="run again only the tests recorded as failed")
    r.add_argument("--record-dir", default=str(RECORDS))
    m = sub.add_parser("merge")
    m.add_argument("--record-dir", default=str(RECORDS))
    sub.add_parser("summary")
    args = ap.parse_args()
    if args.cmd == "merge":
        RESULTS.write_text(json.dumps(merge(Path(args.record_dir)), indent=1, sort_keys=True) + "\n")
        print(f"wrote {RESULTS}")
        return 0
    if args.cmd == "summary":
        print(summary(json.loads(RESULTS.read_text()) if RESULTS.exists() else merge()))
        return 0
    tests = Path(args.tests).read_text().split() if args.tests else collect(args.pattern)
    bad = 0
    for n in (int(x) for x in args.ranks.split(",") if x):
        sel = tests
        if args.only_passed_on:
            ref = read_record(Path(args.record_dir) / record_name(args.only_passed_on, n, args.profile))
            sel = [t for t in tests if ref.get(t, {}).get("outcome") == "passed"]
        record = Path(args.record_dir) / record_name(args.backend, n, args.profile)
        if args.failed:
            old = read_record(record)
            sel = [t for t in sel if old.get(t, {}).get("outcome") == "failed"]
        rec = run(
            args.backend,
            n,
            sel,
            limit=args.limit,
            test_timeout=args.test_timeout,
            record=record,
            retry=args.retry or args.failed,
            profile=args.profile,
        )
        mine = {t: rec[t] for t in sel if t in rec}
        p, f, s = counts(mine)
        print(f"== {args.backend} at {n} ranks: {p} passed, {f} failed, {s} skipped, {len(sel) - len(mine)} not run")
        bad += f + len(sel) - len(mine)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
