"""The hierarchical engine's step thread and its Work, without nodes: order, turns, errors, close.

The steps here are plain Python functions (what they would do on the node,
leader and rail communicators is tested at 3 and 4 ranks in
tests/mpi/test_hierarchical.py and across namespaces in
tests/integration/test_cluster_audit.py); the Work is hpcdist's own.
"""

from __future__ import annotations

import threading
import time

import pytest

from hpcdist.backends.hierarchical import StepJob, StepThread
from hpcdist.work import Work, reap_orphans, wait_requests

pytestmark = pytest.mark.timeout(60)


def _work(job: StepJob, result: object = None) -> Work:
    return Work([job], None, None, 10.0, "all_reduce", result)


def test_calls_run_one_at_a_time_in_hand_over_order_and_a_turn_comes_after_them():
    """Three handed-over calls (the first slow) run in order, never two at once; a blocking call's turn starts
    only after all three finished."""
    t = StepThread("test-steps")
    log: list[str] = []
    running = []

    def step(name: str, secs: float):
        def run() -> None:
            running.append(name)
            assert len(running) == 1, running  # one at a time
            time.sleep(secs)
            log.append(name)
            running.remove(name)

        return run

    jobs = [StepJob(step("a", 0.2)), StepJob(step("b", 0.0)), StepJob(step("c", 0.05))]
    for j in jobs:
        t.submit(j)
    with t.turn():
        log.append("blocking")
    assert log == ["a", "b", "c", "blocking"]
    assert all(j.Test() for j in jobs)
    assert t.idle()
    t.close()


def test_a_work_waits_for_its_call_and_raises_its_error():
    """``Work.wait`` returns once the thread ran the call (its result kept); the call's error is the Work's, raised
    by ``wait`` and kept by ``exception()``; the thread goes on with the next call."""
    t = StepThread("test-steps")
    gate = threading.Event()
    out: list[int] = []
    ok = StepJob(lambda: (gate.wait(5), out.append(1)))
    boom = StepJob(lambda: (_ for _ in ()).throw(RuntimeError("step failed")))
    after = StepJob(lambda: out.append(2))
    w_ok, w_boom, w_after = _work(ok, "result"), _work(boom), _work(after)
    for j in (ok, boom, after):
        t.submit(j)
    assert not w_ok.is_completed()
    gate.set()
    assert w_ok.wait() is True and w_ok.result() == ["result"]
    with pytest.raises(RuntimeError, match="step failed"):
        w_boom.wait()
    assert w_boom.is_completed() and not w_boom.is_success()
    assert isinstance(w_boom.exception(), RuntimeError)
    w_after.wait()
    assert out == [1, 2]
    t.close()


@pytest.mark.parametrize("calls", [1, 2])
def test_wait_blocks_on_the_call_without_spinning(calls):
    """A waiter on calls in progress (one, or two as a combined Work has) sleeps on their events: the interpreter
    stays free for the thread (measured as the waiter's CPU time while the calls take 0.3 s of wall time)."""
    t = StepThread("test-steps")
    jobs = [StepJob(lambda: time.sleep(0.3 / calls)) for _ in range(calls)]
    for job in jobs:
        t.submit(job)
    cpu = time.thread_time()
    assert wait_requests(jobs, 10.0)
    assert time.thread_time() - cpu < 0.1  # spinning for 0.3 s would use about 0.3 s of this thread's CPU
    t.close()


def test_a_dropped_work_is_finished_by_the_orphans_and_close_joins_the_thread():
    """A Work dropped before its call ran is adopted and finished once the call ran; ``close`` waits for every
    handed-over call, ends the thread, and a later call starts a fresh one."""
    t = StepThread("test-steps")
    gate = threading.Event()
    done: list[str] = []
    job = StepJob(lambda: (gate.wait(5), done.append("dropped")))
    t.submit(job)
    _work(job)  # dropped at once: __del__ hands it to the orphans
    gate.set()
    t.close()
    assert done == ["dropped"]
    reap_orphans()
    assert not any(th.name == "test-steps" for th in threading.enumerate())
    again = StepJob(lambda: done.append("again"))
    t.submit(again)
    _work(again).wait()
    assert done == ["dropped", "again"]
    t.close()
