"""hpcdist.checkpoint.Preemption under mpiexec: requeue errors, chained handlers, signal validation.

Every test restores the signal handlers it touches (many test files share one
process per rank).
"""

from __future__ import annotations

import os
import signal
import warnings

import pytest

import hpcdist as dist

ck = pytest.importorskip("hpcdist.checkpoint")


@pytest.fixture
def saved_handlers():
    """Put SIGUSR1/SIGUSR2's handlers back after the test, whatever it did."""
    before = {s: signal.getsignal(s) for s in (signal.SIGUSR1, signal.SIGUSR2)}
    yield
    for s, h in before.items():
        signal.signal(s, h)


@pytest.fixture
def slurm_job(monkeypatch):
    monkeypatch.setenv("SLURM_JOB_ID", "424242")


def _owner(sig):
    """The Preemption whose handler is installed for ``sig``, or None."""
    return getattr(signal.getsignal(sig), "__self__", None)


def _agree_raises(fn, exc):
    """Call fn; return the message of the exc it raised (None if none) — every rank must agree."""
    try:
        fn()
    except exc as e:
        msg = str(e)
    else:
        msg = None
    msgs: list = [None] * dist.get_world_size()
    dist.all_gather_object(msgs, msg)
    assert len(set(msgs)) == 1, msgs
    return msg


def test_requeue_missing_scontrol_raises_on_every_rank(saved_handlers, slurm_job, tmp_path):
    with ck.Preemption() as pre:
        msg = _agree_raises(lambda: pre.requeue(scontrol=str(tmp_path / "no-such-scontrol")), RuntimeError)
    assert msg is not None and "no-such-scontrol requeue 424242" in msg and "FileNotFoundError" in msg


def test_requeue_scontrol_not_executable_raises_on_every_rank(saved_handlers, slurm_job, tmp_path):
    script = tmp_path / "scontrol"
    script.write_text("#!/bin/sh\nexit 0\n")  # not chmod +x: PermissionError on rank 0
    with ck.Preemption() as pre:
        msg = _agree_raises(lambda: pre.requeue(scontrol=str(script)), RuntimeError)
    assert msg is not None and "could not run" in msg and "PermissionError" in msg


def test_requeue_failing_scontrol_still_reports_stderr(saved_handlers, slurm_job, tmp_path):
    script = tmp_path / "scontrol"
    script.write_text("#!/bin/sh\necho 'scontrol: error: Invalid job id' >&2\nexit 1\n")
    script.chmod(0o755)
    with ck.Preemption() as pre:
        msg = _agree_raises(lambda: pre.requeue(scontrol=str(script)), RuntimeError)
    assert msg is not None and "scontrol requeue 424242 failed: scontrol: error: Invalid job id" in msg


def test_requeue_bad_scontrol_argument(saved_handlers, slurm_job):
    with ck.Preemption() as pre:
        for bad in ("", None, 3):
            with pytest.raises(ValueError, match="scontrol must be a command name or path, got"):
                pre.requeue(scontrol=bad)


def test_two_preemptions_both_see_the_signal(saved_handlers):
    signal.signal(signal.SIGUSR1, signal.SIG_IGN)  # should p1's uninstall wrongly restore SIG_DFL, USR1 would kill
    p1 = ck.Preemption()
    p2 = ck.Preemption()
    try:
        os.kill(os.getpid(), signal.SIGUSR1)
        assert p1.requested and p2.requested
        assert p1.received == p2.received == signal.SIGUSR1
    finally:
        p2.uninstall()
        p1.uninstall()
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN


def test_uninstall_first_of_two_keeps_the_second(saved_handlers):
    calls = []
    base = lambda s, f: calls.append(s)  # noqa: E731 - a plain Python handler under both
    signal.signal(signal.SIGUSR1, base)
    p1 = ck.Preemption()
    p2 = ck.Preemption()
    try:
        p1.uninstall()  # not the installed handler any more: p2's stays
        assert _owner(signal.SIGUSR1) is p2
        os.kill(os.getpid(), signal.SIGUSR1)
        assert p2.requested and not p1.requested  # p1 is switched off
        assert calls == [signal.SIGUSR1]  # the chain still reaches the handler under p1
        p2.uninstall()  # p1's (switched-off) handler is skipped: the original comes back
        assert signal.getsignal(signal.SIGUSR1) is base
        p1.uninstall()  # idempotent
        assert signal.getsignal(signal.SIGUSR1) is base
    finally:
        p2.uninstall()
        p1.uninstall()


def test_uninstall_in_order_restores_original(saved_handlers):
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    with ck.Preemption(), ck.Preemption() as p2:
        assert _owner(signal.SIGUSR1) is p2
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    assert _owner(signal.SIGUSR1) is None


def test_bad_signal_restores_what_was_installed(saved_handlers):
    sentinel = lambda s, f: None  # noqa: E731
    signal.signal(signal.SIGUSR2, sentinel)
    with pytest.raises(ValueError, match=r"signals must be .* got .*SIGKILL"):
        ck.Preemption(signals=(signal.SIGUSR2, signal.SIGKILL))
    assert signal.getsignal(signal.SIGUSR2) is sentinel
    with pytest.raises(ValueError, match=r"signals must be .* got .*SIGSTOP"):
        ck.Preemption(signals=[signal.SIGSTOP])
    for bad in ((), "SIGUSR1", (signal.SIGUSR1, 0), (10**6,), (-1,), (True,), 3.5, None):
        with pytest.raises(ValueError, match="signals must be"):
            ck.Preemption(signals=bad)
    assert signal.getsignal(signal.SIGUSR2) is sentinel


def test_install_failing_part_way_rolls_back(saved_handlers, monkeypatch):
    sentinel = lambda s, f: None  # noqa: E731
    signal.signal(signal.SIGUSR2, sentinel)
    real = signal.signal

    def refuse_usr1(signum, handler):  # as the OS refusing one signal (EINVAL) after USR2 was installed
        if signum == signal.SIGUSR1 and handler is not signal.SIG_DFL:
            raise OSError(22, "Invalid argument")
        return real(signum, handler)

    monkeypatch.setattr(signal, "signal", refuse_usr1)
    with pytest.raises(ValueError, match=r"signals must be signals Python can catch, got .*Invalid argument"):
        ck.Preemption(signals=(signal.SIGUSR2, signal.SIGUSR1))
    monkeypatch.undo()
    assert signal.getsignal(signal.SIGUSR2) is sentinel


def test_single_signal_not_in_a_tuple(saved_handlers):
    with ck.Preemption(signals=signal.SIGUSR2) as pre:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert pre.received == signal.SIGUSR2
    with ck.Preemption(signals=(signal.SIGUSR1, signal.SIGUSR1)) as pre:  # a duplicate is one handler
        os.kill(os.getpid(), signal.SIGUSR1)
        assert pre.requested
    assert _owner(signal.SIGUSR1) is None


def test_restart_count(monkeypatch):
    monkeypatch.delenv("SLURM_RESTART_COUNT", raising=False)
    assert ck.Preemption.restart_count() == 0
    monkeypatch.setenv("SLURM_RESTART_COUNT", "3")
    assert ck.Preemption.restart_count() == 3
    for bad in ("x", "-1", "1.5"):
        monkeypatch.setenv("SLURM_RESTART_COUNT", bad)
        with pytest.raises(ValueError, match=f"SLURM_RESTART_COUNT must be a non-negative integer, got '{bad}'"):
            ck.Preemption.restart_count()


def test_non_member_should_stop_and_requeue_raise_alike(saved_handlers, monkeypatch):
    n, r = dist.get_world_size(), dist.get_rank()
    if n < 2:
        pytest.skip("needs >= 2 ranks (a group that leaves one rank out)")
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    g = dist.new_group([0])
    got = []
    with ck.Preemption(group=g) as pre:
        if r == 0:
            got = [pre.should_stop(), pre.requeue()]  # outside Slurm: False, False
        else:
            for call in (pre.should_stop, pre.requeue):
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("error")  # a ValueError, not a warning
                        got.append(call())
                except Exception as e:
                    got.append(f"{type(e).__name__}: {e}")
    dist.barrier()  # every rank gets here, whatever it saw
    if r == 0:
        assert got == [False, False]
    else:
        assert got == [
            "ValueError: Preemption.should_stop: this rank is not a member of the group; only members call it",
            "ValueError: Preemption.requeue: this rank is not a member of the group; only members call it",
        ]
