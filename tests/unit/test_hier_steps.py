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
    with t.turn(10.0, "all_reduce"):
        log.append("blocking")
    assert log == ["a", "b", "c", "blocking"]
    assert all(j.Test() for j in jobs)
    assert t.idle()
    t.close(10.0)


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
    t.close(10.0)


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
    t.close(10.0)


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
    t.close(10.0)
    assert done == ["dropped"]
    reap_orphans()
    assert not any(th.name == "test-steps" for th in threading.enumerate())
    again = StepJob(lambda: done.append("again"))
    t.submit(again)
    _work(again).wait()
    assert done == ["dropped", "again"]
    t.close(10.0)


def test_a_turn_and_close_give_up_once_calls_stop_finishing():
    """A blocking call behind a handed-over call that runs past the limit gets DistTimeoutError naming itself (the
    thread's call goes on); ``close`` returns False and leaves the thread; calls that keep finishing, each within
    the limit, are waited for however long they take together."""
    from hpcdist.errors import DistTimeoutError

    t = StepThread("test-steps")
    gate = threading.Event()
    t.submit(StepJob(lambda: gate.wait(5)))
    with pytest.raises(DistTimeoutError, match="all_reduce"), t.turn(0.2, "all_reduce"):
        pass
    assert t.close(0.2) is False and not t.idle()
    gate.set()
    for _ in range(4):  # 4 x 0.1 s in a row: longer than the limit together, each within it
        t.submit(StepJob(lambda: time.sleep(0.1)))
    with t.turn(0.3, "all_reduce"):
        assert t.idle() is False  # this turn holds the thread's slot
    assert t.close(0.3) is True


def test_a_dropped_work_whose_future_was_asked_for_waits_for_the_cycle_collector():
    """docs/sharp-bits.md ("Dropped Work handles"): a Work and its Future reference each other, so dropping both
    hands nothing to the orphans until Python's cycle collector finds them; then the Work is adopted and finished
    as any dropped one."""
    import gc

    from hpcdist.work import pending_orphans

    done: list[int] = []
    job = StepJob(lambda: None)
    before = pending_orphans()
    gc.disable()
    try:
        work = Work([job], lambda: done.append(1), None, 10.0, "all_reduce")
        work.get_future()
        del work
        assert pending_orphans() == before  # not handed over: the cycle keeps it
        gc.collect()
        assert pending_orphans() == before + 1
    finally:
        gc.enable()
    job.run()
    reap_orphans()
    assert done == [1] and pending_orphans() == before


_AT_EXIT = """
import gc
from hpcdist.backends.hierarchical import StepJob
from hpcdist.work import Work
gc.disable()
work = Work([StepJob(lambda: None)], None, None, 10.0, "all_reduce")
work.get_future()  # the Work and its Future reference each other: collected only at interpreter shutdown
del work
"""


def test_a_pending_work_collected_at_interpreter_shutdown_says_nothing():
    """A Work kept by a reference cycle until interpreter shutdown tried to hand itself to the orphans there and
    printed "Exception ignored in: <function Work.__del__ ...> ImportError: sys.meta_path is None" at exit."""
    import subprocess
    import sys

    res = subprocess.run([sys.executable, "-c", _AT_EXIT], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0 and res.stderr == "", res.stderr
