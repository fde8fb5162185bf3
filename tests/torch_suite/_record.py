"""pytest plugin: append each test's outcome to the JSON-lines file named by ``HPCDIST_SUITE_RECORD``.

One line per test as soon as it finishes, so a run killed at its time limit
keeps every result it reached (``run_suite.py`` then resumes after them).
"""

from __future__ import annotations

import json
import os
import re

_EXC = re.compile(r"^\s*(?:E\s+)?([A-Za-z_][\w.]*(?:Error|Exception|Exit|Timeout|Interrupt)\b.*)$")


def _reason(report) -> str:
    """A one-line reason: the skip message, or the last exception line of the failure."""
    if report.skipped:
        lr = report.longrepr
        return str(lr[2] if isinstance(lr, tuple) else lr).removeprefix("Skipped: ")[:300]
    text = getattr(report, "longreprtext", "") or ""
    lines = [m.group(1) for m in map(_EXC.match, text.splitlines()) if m]
    # the spawned rank's own exception, not the parent's "Process N exited with error code"
    inner = [ln for ln in lines if not ln.startswith(("RuntimeError: Process", "AssertionError: Process"))]
    pick = inner or lines or text.strip().splitlines()[-1:] or ["failed"]
    return pick[-1].strip()[:300]


def pytest_runtest_logreport(report) -> None:
    path = os.environ.get("HPCDIST_SUITE_RECORD")
    if not path:
        return
    final = report.when == "call" or (report.when == "setup" and not report.passed) or report.failed
    if not final:
        return
    rec = {
        "test": report.nodeid.rsplit("::", 1)[-1],
        "outcome": report.outcome,
        "when": report.when,
        "seconds": round(report.duration, 2),
        "reason": "" if report.passed else _reason(report),
    }
    if report.failed:
        rec["detail"] = (getattr(report, "longreprtext", "") or "")[-4000:]
    with open(path, "a") as f:
        f.write(json.dumps(rec) + "\n")
