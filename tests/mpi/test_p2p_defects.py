"""Point-to-point and Work handles under adversarial use (found in the adversarial p2p/objects round).

* A message larger than the receive buffer: MPI completes the receive with
  MPI_ERR_TRUNCATE. hpcdist raised mpi4py's bare ``MPI.Exception`` out of
  ``wait()`` and then called the Work a success (``is_success()`` True,
  ``exception()`` None, a second ``wait()`` True, the future's value the
  truncated array). Now: a :class:`~hpcdist.DistBackendError` that says the
  message is larger than the buffer, and the Work stays failed.
* ``wait()`` again after a receive timed out (and was cancelled) ran the
  finishing step of the cancelled receive: ``source_rank()`` then named a
  rank that never sent (this rank itself) and the copy-back wrote the
  staging buffer over the caller's array.
"""

from __future__ import annotations

from datetime import timedelta

import numpy as np
import pytest

import hpcdist as dist


def me() -> int:
    return dist.get_rank()


def pairs() -> tuple[int, int]:
    """(sender, receiver): global ranks 0 and 1; skips below 2 ranks."""
    if dist.get_world_size() < 2:
        pytest.skip("needs 2 or more ranks")
    return 0, 1


def test_truncated_receive_raises_backend_error_and_the_work_stays_failed():
    sender, receiver = pairs()
    if me() == sender:
        dist.send(np.arange(8, dtype=np.float64), dst=receiver, tag=21)
        dist.send(np.arange(8, dtype=np.float64), dst=receiver, tag=22)
        dist.send(np.arange(6, dtype=np.float64), dst=receiver, tag=23)
    elif me() == receiver:
        w = dist.irecv(np.zeros(4), src=sender, tag=21)
        with pytest.raises(dist.DistBackendError, match="larger than the receive buffer") as info:
            w.wait()
        assert w.is_completed() and not w.is_success()
        assert w.exception() is info.value
        with pytest.raises(dist.DistBackendError, match="larger than the receive buffer"):
            w.wait()  # a failed Work stays failed
        with pytest.raises(dist.DistBackendError):
            w.get_future().wait()
        with pytest.raises(dist.DistBackendError):
            w.source_rank()
        # the blocking receive says the same
        with pytest.raises(dist.DistBackendError, match="larger than the receive buffer"):
            dist.recv(np.zeros(4), src=sender, tag=22)
        # polled with is_completed() instead of wait(): the same failure
        w = dist.irecv(np.zeros(3), src=sender, tag=23)
        while not w.is_completed():
            pass
        assert not w.is_success() and isinstance(w.exception(), dist.DistBackendError)
    if me() in (sender, receiver):  # a receive of the right size still works
        y = np.zeros(5)
        if me() == sender:
            dist.send(np.arange(5.0), dst=receiver, tag=24)
        else:
            assert dist.recv(y, src=sender, tag=24) == sender and y.tolist() == [0.0, 1.0, 2.0, 3.0, 4.0]


def test_batch_receive_truncated_fails_its_work():
    sender, receiver = pairs()
    if me() == sender:
        (w,) = dist.batch_isend_irecv([dist.P2POp(dist.isend, np.ones(16), receiver, tag=25)])
        w.wait()
    elif me() == receiver:
        (w,) = dist.batch_isend_irecv([dist.P2POp(dist.irecv, np.zeros(2), sender, tag=25)])
        with pytest.raises(dist.DistBackendError, match="larger than the receive buffer"):
            w.wait()
        assert not w.is_success()


def test_waiting_again_after_a_receive_timed_out_does_not_finish_the_cancelled_receive():
    sender, receiver = pairs()
    if me() == receiver:
        base = np.full(8, 7.0)
        target = base[::2]  # non-contiguous: received into a staging buffer, copied back on completion
        w = dist.irecv(target, src=sender, tag=26)
        with pytest.raises(dist.DistTimeoutError):
            w.wait(timeout=timedelta(seconds=0.2))
        with pytest.raises(dist.DistTimeoutError):
            w.wait()  # no second wait on a cancelled request, no copy-back
        with pytest.raises(dist.DistBackendError, match="only defined for completed receives"):
            w.source_rank()
        assert w.is_completed() and not w.is_success()
        assert base.tolist() == [7.0] * 8
        with pytest.raises(dist.DistTimeoutError):
            w.get_future().wait()
