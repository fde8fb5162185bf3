"""The Store API, one test body over every store kind.

Kinds: HashStore, FileStore, TCPStore (a real server on loopback) and a
PrefixStore over each. Where a second handle is needed it is ``clone()``:
another thread's view for HashStore, another file descriptor replaying the
log for FileStore, another authenticated TCP connection for TCPStore.
"""

from __future__ import annotations

import threading
import time
from datetime import timedelta

import pytest

from hpcdist.errors import DistError, DistStoreError, DistTimeoutError, QueueEmptyError
from hpcdist.store import FileStore, HashStore, PrefixStore, Store, TCPStore

KINDS = ["hash", "file", "tcp", "prefix-hash", "prefix-file", "prefix-tcp"]
SHORT = timedelta(seconds=0.2)
HANG_GUARD = 20.0  # seconds; a generous bound that only catches hangs


def _make(kind: str, tmp_path) -> tuple[Store, list]:
    closers: list = []
    base = kind.removeprefix("prefix-")
    if base == "hash":
        store: Store = HashStore(timeout=timedelta(seconds=30))
    elif base == "file":
        store = FileStore(str(tmp_path / "store"), -1, timeout=timedelta(seconds=30))
        closers.append(store.close)
    else:
        store = TCPStore("127.0.0.1", 0, 1, True, timedelta(seconds=30))
        closers.append(store.close)
    if kind.startswith("prefix-"):
        store = PrefixStore("ns", store)
    return store, closers


@pytest.fixture(params=KINDS)
def store(request, tmp_path):
    s, closers = _make(request.param, tmp_path)
    yield s
    for close in closers:
        close()


@pytest.mark.timeout(30)
def test_set_get_bytes_and_str(store):
    store.set("a", b"\x00\xff")
    store.set("b", "héllo")
    store.set("c", bytearray(b"xy"))
    store.set("d", memoryview(b"mv"))
    store.set("e", b"")
    assert store.get("a") == b"\x00\xff"
    assert store.get("b") == "héllo".encode()
    assert store.get("c") == b"xy"
    assert store.get("d") == b"mv"
    assert store.get("e") == b""
    assert isinstance(store.get("a"), bytes)
    store.set("a", "replaced")
    assert store.get("a") == b"replaced"


@pytest.mark.timeout(30)
def test_add_counts_and_stores_decimal(store):
    assert store.add("n", 5) == 5
    assert store.add("n", -7) == -2
    assert store.get("n") == b"-2"
    store.set("m", "40")
    assert store.add("m", 2) == 42
    store.set("text", "abc")
    with pytest.raises(ValueError, match="not an integer"):
        store.add("text", 1)
    assert store.get("text") == b"abc"


@pytest.mark.timeout(30)
def test_compare_set_torch_semantics(store):
    # missing key, expected "" -> set, returns desired
    assert store.compare_set("k", "", "v1") == b"v1"
    assert store.get("k") == b"v1"
    # missing key, expected non-empty -> nothing set, returns expected
    assert store.compare_set("absent", "exp", "v") == b"exp"
    assert not store.check(["absent"])
    # present, matching -> swapped
    assert store.compare_set("k", "v1", "v2") == b"v2"
    # present, not matching -> unchanged, returns current
    assert store.compare_set("k", "zzz", "v3") == b"v2"
    assert store.get("k") == b"v2"


@pytest.mark.timeout(30)
def test_keys_check_delete_list(store):
    assert store.num_keys() == 0
    assert store.list_keys() == []
    store.multi_set(["x", "y", "z"], [b"1", "2", b"3"])
    assert store.multi_get(["z", "x"]) == [b"3", b"1"]
    assert store.num_keys() == 3
    assert sorted(store.list_keys()) == ["x", "y", "z"]
    assert store.check(["x", "y"])
    assert not store.check(["x", "nope"])
    assert store.check([])
    assert store.delete_key("y") is True
    assert store.delete_key("y") is False
    assert sorted(store.list_keys()) == ["x", "z"]
    assert store.num_keys() == 2


@pytest.mark.timeout(30)
def test_append(store):
    store.append("log", "a")
    store.append("log", b"bc")
    assert store.get("log") == b"abc"


@pytest.mark.timeout(30)
def test_queues_fifo_and_separate_namespace(store):
    assert store.queue_len("q") == 0
    for item in (b"1", "2", b"3"):
        store.queue_push("q", item)
    assert store.queue_len("q") == 3
    assert store.num_keys() == 0  # queues are not keys
    assert not store.check(["q"])
    assert [store.queue_pop("q") for _ in range(3)] == [b"1", b"2", b"3"]
    assert store.queue_len("q") == 0
    with pytest.raises(QueueEmptyError, match="q' is empty"):
        store.queue_pop("q", block=False)
    assert issubclass(QueueEmptyError, DistStoreError)


@pytest.mark.timeout(30)
def test_blocking_get_is_woken_by_another_handle(store):
    other = store.clone()
    got: list[bytes] = []
    t = threading.Thread(target=lambda: got.append(store.get("late")))
    t.start()
    time.sleep(0.1)
    other.set("late", b"here")
    t.join(HANG_GUARD)
    assert got == [b"here"]


@pytest.mark.timeout(30)
def test_blocking_queue_pop_and_wait_are_woken(store):
    other = store.clone()
    got: list[object] = []

    def consumer() -> None:
        got.append(store.queue_pop("jobs"))
        store.wait(["w1", "w2"])
        got.append("waited")

    t = threading.Thread(target=consumer)
    t.start()
    time.sleep(0.05)
    other.queue_push("jobs", b"job")
    other.set("w1", b"")
    time.sleep(0.05)
    other.add("w2", 1)
    t.join(HANG_GUARD)
    assert got == [b"job", "waited"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("op", ["get", "wait", "multi_get", "queue_pop"])
def test_blocking_ops_time_out_on_time_and_store_stays_usable(store, op):
    store.set("present", b"1")
    store.set_timeout(SHORT)
    calls = {
        "get": lambda: store.get("missing"),
        "wait": lambda: store.wait(["present", "missing"]),
        "multi_get": lambda: store.multi_get(["present", "missing"]),
        "queue_pop": lambda: store.queue_pop("missing"),
    }
    start = time.monotonic()
    with pytest.raises(DistTimeoutError) as info:
        calls[op]()
    elapsed = time.monotonic() - start
    assert elapsed >= SHORT.total_seconds()  # the test's time limit guards a hang
    assert "missing" in str(info.value)
    assert "present" not in str(info.value)
    assert isinstance(info.value, TimeoutError) and isinstance(info.value, DistError)
    store.set_timeout(timedelta(seconds=30))
    store.set("after", b"ok")
    assert store.get("after") == b"ok"


@pytest.mark.timeout(30)
def test_wait_explicit_timeout_overrides_store_timeout(store):
    start = time.monotonic()
    with pytest.raises(DistTimeoutError):
        store.wait(["never"], timedelta(seconds=0.2))
    assert time.monotonic() - start >= 0.2  # waited the explicit timeout; the test's limit guards a hang
    assert store.timeout == timedelta(seconds=30)


@pytest.mark.timeout(30)
def test_very_long_timeout_is_accepted(store):
    store.set_timeout(timedelta(days=10000))
    other = store.clone()
    got: list[bytes] = []
    t = threading.Thread(target=lambda: got.append(store.get("eventually")))
    t.start()
    time.sleep(0.05)
    other.set("eventually", b"1")
    t.join(HANG_GUARD)
    assert got == [b"1"]
    store.wait(["eventually"], timedelta.max)


@pytest.mark.timeout(30)
def test_barrier_threads(store):
    n = 3
    handles = [store] + [store.clone() for _ in range(n - 1)]
    errors: list[BaseException] = []

    def arrive(h: Store) -> None:
        try:
            h.barrier("b1", n)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=arrive, args=(h,)) for h in handles]
    for t in threads:
        t.start()
    for t in threads:
        t.join(HANG_GUARD)
    assert errors == []
    store.barrier("solo", 1)


@pytest.mark.timeout(30)
def test_barrier_times_out_saying_who_arrived(store):
    with pytest.raises(DistTimeoutError, match="1 of 2"):
        store.barrier("lonely", 2, timedelta(seconds=0.2))


@pytest.mark.timeout(30)
def test_timeout_property_and_set_timeout(store):
    assert store.timeout == timedelta(seconds=30)
    store.set_timeout(timedelta(seconds=7))
    assert store.timeout == timedelta(seconds=7)
    with pytest.raises(TypeError, match=r"timeout must be a datetime\.timedelta, got int"):
        store.set_timeout(5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="positive"):
        store.set_timeout(timedelta(0))
    assert store.has_extended_api() is True


@pytest.mark.timeout(30)
def test_clone_sees_the_same_data(store):
    store.set("shared", b"1")
    c = store.clone()
    assert type(c) is type(store)
    assert c.get("shared") == b"1"
    c.set("from_clone", b"2")
    assert store.get("from_clone") == b"2"


@pytest.mark.timeout(30)
def test_argument_errors_name_argument_expected_and_given(store):
    with pytest.raises(TypeError, match=r"key must be a str, got int"):
        store.set(1, b"x")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"value must be bytes, bytearray, memoryview or str, got int"):
        store.set("k", 5)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"keys must be a sequence of str keys, got a single str"):
        store.wait("abc")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"keys\[1\] must be a str, got bytes"):
        store.check(["a", b"b"])  # type: ignore[list-item]
    with pytest.raises(TypeError, match=r"amount must be an int, got float"):
        store.add("k", 1.5)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"same length, got 2 keys and 1 values"):
        store.multi_set(["a", "b"], [b"1"])
    with pytest.raises(TypeError, match=r"block must be a bool"):
        store.queue_pop("q", block=0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"world_size must be >= 1, got 0"):
        store.barrier("b", 0)
    with pytest.raises(TypeError, match=r"amount must be an int, got bool \(True\)"):
        store.add("k", True)
    with pytest.raises(TypeError, match=r"world_size must be an int, got str \('2'\)"):
        store.barrier("b", "2")  # type: ignore[arg-type]


@pytest.mark.timeout(30)
def test_large_value_round_trip(store):
    value = bytes(range(256)) * 4096  # 1 MiB
    store.set("big", value)
    assert store.get("big") == value
    store.append("big", b"tail")
    assert store.get("big") == value + b"tail"


def test_prefix_store_namespacing(tmp_path):
    base = HashStore()
    a, b = PrefixStore("a", base), PrefixStore("b", base)
    a.set("k", b"1")
    b.set("k", b"2")
    assert base.get("a/k") == b"1" and base.get("b/k") == b"2"
    assert a.list_keys() == ["k"] and a.num_keys() == 1
    assert a.underlying_store is base and a.prefix == "a"
    nested = PrefixStore("inner", a)
    nested.set("x", b"y")
    assert base.get("a/inner/x") == b"y"
    a.set_timeout(timedelta(seconds=3))
    assert base.timeout == timedelta(seconds=3)
    with pytest.raises(TypeError, match=r"store must be an hpcdist\.store\.Store, got dict"):
        PrefixStore("p", {})  # type: ignore[arg-type]


def test_matches_torch_hashstore_semantics():
    """The same operation sequence on torch's HashStore and ours gives the same answers."""
    dist = pytest.importorskip("torch.distributed")
    ours, theirs = HashStore(), dist.HashStore()
    script = [
        ("set", "a", "1"),
        ("get", "a"),
        ("add", "c", 3),
        ("add", "c", -1),
        ("get", "c"),
        ("compare_set", "a", "1", "2"),
        ("compare_set", "a", "x", "3"),
        ("compare_set", "new", "", "n"),
        ("compare_set", "none", "e", "d"),
        ("check", ["a", "none"]),
        ("append", "a", "z"),
        ("get", "a"),
        ("multi_get", ["a", "c"]),
        ("num_keys",),
        ("delete_key", "c"),
        ("delete_key", "c"),
        ("num_keys",),
        ("queue_push", "q", "i1"),
        ("queue_push", "q", "i2"),
        ("queue_len", "q"),
        ("queue_pop", "q"),
        ("num_keys",),
        ("list_keys",),
    ]
    for op, *args in script:
        mine = getattr(ours, op)(*args)
        ref = getattr(theirs, op)(*args)
        if op == "list_keys":
            mine, ref = sorted(mine), sorted(ref)
        assert mine == ref, (op, args, mine, ref)
