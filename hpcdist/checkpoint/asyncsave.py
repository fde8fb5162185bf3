"""``async_save``: the host copy now, the writing and the commit in a background thread.

The calling thread does what needs MPI: flattening, the host copies (device
arrays are copied to host memory; host arrays are copied too, so the caller
may change them at once) and the two small collectives that agree on the plan.
The background thread does no MPI at all — hpcdist does not require
``MPI_THREAD_MULTIPLE`` — so the commit goes through the file system: each rank
writes its HDF5 file, fsyncs it and then a small result file
(``rank-NNNNN.result.json``, checksums or its error; written whole, then
renamed, as every file another rank polls for) into the temporary
directory; group rank 0's thread waits for all of them (the group's timeout),
writes the metadata and renames the directory; the other ranks' threads wait
until the checkpoint carries this save's token (or a ``FAILED`` marker). So the
directory where checkpoints live must be shared by the ranks (as for any save).

A failed save leaves nothing: a rank whose write fails removes its partial
file before writing its result; rank 0's thread removes every data file before
writing the ``FAILED`` marker (so a full disk has room for it), waits until
every peer has seen the marker (``rank-NNNNN.failed-seen``, up to the group's
timeout) and removes the temporary directory. Errors name the group rank and,
for a failed write, the file.

At most one async save is in flight per group: a second ``async_save`` (and
``save``/``load`` on the group) first waits for the one in flight, and raises
its error unless ``wait``/``result``/``exception`` already handed it over. Async saves
always use the per-rank layout (MPI-IO would be collective in the thread).
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import threading
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from .._ranklist import MESSAGE_LIMIT, ranks_text
from . import layout as _layout
from . import write as _write
from .api import _INFLIGHT, _INFLIGHT_LOCK, agree, group_of, prepare, wait_inflight
from .errors import CheckpointError
from .plan import Plan

__all__ = ["SaveWork", "async_save"]

_FAILED = "FAILED"


def _result_name(rank: int) -> str:
    return f"rank-{rank:05d}.result.json"


def _seen_name(rank: int) -> str:
    return f"rank-{rank:05d}.failed-seen"


class SaveWork:
    """The handle of an :func:`async_save` (like a ``Work``: ``wait``, ``is_completed``, ``exception``).

    ``wait()`` returns True once this rank's files are written and the
    checkpoint is committed (renamed into place), or raises the save's
    :class:`CheckpointError`. Every rank should wait (or start another save,
    which waits) before exiting; a process that exits first still finishes the
    write (the thread is not a daemon).
    """

    def __init__(
        self, path: Path, plan: Plan, host: list, rank: int, size: int, timeout_s: float, overwrite: bool
    ) -> None:
        self.path = path
        self._plan = plan
        self._host = host
        self._rank = rank
        self._size = size
        self._timeout_s = timeout_s
        self._overwrite = overwrite
        self._exc: BaseException | None = None
        self._seen = False  # the error was handed to the caller (wait, result, exception)
        self._thread = threading.Thread(target=self._run, name=f"hpcdist-async-save-{path.name}")

    def _start(self) -> None:
        self._thread.start()

    # ---------------------------------------------------------------- the thread
    def _run(self) -> None:
        try:
            self._write_and_commit()
        except BaseException as exc:
            self._exc = (
                exc
                if isinstance(exc, CheckpointError)
                else CheckpointError(
                    f"async save to {str(self.path)!r} failed on group rank {self._rank}: {type(exc).__name__}: {exc}"
                )
            )
        finally:
            self._host = []  # the host copies are no longer needed

    def _write_and_commit(self) -> None:
        tmp = Path(self._plan.tmp)
        result = self._write_mine(tmp)
        deadline = time.monotonic() + self._timeout_s
        if self._rank == 0:
            self._commit(tmp, result, deadline)
        else:
            self._publish(tmp, result, deadline)
            self._await_commit(tmp, deadline)
        if "error" in result:
            raise CheckpointError(
                f"async save to {str(self.path)!r} failed on group rank {self._rank}: {result['error']}"
            )

    def _write_mine(self, tmp: Path) -> dict[str, Any]:
        """This rank's file; on failure its partial file is removed (a full disk needs room for the result file)."""
        try:
            return {"records": _write.write_rank(self._plan, self._host, self._rank)}
        except Exception as exc:
            mine = tmp / _write.rank_file(self._rank)
            with contextlib.suppress(OSError):
                mine.unlink(missing_ok=True)
            return {"error": f"writing {str(mine)!r}: {type(exc).__name__}: {exc}"}

    def _publish(self, tmp: Path, result: dict[str, Any], deadline: float) -> None:
        """A rank other than 0: its result file, for rank 0's thread to collect.

        On a full disk the write is retried until the deadline: the ranks whose
        writes failed are removing their partial files meanwhile.
        """
        mine = tmp / _result_name(self._rank)
        while True:
            try:
                _layout.publish_json(mine, result)
                return
            except OSError as exc:
                if time.monotonic() > deadline or exc.errno not in (errno.ENOSPC, errno.EDQUOT):
                    earlier = f" (after: {result['error']})" if "error" in result else ""
                    raise CheckpointError(
                        f"async save to {str(self.path)!r} failed on group rank {self._rank}: cannot write its result "
                        f"file {str(mine)!r}: {exc}{earlier}; group rank 0 gives up after the group's timeout"
                    ) from None
                time.sleep(0.05)

    def _commit(self, tmp: Path, mine: dict[str, Any], deadline: float) -> None:
        names = {r: tmp / _result_name(r) for r in range(1, self._size)}
        try:
            _poll(_all_exist(list(names.values())), deadline)
        except TimeoutError:
            late = ranks_text((r for r, p in names.items() if not p.exists()), MESSAGE_LIMIT)
            self._give_up(tmp, f"group ranks {late} did not finish writing within {self._timeout_s:g}s", deadline)
        results = [mine]
        for p in names.values():
            with open(p) as fh:
                results.append(json.load(fh))
        errors = [f"group rank {r}: {res['error']}" for r, res in enumerate(results) if "error" in res]
        if errors:
            self._give_up(tmp, "; ".join(errors), deadline)
        for p in names.values():
            p.unlink()
        records = [rec for res in results for rec in res["records"]]
        try:
            _write.commit(self._plan, self.path, records, self._size, self._overwrite)
        except Exception as exc:
            self._give_up(tmp, f"group rank 0 committing: {type(exc).__name__}: {exc}", deadline)

    def _give_up(self, tmp: Path, why: str, deadline: float) -> None:
        """Rank 0: free the data files, tell the peers (FAILED marker), wait for them to see it, remove ``tmp``."""
        msg = f"async save to {str(self.path)!r} failed: {why}"
        for p in tmp.iterdir():  # the data first: a full disk then has room for the marker
            with contextlib.suppress(OSError):
                p.unlink()
        try:
            _layout.publish_json(tmp / _FAILED, {"error": msg})  # whole or absent: peers poll for it
        except OSError as exc:
            shutil.rmtree(tmp, ignore_errors=True)
            raise CheckpointError(
                f"{msg}; the {_FAILED} marker could not be written either ({exc}), so the other ranks give up "
                "after the group's timeout"
            ) from None
        seen = [tmp / _seen_name(r) for r in range(1, self._size)]
        with contextlib.suppress(TimeoutError):
            _poll(_all_exist(seen), deadline)
        shutil.rmtree(tmp, ignore_errors=True)
        raise CheckpointError(msg)

    def _await_commit(self, tmp: Path, deadline: float) -> None:
        meta = self.path / _layout.META_NAME

        def committed() -> bool:
            if (tmp / _FAILED).exists():
                return True
            try:
                with open(meta) as fh:
                    return json.load(fh).get("token") == self._plan.token
            except (OSError, ValueError):
                return False

        try:
            _poll(committed, deadline, peers=self._size - 1)
        except TimeoutError:
            raise CheckpointError(
                f"async save to {str(self.path)!r}: group rank 0 did not commit within {self._timeout_s:g}s "
                f"(seen from group rank {self._rank})"
            ) from None
        if (tmp / _FAILED).exists():
            try:
                with open(tmp / _FAILED) as fh:
                    msg = json.load(fh)["error"]
            except (OSError, ValueError, KeyError, TypeError) as exc:  # the marker is published whole; never fail here
                msg = (
                    f"async save to {str(self.path)!r} failed (group rank 0 marked it failed; its reason could not "
                    f"be read on group rank {self._rank}: {type(exc).__name__}: {exc})"
                )
            with contextlib.suppress(OSError):
                (tmp / _seen_name(self._rank)).touch()  # rank 0 removes tmp once every peer has seen it
            raise CheckpointError(msg)

    # ---------------------------------------------------------------- Work API
    def wait(self, timeout: float | None = None) -> bool:
        """Block until the save is committed; True. Raises its error, or TimeoutError after ``timeout`` s."""
        self._thread.join(timeout)
        if self._thread.is_alive():
            raise TimeoutError(f"async save to {str(self.path)!r} still running after {timeout}s")
        if self._exc is not None:
            self._seen = True
            raise self._exc
        return True

    def settle(self) -> None:
        """Wait for the save; raise its error only if nobody has seen it yet (the next save/load on the group)."""
        self._thread.join()
        if self._exc is not None and not self._seen:
            self._seen = True
            raise self._exc

    def is_completed(self) -> bool:
        """Non-blocking: has the save finished (committed or failed)?"""
        return not self._thread.is_alive()

    def exception(self) -> BaseException | None:
        """The save's error once it finished (None while running or after success)."""
        if self._thread.is_alive():
            return None
        self._seen = self._seen or self._exc is not None
        return self._exc

    # the concurrent.futures.Future names (torch's DCP async_save returns one)
    def done(self) -> bool:
        """Same as :meth:`is_completed`."""
        return self.is_completed()

    def result(self, timeout: float | None = None) -> Path:
        """Wait (see :meth:`wait`) and return the checkpoint's path."""
        self.wait(timeout)
        return self.path

    def __repr__(self) -> str:
        state = "pending" if self._thread.is_alive() else ("failed" if self._exc else "committed")
        return f"<hpcdist.checkpoint.SaveWork {str(self.path)!r} {state}>"


def _delays(peers: int) -> Iterator[float]:
    """The pauses between polls: from 2 ms, doubling, to 0.2 s, or longer where ``peers`` ranks poll the same file
    system alike (0.2 s per 256 of them): 4096 ranks polling each 0.2 s are 20,000 metadata requests a second to
    a parallel file system's server."""
    delay, cap = 0.002, 0.2 * max(1.0, peers / 256)
    while True:
        yield delay
        delay = min(delay * 2, cap)


def _poll(ready: Any, deadline: float, peers: int = 1) -> None:
    """Call ``ready()`` until it is true (pausing as :func:`_delays` says); TimeoutError past ``deadline``."""
    for delay in _delays(peers):
        if ready():
            return
        if time.monotonic() > deadline:
            raise TimeoutError
        time.sleep(delay)


def _all_exist(paths: list[Any]) -> Any:
    """A ``ready()`` for :func:`_poll`: true once every path exists. Each call stats only the paths still missing,
    in order, stopping at the first: about one stat per poll, not one per rank (``all(p.exists() ...)`` stats again
    every file that already arrived)."""
    pending = deque(paths)

    def ready() -> bool:
        while pending and pending[0].exists():
            pending.popleft()
        return not pending

    return ready


def async_save(
    state: dict[str, Any], path: str | os.PathLike, group: Any = None, *, overwrite: bool = False
) -> SaveWork:
    """Start saving ``state`` as ``path``; returns once the state is copied to host memory. Collective.

    Args:
        state: as for :func:`save`. Its arrays are copied before return: the
            caller may change them at once.
        path: the checkpoint's directory (on a file system every rank sees).
        group: the process group (default: the world). Every member calls.
        overwrite: replace an existing checkpoint at ``path``.

    Returns:
        A :class:`SaveWork`; ``wait()`` on it (on every rank) before relying on
        the checkpoint. A save already in flight on the group is waited for first.
    """
    pg = group_of(group, "checkpoint.async_save")
    wait_inflight(pg)
    final = Path(path).absolute()
    host = prepare(pg, state, copy=True)
    plan = agree(pg, host, final, "per-rank", overwrite)
    work = SaveWork(final, plan, host, pg.rank(), pg.size(), pg._timeout_s, overwrite)
    with _INFLIGHT_LOCK:
        _INFLIGHT[pg] = work
    work._start()
    return work
