"""Work semantics, timeouts, MPI errors and bad input of backend "hpcdist" at 2 ranks.

Each check records True/False (or a message) per rank; the test asserts them.

* an ``irecv`` Work is not complete before the peer sends, then holds the data;
* an ``all_reduce(async_op=True)`` Work is not complete before the peer joins;
  ``get_future().wait()`` and a chained ``then`` give the result;
* ``wait(timeout)`` raises DistTimeoutError and fails the Work (a receive is cancelled); a
  group's timeout bounds ``wait()``;
* an MPI error (a receive into too small a buffer) surfaces through ``wait()``
  and through the future;
* an unsupported dtype and an op the dtype does not support raise on one rank
  before any message moves (the other rank carries on with the next collective);
* the group's ``monitored_barrier`` (torch's function refuses non-gloo backends) passes when
  every rank comes and names the missing rank in gloo's words when one does not;
* ``mode=crash``: rank 1 raises while rank 0 waits in a collective: the job ends.
* ``mode=crash_mpi``: rank 1's receive fails in MPI (truncation), ``wait()`` raises it and
  nothing handles it, while rank 0 waits in a collective: the job ends.

Usage: mpiexec -n 2 python semantics.py hpcdist OUTDIR [crash|crash_mpi]
"""

from __future__ import annotations

import sys
import time
import warnings
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from common import args, init, save

backend, outdir = args()
rank, n = init(backend)
peer = 1 - rank
res: dict[str, Any] = {}

if len(sys.argv) > 3 and sys.argv[3] == "crash":
    if rank == 1:
        raise RuntimeError("rank 1 fails on purpose")
    dist.all_reduce(torch.ones(2))  # never completes: rank 1 is gone
    raise SystemExit("rank 0: the all_reduce returned although rank 1 died")
if len(sys.argv) > 3 and sys.argv[3] == "crash_mpi":
    if rank == 0:
        dist.send(torch.arange(8.0), 1, tag=3)
        dist.all_reduce(torch.ones(2))  # never completes: rank 1 is gone
        raise SystemExit("rank 0: the all_reduce returned although rank 1 died")
    dist.irecv(torch.zeros(4), 0, tag=3).wait()  # MPI's truncation error, raised by wait() and not handled
    raise SystemExit("rank 1: the truncated receive raised nothing")

# -- an irecv is pending until the peer sends (the peer sends only when told)
go = torch.zeros(1)
if rank == 1:
    buf = torch.zeros(3)
    w = dist.irecv(buf, 0, tag=5)
    time.sleep(0.2)
    res["irecv_pending_before_send"] = not w.is_completed()
    dist.send(go, 0, tag=6)  # now rank 0 may send
    w.wait()
    res["irecv_value"] = torch.equal(buf, torch.tensor([1.0, 2.0, 3.0]))
    res["irecv_completed_after_wait"] = w.is_completed() and w.is_success()
else:
    dist.recv(go, 1, tag=6)
    dist.send(torch.tensor([1.0, 2.0, 3.0]), 1, tag=5)

# -- a collective Work is pending until the peer joins
t = torch.full((4,), float(rank + 1))
if rank == 0:
    w = dist.all_reduce(t, async_op=True)
    time.sleep(0.2)
    res["allreduce_pending_before_peer"] = not w.is_completed()
    dist.send(go, 1, tag=7)  # now rank 1 joins
    fut = w.get_future()
    chained = fut.then(lambda f: f.value()[0] * 10)
    res["future_value"] = torch.equal(fut.wait()[0], torch.full((4,), 3.0))
    res["then_value"] = torch.equal(chained.wait(), torch.full((4,), 30.0))
else:
    dist.recv(go, 0, tag=7)
    dist.all_reduce(t)
res["allreduce_result"] = torch.equal(t, torch.full((4,), 3.0))

# -- wait(timeout) and the group's timeout
if rank == 0:
    buf = torch.zeros(1)
    w = dist.irecv(buf, 1, tag=9)
    t0 = time.monotonic()
    try:
        w.wait(timedelta(seconds=1))
        res["wait_timeout"] = "no error"
    except TimeoutError as exc:
        res["wait_timeout"] = "did not complete" in str(exc) and time.monotonic() - t0 < 30
    res["failed_after_timeout"] = w.is_completed() and not w.is_success() and w.exception() is not None
    dist.send(go, 1, tag=10)
    fresh = torch.zeros(1)
    dist.recv(fresh, 1, tag=9)  # the timed-out receive was cancelled: this one gets the late message
    res["late_message_to_fresh_recv"] = float(fresh[0]) == 42.0 and float(buf[0]) == 0.0
else:
    dist.recv(go, 0, tag=10)
    dist.send(torch.tensor([42.0]), 0, tag=9)
short = dist.new_group([0, 1], timeout=timedelta(seconds=2))
if rank == 0:
    buf = torch.zeros(1)
    w = dist.irecv(buf, 1, tag=11, group=short)
    t0 = time.monotonic()
    try:
        w.wait()
        res["group_timeout"] = "no error"
    except TimeoutError:
        res["group_timeout"] = time.monotonic() - t0 < 60
    dist.send(go, 1, tag=12)
    dist.recv(buf, 1, tag=11, group=short)
else:
    dist.recv(go, 0, tag=12)
    dist.send(torch.tensor([1.0]), 0, tag=11, group=short)

# -- an MPI error (truncation) surfaces through wait() and the future
if rank == 0:
    dist.send(torch.arange(8.0), 1, tag=13)
    dist.send(torch.arange(8.0), 1, tag=14)
else:
    small = torch.zeros(4)
    w = dist.irecv(small, 0, tag=13)
    try:
        w.wait()
        res["mpi_error_wait"] = "no error"
    except Exception as exc:
        res["mpi_error_wait"] = "truncat" in str(exc).lower()
    w = dist.irecv(torch.zeros(4), 0, tag=14)
    try:
        w.get_future().wait()
        res["mpi_error_future"] = "no error"
    except Exception as exc:
        res["mpi_error_future"] = "truncat" in str(exc).lower()

# -- bad input on one rank raises before anything moves; the next collective still matches
if rank == 0:
    try:
        with warnings.catch_warnings():  # torch deprecates quantized tensors: still a dtype no backend moves
            warnings.simplefilter("ignore")
            quantized = torch.quantize_per_tensor(torch.zeros(3), 0.1, 0, torch.qint8)
        dist.all_reduce(quantized)
        res["bad_dtype"] = "no error"
    except TypeError as exc:
        res["bad_dtype"] = str(exc)
    try:
        dist.all_reduce(torch.zeros(3), op=dist.ReduceOp.BAND)
        res["bad_op"] = "no error"
    except ValueError as exc:
        res["bad_op"] = str(exc)
t = torch.full((2,), float(rank))
dist.all_reduce(t)
res["after_bad_input"] = torch.equal(t, torch.full((2,), 1.0))

# -- the group's monitored_barrier: passes when all come; rank 0 names a missing one in gloo's words
world = dist.group.WORLD
world.monitored_barrier(timedelta(seconds=60))
if rank == 0:
    try:
        world.monitored_barrier(timedelta(seconds=1))  # rank 1 does not come
        res["monitored_missing"] = "no error"
    except RuntimeError as exc:
        res["monitored_missing"] = str(exc)
dist.barrier()

save(outdir, "semantics", res)
dist.destroy_process_group()
