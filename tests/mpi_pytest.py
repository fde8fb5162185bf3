"""Run pytest on every rank of an ``mpiexec`` launch.

Rank 0 prints to the terminal; every other rank writes to a log file that is
shown (on the terminal) only when that rank failed. The exit code is the worst
over all ranks. ``--junitxml=PATH`` is honoured by rank 0 only; a failure on
another rank shows through the exit code.

A test that fails on any rank gets one line on the terminal at once (the
rank, the test, the error), so the first failure is on record even when the
stage later ends by its time limit.

Every test has a deadline (``HPCDIST_TEST_DEADLINE`` seconds, default 300; 0
turns it off). A rank whose test runs past it writes, on the terminal, the
test's name, the tail of its own log and the stack of every thread, then ends
the job (exit status 3): a hung test names itself within minutes instead of
eating its stage's whole time limit in silence. A test during which hpcdist
ends the job itself (the block-mode watchdog's ``MPI_Abort``) gets its name
and hpcdist's message on the terminal too: pytest's capture would lose them.
"""

from __future__ import annotations

import faulthandler
import os
import sys
import tempfile
import threading
import time
import traceback

import pytest
from mpi4py import MPI

#: seconds a rank waits after its report before ending the job, so a peer stuck in the same place reports too
GRACE = 10.0


class Deadline:
    """A pytest plugin on one rank: each failure said at once, one timer per test; see the module docstring."""

    def __init__(self, seconds: float, rank: int, size: int, terminal: int, log: str | None) -> None:
        self.seconds, self.rank, self.size = seconds, rank, size
        self.terminal, self.log = terminal, log
        self.test = "(between tests)"
        from hpcdist._watchdog import ABORT_HOOKS

        ABORT_HOOKS.append(self.aborting)

    def aborting(self, text: str) -> None:
        """hpcdist is ending the job (MPI_Abort): say so on the terminal, with the test's name."""
        os.write(self.terminal, f"\n===== rank {self.rank} of {self.size}: {self.test} ends the job: {text}".encode())

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        if report.failed:
            crash = getattr(report.longrepr, "reprcrash", None)  # the exception's "Type: message"
            lines = (crash.message if crash is not None else str(report.longrepr)).strip().splitlines() or ["?"]
            why = (lines[0] if crash is not None else lines[-1])[:400]
            line = f"\n----- rank {self.rank} of {self.size}: {report.nodeid} failed ({report.when}): {why}\n"
            os.write(self.terminal, line.encode())

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        if self.seconds <= 0:
            yield
            return
        self.test = item.nodeid
        timer = threading.Timer(self.seconds, self.report, args=(item,))
        timer.daemon = True
        timer.start()
        # the backstop, for a thread that holds the GIL in C code and never lets the timer run
        faulthandler.dump_traceback_later(self.seconds + 2 * GRACE, exit=True, file=self.terminal)
        try:
            yield
        finally:
            timer.cancel()
            faulthandler.cancel_dump_traceback_later()
            self.test = "(between tests)"

    def report(self, item: pytest.Item) -> None:
        head = f"rank {self.rank} of {self.size}: {item.nodeid} still running after {self.seconds:.0f}s"
        lines = [f"\n===== {head} =====\n"]
        if self.log is not None:
            with open(self.log, "rb") as fh:
                fh.seek(max(0, os.path.getsize(self.log) - 4000))
                tail = fh.read().decode(errors="replace")
            lines.append(f"----- rank {self.rank}: the end of its log -----\n{tail}\n")
        capture = item.config.pluginmanager.getplugin("capturemanager")
        if capture is not None:  # what the test printed so far (pytest holds it until the test ends)
            printed = "".join(capture.read_global_capture())[-4000:]
            lines.append(f"----- rank {self.rank}: the test's output so far -----\n{printed}\n")
        frames = sys._current_frames()
        for thread in threading.enumerate():
            frame = frames.get(thread.ident or -1)
            if frame is not None and thread is not threading.current_thread():
                lines.append(f"----- rank {self.rank}: thread {thread.name} -----\n")
                lines.extend(traceback.format_stack(frame))
        lines.append(f"===== rank {self.rank}: ending the job (exit status 3) =====\n")
        os.write(self.terminal, "".join(lines).encode())
        time.sleep(GRACE)
        os._exit(3)


def main() -> int:
    comm = MPI.COMM_WORLD
    rank, size = comm.Get_rank(), comm.Get_size()
    args = ["--with-mpi", *sys.argv[1:]]
    log = None
    terminal = None
    if rank != 0:
        args = [a for a in args if not a.startswith("--junitxml")]
        log = tempfile.NamedTemporaryFile("w+", prefix=f"hpcdist-rank{rank}-", suffix=".log", delete=False)  # noqa: SIM115
        terminal = os.dup(2)
        os.dup2(log.fileno(), 1)
        os.dup2(log.fileno(), 2)
    seconds = float(os.environ.get("HPCDIST_TEST_DEADLINE", "300"))
    # the terminal as it is now: pytest's capture takes fd 2 of rank 0 while a test runs
    out = os.dup(2) if terminal is None else terminal
    rc = int(pytest.main(args, plugins=[Deadline(seconds, rank, size, out, log and log.name)]))
    if rc == 5:  # no tests collected is not a failure here
        rc = 0
    codes = comm.allgather(rc)
    for r in range(1, size):  # one rank's log at a time, in rank order
        comm.Barrier()
        if r == rank and rc != 0 and log is not None and terminal is not None:
            sys.stdout.flush()
            log.flush()
            with open(log.name, "rb") as fh:
                text = fh.read()[-30000:]
            os.write(terminal, f"\n===== rank {rank} of {size} failed (rc={rc}) =====\n".encode() + text)
    if log is not None:
        log.close()
        os.unlink(log.name)
    if rank == 0 and any(codes):
        print(f"exit codes by rank: {codes}", flush=True)
    return max(codes)


if __name__ == "__main__":
    sys.exit(main())
