"""hpcdist's stores compared with torch.distributed's own (torch 2.13), operation by operation.

Every test runs the SAME steps on a torch store and on the hpcdist store of the
same kind (a TCPStore master in this process, a FileStore on a tmp file, a
HashStore, and a PrefixStore over each) and compares, step by step, the
values returned and the exceptions raised: hpcdist's exception must be caught
by the ``except`` clause that catches torch's (``torch.distributed.X`` maps to
``hpcdist.errors.X``, builtins to themselves; hpcdist may be more specific).

Docstrings classify each test:

- ``GUARD:`` hpcdist agreed with torch from the start;
- ``SUSPECT:`` hpcdist differed and was fixed (the test failed before the fix);
- tests marked ``xfail(strict=True)`` pin a difference kept on purpose, listed
  in docs/stores.md ("Differences from torch").

Where torch itself misbehaves (a torch bug), the case is skipped with the
reason, or compared with torch's HashStore, whose semantics torch's other
stores are meant to share, and the docstring says so.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

td = pytest.importorskip("torch.distributed")

from hpcdist import errors as herrors  # noqa: E402
from hpcdist import store as hstore  # noqa: E402

pytestmark = pytest.mark.timeout(60)

KINDS = ["hash", "file", "tcp", "prefix-hash", "prefix-file", "prefix-tcp"]
T = timedelta(seconds=0.25)  # every store's default timeout here
SHORT = timedelta(seconds=0.1)  # an explicit wait(..., timeout)
#: the timeout of the constructor steps, none of which waits for it: torch's client also takes it as its connect
#: timeout to its own server, and 0.25 s failed that connect once under CI load
CTOR_T = timedelta(seconds=30)
HOST = "127.0.0.1"
Step = Callable[[Any], object]


# --- building the two stores ------------------------------------------------------------
def _build(lib: Any, kind: str, path: Path) -> Any:
    base = kind.removeprefix("prefix-")
    if base == "hash":
        s = lib.HashStore()
        s.set_timeout(T)
    elif base == "file":
        s = lib.FileStore(str(path), -1)
        s.set_timeout(T)
    else:
        s = lib.TCPStore(HOST, 0, 1, True, T)
    return lib.PrefixStore("ns", s) if kind.startswith("prefix-") else s


def _close(store: Any) -> None:
    while isinstance(store, hstore.PrefixStore):
        store = store.underlying_store
    close = getattr(store, "close", None)
    if close is not None:
        close()


@dataclass
class Pair:
    kind: str
    torch: Any
    ours: Any
    extra: list[Any] = field(default_factory=list)

    def torch_hash(self) -> Any:
        """torch's HashStore (under the same prefix): the reference where torch's own store of this kind is buggy."""
        return _build(td, "prefix-hash" if self.kind.startswith("prefix-") else "hash", Path())

    @property
    def base(self) -> str:
        return self.kind.removeprefix("prefix-")


@pytest.fixture
def pair(kind: str, tmp_path: Path) -> Iterator[Pair]:
    p = Pair(kind, _build(td, kind, tmp_path / "torch.store"), _build(hstore, kind, tmp_path / "ours.store"))
    yield p
    _close(p.ours)
    for s in p.extra:
        _close(s)


def kinds(
    xfail: dict[str, str] | None = None, skip: dict[str, str] | None = None, only: list[str] | None = None
) -> list[Any]:
    """The store kinds as parameters; ``xfail``/``skip``: kind -> reason."""
    out = []
    for k in only or KINDS:
        marks: list[Any] = []
        if xfail and k in xfail:
            marks.append(pytest.mark.xfail(strict=True, reason=xfail[k]))
        if skip and k in skip:
            marks.append(pytest.mark.skip(reason=skip[k]))
        out.append(pytest.param(k, marks=marks, id=k))
    return out


# --- running and comparing --------------------------------------------------------------------
@dataclass
class Outcome:
    value: object = None
    exc: BaseException | None = None
    seconds: float = 0.0

    def __repr__(self) -> str:
        what = f"raised {type(self.exc).__name__}({self.exc})" if self.exc else f"returned {self.value!r}"
        return f"{what} after {self.seconds:.2f} s"


def run(step: Step, store: Any) -> Outcome:
    t0 = time.monotonic()
    try:
        value = step(store)
    except Exception as exc:
        return Outcome(exc=exc, seconds=time.monotonic() - t0)
    return Outcome(value=value, seconds=time.monotonic() - t0)


def counterpart(exc: BaseException) -> type[BaseException]:
    """The class an ``except`` clause written for torch's ``exc`` names, in hpcdist's terms."""
    for cls in type(exc).__mro__:
        if cls.__module__ == "builtins":
            return cls
        ours = getattr(herrors, cls.__name__, None)
        if isinstance(ours, type) and issubclass(ours, BaseException):
            return ours
    return BaseException


def run_both(step: Step, theirs: Any, ours: Any, parallel: bool) -> tuple[Outcome, Outcome]:
    """``step`` on both stores; ``parallel``: at once, in two threads (for steps that wait out a timeout)."""
    if not parallel:
        return run(step, theirs), run(step, ours)
    box: list[Outcome] = []
    thread = threading.Thread(target=lambda: box.append(run(step, theirs)), daemon=True)
    thread.start()
    o = run(step, ours)
    thread.join(30)
    assert box, "torch's step did not return within 30 s"
    return box[0], o


def compare(pair: Pair, *steps: Step, ref: Any = None, parallel: bool = False) -> list[tuple[Outcome, Outcome]]:
    """Run ``steps`` in turn on torch's store (or ``ref``) and on hpcdist's; assert each step agrees."""
    theirs = pair.torch if ref is None else ref
    out = []
    for i, step in enumerate(steps):
        t, o = run_both(step, theirs, pair.ours, parallel)
        where = f"{pair.kind} step {i}: torch {t!r}, hpcdist {o!r}"
        if t.exc is None:
            assert o.exc is None, where
            assert o.value == t.value, where
        else:
            assert isinstance(o.exc, counterpart(t.exc)), where
        out.append((t, o))
    return out


def _lib(store: Any) -> Any:
    """The module whose store classes built ``store``: torch.distributed or hpcdist.store."""
    return td if isinstance(store, td.Store) else hstore


def ours_raises(store: Any, step: Step, cls: type[BaseException]) -> BaseException:
    o = run(step, store)
    assert isinstance(o.exc, cls), f"hpcdist {o!r}, expected {cls.__name__}"
    return o.exc


# --- set / get ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", kinds())
def test_set_get_round_trip_str_bytes_and_non_ascii_keys(pair):
    """GUARD: str values come back UTF-8 encoded, bytes as they are, under non-ASCII keys too."""
    compare(
        pair,
        lambda s: s.set("ключ/κλειδί", "välue ✓"),
        lambda s: s.get("ключ/κλειδί"),
        lambda s: s.set("raw", b"\x00\xff\xfe"),
        lambda s: s.get("raw"),
        lambda s: s.set("empty", ""),
        lambda s: s.get("empty"),
        lambda s: s.set("raw", "replaced"),
        lambda s: s.get("raw"),
        lambda s: s.get(5),
        lambda s: s.set("k", None),
        lambda s: s.set("k", 5),
    )


# --- add ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", kinds())
def test_add_returns_the_running_total_for_negative_zero_and_int64_edge_amounts(pair):
    """GUARD: add on a missing key starts at 0; negative, zero and int64-edge amounts; get sees ASCII."""
    compare(
        pair,
        lambda s: s.add("c", -5),
        lambda s: s.add("c", 0),
        lambda s: s.add("c", 7),
        lambda s: s.get("c"),
        lambda s: s.add("zero", 0),
        lambda s: s.get("zero"),
        lambda s: s.add("max", 2**63 - 1),
        lambda s: s.add("max", -(2**63 - 1)),
        lambda s: s.add("min", -(2**63)),
        lambda s: s.get("min"),
        lambda s: s.add("f", 1.5),
    )


@pytest.mark.parametrize("kind", kinds())
def test_add_on_a_key_set_by_set_parses_its_decimal_value(pair):
    """GUARD: a counter written by set (digits, a sign, leading blanks) is added to, and returned as int."""
    compare(
        pair,
        lambda s: s.set("i", "7"),
        lambda s: s.add("i", 3),
        lambda s: s.set("neg", "-12"),
        lambda s: s.add("neg", 2),
        lambda s: s.set("plus", "+5"),
        lambda s: s.add("plus", 1),
        lambda s: s.set("blank", "  9"),
        lambda s: s.add("blank", 1),
        lambda s: s.get("blank"),
        lambda s: s.set("b", b"40"),
        lambda s: s.add("b", 2),
    )


@pytest.mark.parametrize("kind", kinds())
def test_add_amount_outside_int64_raises_type_error(pair):
    """SUSPECT (fixed): torch refuses an amount that does not fit int64 with TypeError; hpcdist added it
    as a Python big int (2**63, -2**63-1), making a counter torch could never hold."""
    compare(
        pair,
        lambda s: s.add("h", 2**63),
        lambda s: s.add("h", -(2**63) - 1),
        lambda s: s.add("h", 10**30),
        lambda s: s.check(["h"]),
    )


@pytest.mark.parametrize("kind", kinds())
def test_add_on_a_non_integer_value_raises_value_error_naming_the_key(pair):
    """SUSPECT (fixed, TCP): torch's HashStore/FileStore raise ValueError for add on "abc" (and on
    non-ASCII digits); hpcdist agrees, but its TCP error named the key as bytes (b'ns/s').

    Torch bug: torch's TCPStore server fails on this request and drops the connection
    (DistNetworkError, the store is unusable afterwards), so TCP kinds compare with torch's
    HashStore.
    """
    ref = pair.torch_hash() if pair.base == "tcp" else None
    compare(
        pair,
        lambda s: s.set("s", "abc"),
        lambda s: s.add("s", 1),
        lambda s: s.get("s"),
        lambda s: s.set("arabic", "\u0663"),
        lambda s: s.add("arabic", 1),
        ref=ref,
    )
    exc = ours_raises(pair.ours, lambda s: s.add("s", 1), ValueError)
    key = "ns/s" if pair.kind.startswith("prefix-") else "s"
    assert f"key {key!r} holds b'abc'" in str(exc)
    assert pair.ours.add("fine", 1) == 1  # the store stays usable


@pytest.mark.parametrize("kind", kinds())
def test_add_on_an_empty_value_counts_it_as_zero(pair):
    """SUSPECT (fixed): torch's HashStore and FileStore count an empty value as 0 (``set(k, "")`` then
    ``add(k, 3)`` returns 3); hpcdist raised ValueError.

    Torch bug: torch's TCPStore server fails on this request (drops the connection), so
    TCP kinds compare with torch's HashStore.
    """
    ref = pair.torch_hash() if pair.base == "tcp" else None
    compare(
        pair,
        lambda s: s.set("e", ""),
        lambda s: s.add("e", 3),
        lambda s: s.get("e"),
        lambda s: s.compare_set("cs", "", ""),
        lambda s: s.add("cs", -1),
        ref=ref,
    )


@pytest.mark.parametrize("kind", kinds())
def test_add_refuses_values_that_are_not_wholly_a_decimal_integer(pair):
    """SUSPECT (fixed): hpcdist parsed "1_0" as 10 (Python's int() accepts digit separators).

    Torch bug: torch parses the longest integer prefix (std::stoll), so "7abc" counts as 7
    and "1_0" as 1, silently. hpcdist follows torch's rule for a value that is not an integer
    (ValueError, as torch's add on "abc"): the whole value must be a decimal integer.
    """
    ref = pair.torch_hash()
    compare(pair, lambda s: s.set("s", "abc"), lambda s: s.add("s", 1), ref=ref)  # torch's rule
    for bad in ("1_0", "7abc", "7 8", "0x10", "1e3", "١٢"):
        pair.ours.set("v", bad)
        ours_raises(pair.ours, lambda s: s.add("v", 1), ValueError)
        assert pair.ours.get("v") == bad.encode()


@pytest.mark.parametrize("kind", kinds())
def test_add_never_makes_a_counter_outside_int64(pair):
    """SUSPECT (fixed): a stored value beyond int64 ("99999999999999999999") makes torch's add raise
    (IndexError from std::stoll on Hash/File); hpcdist added to it as a big int. hpcdist now raises
    ValueError (its error for a value that is no counter) and leaves the value as it was.

    Torch bugs, not compared: torch's TCPStore server drops the connection on that value, and
    an add that overflows int64 (2**63-1 plus 1) wraps around to -2**63 in every torch store.
    hpcdist raises ValueError there too.
    """
    if pair.base != "tcp":
        t = run(lambda s: (s.set("big", "99999999999999999999"), s.add("big", 1)), pair.torch)
        assert t.exc is not None, f"torch {t!r}"
    pair.ours.set("big", "99999999999999999999")
    ours_raises(pair.ours, lambda s: s.add("big", 1), ValueError)
    assert pair.ours.get("big") == b"99999999999999999999"
    assert pair.ours.add("top", 2**63 - 1) == 2**63 - 1
    ours_raises(pair.ours, lambda s: s.add("top", 1), ValueError)
    assert pair.ours.get("top") == str(2**63 - 1).encode()
    assert pair.ours.add("bottom", -(2**63)) == -(2**63)
    ours_raises(pair.ours, lambda s: s.add("bottom", -1), ValueError)
    assert pair.ours.add("top", -1) == 2**63 - 2  # still a counter


BOOL_AMOUNT = "known (docs/stores.md): a bool amount (add(k, True)) is refused with TypeError; torch adds it as 1"


@pytest.mark.parametrize("kind", kinds(xfail=dict.fromkeys(KINDS, BOOL_AMOUNT)))
def test_add_with_a_bool_amount_adds_one(pair):
    """Known difference: torch accepts ``add(k, True)`` (pybind converts a bool to 1); hpcdist's
    integer arguments refuse bools (almost always a slip)."""
    compare(pair, lambda s: s.add("b", True))


# --- compare_set ------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", kinds())
def test_compare_set_on_missing_mismatching_and_matching_keys(pair):
    """GUARD: missing key + empty expected sets; missing + other expected returns expected and sets
    nothing; a mismatch returns the current value; a match returns desired; always bytes."""
    steps = compare(
        pair,
        lambda s: s.compare_set("m", "", "first"),
        lambda s: s.get("m"),
        lambda s: s.compare_set("gone", "expected", "x"),
        lambda s: s.check(["gone"]),
        lambda s: s.compare_set("m", "wrong", "x"),
        lambda s: s.compare_set("m", "", "x"),
        lambda s: s.compare_set("m", "first", b"\xff second"),
        lambda s: s.get("m"),
        lambda s: s.compare_set("m", b"\xff second", ""),
        lambda s: s.get("m"),
    )
    assert all(type(o.value) is bytes for _t, o in (steps[0], steps[2], steps[4], steps[6]))


# --- check / wait / timeouts ------------------------------------------------------------
@pytest.mark.parametrize("kind", kinds())
def test_check_and_wait_on_lists_of_keys(pair):
    """GUARD: check is all-of and never blocks; wait returns at once when every key exists, with or
    without a timeout; an empty list is trivially there; a bare str is a TypeError."""
    compare(
        pair,
        lambda s: s.check(["a"]),
        lambda s: s.check([]),
        lambda s: s.multi_set(["a", "b"], ["1", "2"]),
        lambda s: s.check(["a", "b"]),
        lambda s: s.check(["a", "nope"]),
        lambda s: s.wait(["a", "b"]),
        lambda s: s.wait(["a", "b"], timedelta(seconds=5)),
        lambda s: s.wait([]),
        lambda s: s.wait("a"),
        lambda s: s.check("a"),
    )


NO_FILE_TIMEOUT = {
    k: "torch's FileStore raises a plain RuntimeError on timeout (checked in the test above)"
    for k in ("file", "prefix-file")
}


def _assert_timed(kind: str, t: Outcome, o: Outcome, limit: timedelta, what: str) -> None:
    sec = limit.total_seconds()
    assert t.exc is not None and o.exc is not None, f"{what}: torch {t!r}, hpcdist {o!r}"
    assert isinstance(o.exc, RuntimeError) and isinstance(t.exc, RuntimeError), f"{what}: torch {t!r}, hpcdist {o!r}"
    assert t.seconds >= sec * 0.9, f"{what}: torch {t!r}"
    assert o.seconds >= sec * 0.9, f"{what}: hpcdist {o!r} for a {sec} s timeout"  # it waited, not gave up early
    if kind.endswith("tcp"):  # torch's TCP message names the keys: "wait timeout after 250ms, keys: /ns/k2"
        assert "timed out" in str(o.exc) and "k2" in str(o.exc), f"{what}: {o.exc}"


@pytest.mark.parametrize("kind", kinds())
def test_blocking_calls_time_out_after_their_timeout(pair):
    """GUARD: get, wait (store timeout or the one given), multi_get and blocking queue_pop on a
    missing key raise once the timeout passed, a RuntimeError in both (torch: DistStoreError, or a
    plain RuntimeError from FileStore; hpcdist: DistTimeoutError, see the next test); hpcdist's
    names the missing key, as torch's TCPStore does, and the store stays usable.

    Torch quirk: torch's FileStore rounds every timeout up to a whole second (0.25 s waits 1 s),
    so file kinds check get only (a second each), and torch's duration only from below.
    """
    pair.torch.set("k1", "1")
    pair.ours.set("k1", "1")
    steps: list[tuple[str, Step, timedelta]] = [("get", lambda s: s.get("k2"), T)]
    if pair.base != "file":
        steps += [
            ("wait(keys, timeout)", lambda s: s.wait(["k1", "k2"], SHORT), SHORT),
            ("wait(keys)", lambda s: s.wait(["k1", "k2"]), T),
            ("multi_get", lambda s: s.multi_get(["k1", "k2"]), T),
            ("queue_pop", lambda s: s.queue_pop("k2"), T),
        ]
    for what, step, limit in steps:
        t, o = run_both(step, pair.torch, pair.ours, parallel=True)
        _assert_timed(pair.kind, t, o, limit, what)
        if pair.base == "file":
            assert isinstance(o.exc, counterpart(t.exc)), f"torch {t!r}, hpcdist {o!r}"
    compare(pair, lambda s: s.get("k1"))  # still usable


@pytest.mark.parametrize("kind", kinds(skip=NO_FILE_TIMEOUT))
def test_a_store_timeout_is_a_dist_store_error(pair):
    """SUSPECT: torch's HashStore and TCPStore raise DistStoreError when a blocking call runs out of time;
    hpcdist raised DistTimeoutError, which ``except DistStoreError`` does not catch. Fixed: it is a
    DistStoreTimeoutError, both. File kinds are covered above: torch raises a plain RuntimeError there."""
    compare(pair, lambda s: s.set_timeout(SHORT), lambda s: s.get("missing"), parallel=True)


def test_wait_for_workers_timeout_is_a_dist_store_error():
    """SUSPECT: a master whose workers never join raises DistStoreError in torch ("Timed out after 1 seconds
    waiting for clients. 1/2 clients joined."), DistTimeoutError in hpcdist. Fixed: DistStoreTimeoutError, both;
    both say how many joined (torch rounds the 0.25 s up to 1 s)."""
    t, o = run_both(lambda lib: lib.TCPStore(HOST, 0, 2, True, T), td, hstore, parallel=True)
    assert t.exc is not None and "1/2" in str(t.exc)
    assert isinstance(o.exc, herrors.DistTimeoutError) and "only 1 of 2 workers joined" in str(o.exc)
    assert isinstance(o.exc, counterpart(t.exc)), f"torch {t!r}, hpcdist {o!r}"


# --- delete_key, num_keys, list_keys --------------------------------------------------------
@pytest.mark.parametrize("kind", kinds())
def test_delete_key_returns_whether_the_key_existed(pair):
    """GUARD: True for a key that existed (and it is gone), False for a missing one.

    Torch bug: torch's FileStore returns True for a missing key too, so file kinds compare
    the missing-key case with torch's HashStore.
    """
    compare(
        pair,
        lambda s: s.set("d", "1"),
        lambda s: s.delete_key("d"),
        lambda s: s.check(["d"]),
        lambda s: s.add("n", 1),
        lambda s: s.delete_key("n"),
        lambda s: s.add("n", 1),
    )
    compare(pair, lambda s: s.delete_key("never"), ref=pair.torch_hash() if pair.base == "file" else None)


NUM_KEYS_XFAIL = {
    "tcp": "known (docs/stores.md): torch's TCPStore num_keys() counts an internal key (1 more than yours)",
    "file": "known (docs/stores.md): torch's FileStore num_keys() counts an internal key (1 more than yours)",
    "prefix-hash": "known (docs/stores.md): torch's PrefixStore.num_keys() counts the whole underlying store",
    "prefix-file": "known (docs/stores.md): torch's PrefixStore.num_keys() counts the whole underlying store",
    "prefix-tcp": "known (docs/stores.md): torch's PrefixStore.num_keys() counts the whole underlying store",
}


@pytest.mark.parametrize("kind", kinds(xfail=NUM_KEYS_XFAIL))
def test_num_keys_counts_what_torch_counts(pair):
    """What torch 2.13 counts, recorded: HashStore the keys set; TCPStore and FileStore one more (an
    internal key); a PrefixStore every key of the underlying store, other prefixes and its
    internal key included. hpcdist counts exactly the keys set (in a PrefixStore, its own):
    GUARD for hash, known differences elsewhere."""
    for s in (pair.torch, pair.ours):
        under = s.underlying_store if pair.kind.startswith("prefix-") else s
        under.set("other", "x")  # outside the prefix for prefix kinds
    compare(
        pair,
        lambda s: s.num_keys(),
        lambda s: s.multi_set(["a", "b"], ["1", "2"]),
        lambda s: s.num_keys(),
        lambda s: s.delete_key("a"),
        lambda s: s.num_keys(),
    )


@pytest.mark.parametrize("kind", kinds())
def test_list_keys_lists_the_keys_set_without_prefix(pair):
    """GUARD: list_keys lists the keys set (a PrefixStore: its own, prefix removed, as torch does).

    Torch bug: torch's FileStore lists its internal "refcount" key, mangled to 'efcount/';
    it is left out of the comparison.
    """

    def listed(s: Any) -> list[str]:
        return sorted(k for k in s.list_keys() if not (pair.kind == "file" and k == "efcount/"))

    compare(
        pair,
        lambda s: s.multi_set(["a", "ключ", "x/y"], ["1", "2", "3"]),
        lambda s: s.add("n", 1),
        lambda s: s.append("ap", "z"),
        listed,
        lambda s: s.delete_key("a"),
        listed,
    )


# --- multi_get / multi_set / append ------------------------------------------------------------
@pytest.mark.parametrize("kind", kinds())
def test_multi_set_and_multi_get_in_order(pair):
    """GUARD: multi_set of str and bytes values; multi_get returns bytes in the order asked,
    repeated keys included; an empty list gives []."""
    compare(
        pair,
        lambda s: s.multi_set(["m1", "m2", "ключ"], ["a", b"\xffb", ""]),
        lambda s: s.multi_get(["ключ", "m1", "m2", "m1"]),
        lambda s: s.multi_get([]),
        lambda s: s.multi_set(("t1",), (b"v",)),
        lambda s: s.get("t1"),
        lambda s: s.multi_get("m1"),
    )


MULTI_SET_LENGTHS = (
    "known (docs/stores.md): multi_set with fewer values than keys is a ValueError, raised before "
    "any request; torch's TCPStore raises DistStoreError"
)
TORCH_MULTI_SET_BUG = (
    "torch bug: multi_set with fewer values than keys raises MemoryError (std::bad_alloc) in "
    "HashStore and DistStoreError('Bad address') in FileStore"
)


@pytest.mark.parametrize(
    "kind",
    kinds(
        xfail={"tcp": MULTI_SET_LENGTHS, "prefix-tcp": MULTI_SET_LENGTHS},
        skip={k: TORCH_MULTI_SET_BUG for k in ("hash", "file", "prefix-hash", "prefix-file")},
    ),
)
def test_multi_set_with_fewer_values_than_keys(pair):
    """Known difference (TCP): hpcdist raises ValueError naming both lengths; torch's TCPStore a
    DistStoreError. Hash/File kinds skipped: torch misbehaves (see the skip reason)."""
    compare(pair, lambda s: s.multi_set(["a", "b"], ["1"]))


@pytest.mark.parametrize("kind", kinds())
def test_append_creates_then_extends_the_value(pair):
    """GUARD: append to a missing key sets it; later appends concatenate str and bytes."""
    compare(
        pair,
        lambda s: s.append("ap", "a"),
        lambda s: s.get("ap"),
        lambda s: s.append("ap", b"\xff"),
        lambda s: s.append("ap", "é"),
        lambda s: s.get("ap"),
        lambda s: s.set("ap", "reset"),
        lambda s: s.append("ap", ""),
        lambda s: s.get("ap"),
    )


# --- queues ------------------------------------------------------------------------------------
NO_FILE_QUEUES = {
    "file": "torch's FileStore has no queues (NotImplementedError, has_extended_api() False); hpcdist's has",
    "prefix-file": "torch's FileStore has no queues (NotImplementedError, has_extended_api() False); hpcdist's has",
}


@pytest.mark.parametrize("kind", kinds(skip=NO_FILE_QUEUES))
def test_queue_push_pop_len_in_fifo_order(pair):
    """GUARD: queues are FIFO; queue_len counts (0 for a missing queue); queue_pop(block=False) on an
    empty queue raises QueueEmptyError."""
    compare(
        pair,
        lambda s: s.queue_len("q"),
        lambda s: s.queue_push("q", "a"),
        lambda s: s.queue_push("q", b"\xffb"),
        lambda s: s.queue_len("q"),
        lambda s: s.queue_pop("q"),
        lambda s: s.queue_pop("q", block=False),
        lambda s: s.queue_len("q"),
        lambda s: s.queue_pop("q", False),
        lambda s: s.queue_pop("q", block=False),
        lambda s: s.has_extended_api(),
    )


QUEUE_NAMESPACE = "known (docs/stores.md): queues are a namespace of their own, invisible to check/num_keys/list_keys"


@pytest.mark.parametrize(
    "kind",
    kinds(xfail=dict.fromkeys(("hash", "tcp", "prefix-hash", "prefix-tcp"), QUEUE_NAMESPACE), skip=NO_FILE_QUEUES),
)
def test_a_queue_is_a_key_for_check(pair):
    """Known difference: in torch a pushed queue is a key (check() is True for it)."""
    compare(pair, lambda s: s.queue_push("q", "a"), lambda s: s.check(["q"]))


# --- barrier ------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", kinds())
def test_barrier_of_one_returns_and_refuses_bad_arguments(pair):
    """GUARD: a barrier of one participant returns at once; a key or world_size of the wrong type is
    a TypeError. The keys it leaves are not compared: torch's own stores differ (HashStore,
    FileStore and PrefixStore leave ``key/num_members`` and ``key/last_member``, TCPStore ``key``);
    hpcdist leaves ``key`` and ``key/done`` (docs/stores.md)."""
    compare(
        pair,
        lambda s: s.barrier("br", 1),
        lambda s: s.barrier("b1", 1, timedelta(seconds=5)),
        lambda s: s.barrier(5, 1),
        lambda s: s.barrier("b2", "2"),
    )


BARRIER_REUSE = (
    "known (docs/stores.md): a barrier key used again after it completed raises DistStoreError (it would "
    "not wait for anyone); torch returns at once"
)


@pytest.mark.parametrize("kind", kinds(only=["hash"], xfail={"hash": BARRIER_REUSE}))
def test_barrier_reused_key_returns_at_once(pair):
    """Known difference: torch lets a completed barrier key be used again (it returns at once, the
    count grows past world_size); hpcdist refuses it, since such a barrier synchronises nothing."""
    compare(pair, lambda s: s.barrier("br", 1), lambda s: s.barrier("br", 1))


# --- timeout, clone -------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", kinds())
def test_timeout_property_and_set_timeout(pair):
    """GUARD: timeout reads back what set_timeout set; set_timeout needs a timedelta (TypeError);
    a PrefixStore's timeout is its underlying store's, both ways."""
    compare(
        pair,
        lambda s: s.timeout,
        lambda s: s.set_timeout(timedelta(seconds=2)),
        lambda s: s.timeout,
        lambda s: s.set_timeout(1),
        lambda s: s.timeout,
    )
    if pair.kind.startswith("prefix-"):
        compare(
            pair,
            lambda s: s.underlying_store.timeout,
            lambda s: s.underlying_store.set_timeout(timedelta(seconds=3)),
            lambda s: s.timeout,
        )


@pytest.mark.parametrize("kind", kinds())
def test_clone_is_a_store_of_the_same_type_on_the_same_data(pair):
    """GUARD: clone() returns the same store type, sees the same keys both ways, keeps the timeout.

    Torch bug: torch's FileStore clone forgets the timeout (reset to 300 s), so file kinds
    compare the timeout with torch's HashStore.
    """
    compare(pair, lambda s: s.set_timeout(timedelta(seconds=2)))
    clones: dict[int, Any] = {}

    def clone(s: Any) -> Any:
        c = clones[id(s)] = s.clone()
        return type(c).__name__

    compare(
        pair,
        clone,
        lambda s: s.set("from-original", "1"),
        lambda s: clones[id(s)].get("from-original"),
        lambda s: clones[id(s)].set("from-clone", "2"),
        lambda s: s.get("from-clone"),
    )
    pair.extra.append(clones[id(pair.ours)])
    ref = pair.torch_hash() if pair.base == "file" else None
    if ref is not None:
        ref.set_timeout(timedelta(seconds=2))
    compare(pair, lambda s: s.clone().timeout, ref=ref)


# --- TCPStore: attributes and constructor -------------------------------------------------------
@pytest.fixture
def tcp_pair() -> Iterator[Pair]:
    p = Pair("tcp", td.TCPStore(HOST, 0, 1, True, T), hstore.TCPStore(HOST, 0, 1, True, T))
    yield p
    p.ours.close()


def test_tcpstore_host_and_port_attributes(tcp_pair):
    """GUARD: host is the name given; port is the bound one (port=0 picked a free port); a clone has both."""
    compare(
        tcp_pair,
        lambda s: s.host,
        lambda s: s.port > 0,
        lambda s: (s.clone().host, s.clone().port == s.port),
    )
    ours = tcp_pair.ours
    client = hstore.TCPStore(HOST, ours.port, timeout=T)
    try:
        assert (client.host, client.port) == (HOST, ours.port)
    finally:
        client.close()


@pytest.mark.xfail(
    strict=True, reason="known (docs/stores.md): TCPStore.libuvBackend is False, the server is a Python selectors loop"
)
def test_tcpstore_libuv_backend_follows_use_libuv(tcp_pair):
    """Known difference: torch's libuvBackend is True by default (use_libuv=True); hpcdist's is
    always False (no libuv; use_libuv is accepted and ignored). With use_libuv=False both say False."""
    t = td.TCPStore(HOST, 0, 1, True, T, use_libuv=False)
    o = hstore.TCPStore(HOST, 0, 1, True, T, use_libuv=False)
    try:
        assert t.libuvBackend is o.libuvBackend is False
    finally:
        o.close()
    compare(tcp_pair, lambda s: s.libuvBackend)


def _ctor(*args: Any, **kwargs: Any) -> Step:
    """A step that builds a TCPStore of the store's library (a master on port 0 unless told)."""

    def step(lib: Any) -> object:
        s = lib.TCPStore(*args, **kwargs)
        port = s.port
        if lib is hstore:
            s.close()
        return port > 0

    return step


def _libs_pair() -> Pair:
    return Pair("tcp", td, hstore)


def test_tcpstore_constructor_refuses_bad_types_and_sizes():
    """GUARD: a port or world_size that is not an int, a timeout that is not a timedelta and a
    master_listen_fd that is not an int are TypeErrors; world_size 0 is a ValueError; None, -1
    and keyword arguments by torch's names are accepted."""
    compare(
        _libs_pair(),
        _ctor(HOST, "29500", 1, True, CTOR_T),
        _ctor(HOST, 1.5, 1, True, CTOR_T),
        _ctor(HOST, 0, "1", True, CTOR_T),
        _ctor(HOST, 0, 1.0, True, CTOR_T),
        _ctor(HOST, 0, 0, True, CTOR_T),
        _ctor(HOST, 0, 1, True, 5),
        _ctor(HOST, 0, 1, True, CTOR_T, master_listen_fd="x"),
        _ctor(HOST, 0, None, True, CTOR_T),
        _ctor(HOST, 0, -1, True, CTOR_T),
        _ctor(
            host_name=HOST,
            port=0,
            world_size=1,
            is_master=True,
            timeout=CTOR_T,
            wait_for_workers=False,
            multi_tenant=False,
            master_listen_fd=None,
            use_libuv=True,
        ),
    )


def test_tcpstore_constructor_flags_take_what_torch_takes():
    """SUSPECT (fixed): torch's is_master takes only a bool (numpy's too): 1, 0, None, "yes" are
    TypeErrors; wait_for_workers, multi_tenant and use_libuv take a bool, None or a number but
    not a str. hpcdist took any value and used its truth ("no" meant True)."""
    compare(
        _libs_pair(),
        _ctor(HOST, 0, 1, "yes", CTOR_T),
        _ctor(HOST, 0, 1, 1, CTOR_T),
        _ctor(HOST, 0, 1, None, CTOR_T),
        _ctor(HOST, 0, 1, True, CTOR_T, "no"),
        _ctor(HOST, 0, 1, True, CTOR_T, multi_tenant="x"),
        _ctor(HOST, 0, 1, True, CTOR_T, use_libuv="x"),
        _ctor(HOST, 0, 1, True, CTOR_T, wait_for_workers=None, multi_tenant=0, use_libuv=None),
        _ctor(HOST, 0, 1, True, CTOR_T, wait_for_workers=1, use_libuv=1.0),
    )


def test_tcpstore_constructor_refuses_a_host_name_that_is_not_a_str():
    """SUSPECT (fixed): torch raises TypeError for a host_name that is not a str; hpcdist raised
    ValueError (it still raises ValueError for an empty one)."""
    compare(_libs_pair(), _ctor(5, 0, 1, True, CTOR_T), _ctor(None, 0, 1, True, CTOR_T))


PORT_RANGE = (
    "known (docs/stores.md): a port outside 0..65535 is a ValueError naming the range; torch's binding raises TypeError"
)


@pytest.mark.xfail(strict=True, reason=PORT_RANGE)
def test_tcpstore_port_out_of_range_is_a_type_error():
    """Known difference: torch's pybind layer refuses a port that is no uint16 as TypeError."""
    compare(_libs_pair(), _ctor(HOST, 70000, 1, True, CTOR_T), _ctor(HOST, -1, 1, True, CTOR_T))


@pytest.mark.xfail(
    strict=True, reason="known (docs/stores.md): a bool world_size is refused with TypeError; torch takes True as 1"
)
def test_tcpstore_bool_world_size_counts_as_one():
    """Known difference: torch accepts world_size=True (as 1)."""
    compare(_libs_pair(), _ctor(HOST, 0, True, True, CTOR_T))


def test_tcpstore_bind_and_resolve_failures_are_network_errors(tcp_pair):
    """GUARD: a port in use and a host that does not resolve raise DistNetworkError (torch after
    trying to connect, hpcdist at once); torch's message names EADDRINUSE, hpcdist's "already in use"."""
    (t, o), *_ = compare(
        tcp_pair, lambda s: type(s)(HOST, s.port, 1, True, T), lambda s: type(s)("no.such.host.invalid", 0, 1, True, T)
    )
    assert "EADDRINUSE" in str(t.exc) and "already in use" in str(o.exc)


def test_tcpstore_multi_tenant_masters_share_one_server():
    """GUARD: two multi_tenant masters on one port share the keys."""

    def step(lib: Any) -> object:
        a = lib.TCPStore(HOST, 0, 1, True, T, multi_tenant=True)
        b = lib.TCPStore(HOST, a.port, 1, True, T, multi_tenant=True)
        a.set("k", "v")
        got = b.get("k")
        if lib is hstore:
            b.close()
            a.close()
        return got

    compare(_libs_pair(), step)


# --- PrefixStore -------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind", kinds(only=["hash", "file", "tcp"]))
def test_prefix_store_over_a_prefix_store_and_its_underlying_store(pair):
    """GUARD: PrefixStore nests ("a/b/k" in the base store); underlying_store is the store it was
    built on (a PrefixStore for the inner one); an empty prefix still adds "/"; bad arguments are
    TypeErrors."""
    layers: dict[int, tuple[Any, Any]] = {}

    def nest(s: Any) -> object:
        a = _lib(s).PrefixStore("a", s)
        b = _lib(s).PrefixStore("b", a)
        layers[id(s)] = (a, b)
        return (type(b.underlying_store).__name__, b.underlying_store is a, a.underlying_store is s)

    compare(
        pair,
        nest,
        lambda s: layers[id(s)][1].set("k", "v"),
        lambda s: s.get("a/b/k"),
        lambda s: layers[id(s)][0].get("b/k"),
        lambda s: layers[id(s)][1].add("n", 2),
        lambda s: layers[id(s)][0].add("b/n", 1),
        lambda s: sorted(layers[id(s)][1].list_keys()),
        lambda s: layers[id(s)][1].underlying_store.underlying_store is s,
    )
    compare(
        pair,
        lambda s: _lib(s).PrefixStore("", s).set("e", "1"),
        lambda s: s.get("/e"),
        lambda s: _lib(s).PrefixStore(5, s),
        lambda s: _lib(s).PrefixStore("p", object()),
    )
