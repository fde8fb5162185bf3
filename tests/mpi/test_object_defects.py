"""Object collectives under adversarial use (found in the adversarial p2p/objects round).

* ``gather_object`` refused an empty ``object_gather_list`` on ranks other
  than the destination; torch (gloo) accepts it (it tests the list's truth),
  so torch code passing ``[]`` there failed on those ranks and left the
  destination waiting out the timeout.
* ``HPCDIST_OBJECT_UNPICKLER=restricted`` let a peer build NumPy arrays over
  bytes of its choosing (a dtype state with forged flags, a call of
  ``numpy.ndarray``): object pointers the sender chose, which crash the
  receiver when read. Now every receiving rank raises ``UnpicklingError``
  and the group stays in step. (tests/unit/test_unpickler_defects.py holds
  the payload corpus.)
"""

from __future__ import annotations

import pickle
import re
import threading

import numpy as np
import pytest

import hpcdist as dist


def me() -> int:
    return dist.get_rank()


def test_gather_object_accepts_an_empty_list_off_the_destination(group, members):
    for root in members:
        out = [None] * len(members) if me() == root else []
        dist.gather_object({"r": me()}, out, dst=root, group=group)
        if me() == root:
            assert out == [{"r": r} for r in members]
        else:
            assert out == []


def test_gather_object_still_refuses_entries_off_the_destination():
    n = dist.get_world_size()
    if n < 2:
        pytest.skip("needs 2 or more ranks")
    dst = (me() + 1) % n  # every rank is off the destination it names: nobody enters the collective
    with pytest.raises(ValueError, match=r"object_gather_list must be None \(or an empty list\).*\[None"):
        dist.gather_object(1, [None] * n, dst=dst)


class _NdarrayOverBytes:
    """Pickles as ``numpy.ndarray((1,), 'O', <8 zero bytes>)``: an object array over the sender's bytes."""

    def __reduce__(self):
        return (np.ndarray, ((1,), "O", b"\0" * 8))


class _ForgedDtype:
    """Pickles as an object dtype whose state claims it holds no objects (flags 0)."""

    def __reduce__(self):
        return (np.dtype, ("O8", False, True), (3, "|", None, None, None, -1, -1, 0))


@pytest.mark.parametrize("gadget", [_NdarrayOverBytes, _ForgedDtype], ids=["ndarray-call", "forged-dtype"])
def test_restricted_receivers_refuse_numpy_gadgets_and_the_group_stays_in_step(gadget, monkeypatch):
    monkeypatch.setenv("HPCDIST_OBJECT_UNPICKLER", "restricted")
    n = dist.get_world_size()
    out = [None] * n
    # rank 0 sends the gadget; every rank unpickles every rank's object, so every rank refuses
    with pytest.raises(pickle.UnpicklingError, match="restricted refuses"):
        dist.all_gather_object(out, gadget() if me() == 0 else {"plain": me()})
    if n >= 2:
        if me() == 0:
            dist.send_object_list([gadget()], dst=1)
        elif me() == 1:
            with pytest.raises(pickle.UnpicklingError, match="restricted refuses"):
                dist.recv_object_list([None], src=0)
    # plain data and NumPy arrays still travel under the restricted mode
    dist.all_gather_object(out, {"r": me(), "a": np.arange(3.0) + me()})
    assert [o["r"] for o in out] == list(range(n))
    assert all(np.array_equal(o["a"], np.arange(3.0) + r) for r, o in enumerate(out))


#: what a rank cannot pickle: a lock, and an object whose __reduce__ raises
class _Refuses:
    def __reduce__(self):
        raise RuntimeError("not today")


_UNPICKLABLE = {
    "lock": (threading.Lock, "TypeError: cannot pickle '_thread.lock' object"),
    "reduce": (_Refuses, "RuntimeError: not today"),
}


@pytest.mark.parametrize("what", sorted(_UNPICKLABLE))
def test_an_object_one_rank_cannot_pickle_raises_on_every_rank_at_once(group, members, what):
    """The rank whose object cannot be pickled raised, and the others waited for it until the timeout (as gloo
    does). Its error now travels in the exchange's first round: the others raise a DistError naming it, at
    once, and the group stays usable. Every object collective, every root, over the group matrix."""
    if not members:
        return
    make, text = _UNPICKLABLE[what]
    n, bad = len(members), members[-1]
    glob = f"rank {bad}: {text}"

    def expect(fn, failing: bool, quiet: bool = False):
        if failing:
            with pytest.raises(Exception) as info:
                fn()
            assert type(info.value).__name__ == text.split(":")[0], info.value  # its own error, as pickling raised it
        elif quiet:
            fn()
        else:
            with pytest.raises(dist.DistError, match=re.escape(glob)):
                fn()

    out: list = [None] * n
    expect(lambda: dist.all_gather_object(out, make() if me() == bad else me(), group=group), me() == bad)
    for root in members:
        lst = [make() if me() == root else None] if root == bad else [me()]
        expect(
            lambda lst=lst, root=root: dist.broadcast_object_list(lst, src=root, group=group),
            me() == bad and root == bad,
            quiet=root != bad,
        )
        got = [None] * n if me() == root else None
        # gather: the failing rank raises its own error; the destination names it; the others are not told
        expect(
            lambda got=got, root=root: dist.gather_object(make() if me() == bad else me(), got, dst=root, group=group),
            me() == bad,
            quiet=me() != root,
        )
        # scatter: the source cannot pickle one entry; it raises its own error, every other rank a DistError
        ins = [make() if r == bad else r for r in members] if me() == root else None
        if me() == root:
            with pytest.raises(Exception) as info:
                dist.scatter_object_list([None], ins, src=root, group=group)
            assert type(info.value).__name__ == text.split(":")[0], info.value
        else:
            said = f"rank {root}: scatter_object_input_list[{n - 1}]: {text}"
            with pytest.raises(dist.DistError, match=re.escape(said)):
                dist.scatter_object_list([None], None, src=root, group=group)
    dist.all_gather_object(out, me(), group=group)  # the group is still in step
    assert out == members
    if n > 1 and me() in (members[0], bad):
        if me() == bad:
            with pytest.raises(Exception) as info:
                dist.send_object_list([make()], dst=members[0], group=group)
            assert type(info.value).__name__ == text.split(":")[0], info.value
        else:
            with pytest.raises(dist.DistError, match=re.escape(glob)):
                dist.recv_object_list([None], src=bad, group=group)
