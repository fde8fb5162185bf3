"""FileStore: life cycle, stale/reused file detection, several processes on one file."""

from __future__ import annotations

import os
import subprocess
import sys
from datetime import timedelta

import pytest

from hpcdist.errors import DistStoreError, DistTimeoutError
from hpcdist.store import FileStore

T10 = timedelta(seconds=10)


@pytest.mark.timeout(30)
def test_last_user_deletes_the_file_and_the_path_is_reusable(tmp_path):
    path = str(tmp_path / "fs")
    a, b = FileStore(path, 2), FileStore(path, 2)
    a.set("k", b"v")
    assert b.get("k") == b"v"
    assert oct(os.stat(path).st_mode & 0o777) == "0o600"
    a.close()
    assert os.path.exists(path)
    b.close()
    assert not os.path.exists(path)
    with FileStore(path, 1) as fresh:  # a new job on the same path starts clean
        assert fresh.num_keys() == 0
    assert not os.path.exists(path)


@pytest.mark.timeout(30)
def test_unknown_world_size_deletes_when_every_opener_closed(tmp_path):
    path = str(tmp_path / "fs")
    a = FileStore(path)
    b = FileStore(path)
    a.close()
    assert os.path.exists(path)
    b.close()
    assert not os.path.exists(path)


@pytest.mark.timeout(30)
def test_file_already_used_by_a_whole_job_is_refused(tmp_path):
    path = str(tmp_path / "fs")
    users = [FileStore(path, 2) for _ in range(2)]
    with pytest.raises(DistStoreError, match=r"already opened by 2 processes of a world_size=2.*delete it"):
        FileStore(path, 2)
    for u in users:
        u.close()


@pytest.mark.timeout(30)
def test_file_left_by_a_crashed_job_is_refused(tmp_path):
    path = str(tmp_path / "fs")
    code = (
        "import os, sys\n"
        "from hpcdist.store import FileStore\n"
        "a = FileStore(sys.argv[1], 2); b = FileStore(sys.argv[1], 2)\n"
        "a.set('old', b'data')\n"
        "os._exit(0)  # crash: nobody closes\n"
    )
    subprocess.run([sys.executable, "-c", code, path], check=True, timeout=60)
    assert os.path.exists(path)
    with pytest.raises(DistStoreError, match=rf"left over from an earlier run.*rm {path}"):
        FileStore(path, 2)


@pytest.mark.timeout(30)
def test_world_size_mismatch_is_refused(tmp_path):
    path = str(tmp_path / "fs")
    a = FileStore(path, 4)
    with pytest.raises(DistStoreError, match=r"created for world_size=4.*world_size=2.*delete it"):
        FileStore(path, 2)
    a.close()


@pytest.mark.timeout(30)
def test_foreign_file_is_refused(tmp_path):
    path = tmp_path / "not-a-store"
    path.write_bytes(b"hello, I am some other file\n")
    with pytest.raises(DistStoreError, match="not an hpcdist FileStore file"):
        FileStore(str(path), 1)
    assert path.read_bytes().startswith(b"hello")  # untouched


@pytest.mark.timeout(30)
def test_clone_is_not_a_user(tmp_path):
    path = str(tmp_path / "fs")
    a = FileStore(path, 1)
    c = a.clone()
    c.set("k", b"v")
    assert a.get("k") == b"v"
    c.close()
    assert os.path.exists(path)
    a.close()
    assert not os.path.exists(path)
    with pytest.raises(DistStoreError, match="closed"):
        a.get("k")


@pytest.mark.timeout(30)
def test_constructor_argument_errors(tmp_path):
    with pytest.raises(ValueError, match=r"world_size must be -1 \(unknown\) or >= 1, got 0"):
        FileStore(str(tmp_path / "x"), 0)
    with pytest.raises(TypeError, match=r"world_size must be an int, got str"):
        FileStore(str(tmp_path / "x"), "2")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"file_name must be a str or os\.PathLike, got int"):
        FileStore(3)  # type: ignore[arg-type]
    with FileStore(tmp_path / "pathlike", 1) as s:  # os.PathLike accepted
        assert s.path == str(tmp_path / "pathlike")


_WORKER = """
import sys
from datetime import timedelta
from hpcdist.store import FileStore
path, rank, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
s = FileStore(path, n, timeout=timedelta(seconds=30))
for _ in range(200):
    s.add("counter", 1)
s.set(f"rank{rank}", str(rank))
s.queue_push("q", f"from{rank}")
s.barrier("done", n)
assert s.get("counter") == str(200 * n).encode(), s.get("counter")
assert s.multi_get([f"rank{r}" for r in range(n)]) == [str(r).encode() for r in range(n)]
popped = s.queue_pop("q")
print(popped.decode())
s.barrier("popped", n)
assert s.queue_len("q") == 0
s.close()
"""


@pytest.mark.timeout(120)
def test_several_processes_share_one_file(tmp_path):
    path = str(tmp_path / "shared")
    n = 3
    procs = [
        subprocess.Popen([sys.executable, "-c", _WORKER, path, str(r), str(n)], stdout=subprocess.PIPE, text=True)
        for r in range(n)
    ]
    outs = []
    for p in procs:
        out, _ = p.communicate(timeout=100)
        assert p.returncode == 0
        outs.append(out.strip())
    assert sorted(outs) == [f"from{r}" for r in range(n)]  # every item popped exactly once
    assert not os.path.exists(path)  # the last of the n users deleted it


@pytest.mark.parametrize(("world_size", "cap"), [(-1, 0.01), (2, 0.01), (64, 0.01), (512, 0.08), (4096, 0.64)])
def test_blocking_calls_poll_less_often_in_large_worlds(tmp_path, monkeypatch, world_size, cap):
    """Each poll of a blocking call takes the file's lock and reads it: 10 ms apart at most (torch's) up to 64
    users, 10 ms per 64 of them beyond (4096 ranks polling each 10 ms: 400,000 lock requests a second). The
    pauses a real wait takes, recorded instead of slept, double from 0.5 ms up to the cap."""
    import threading
    import time

    pauses: list[float] = []
    clock = [0.0]
    me = threading.get_ident()
    real_sleep, real_monotonic = time.sleep, time.monotonic

    def sleep(seconds: float) -> None:  # no real sleeping here: the clock moves by what was asked
        if threading.get_ident() != me:  # the time module is shared: other threads of the process sleep for real
            return real_sleep(seconds)
        pauses.append(seconds)
        clock[0] += seconds

    monkeypatch.setattr(time, "sleep", sleep)
    monkeypatch.setattr(time, "monotonic", lambda: clock[0] if threading.get_ident() == me else real_monotonic())
    store = FileStore(str(tmp_path / "f"), world_size)
    with pytest.raises(DistTimeoutError):
        store.wait(["never"], timedelta(seconds=30))
    assert pauses[:3] == [0.0005, 0.001, 0.002]
    assert max(pauses) == pytest.approx(cap) and pauses[-2] == pytest.approx(cap)  # the last is cut at the deadline
    assert sum(pauses) == pytest.approx(30)
    monkeypatch.undo()
    store.close()
