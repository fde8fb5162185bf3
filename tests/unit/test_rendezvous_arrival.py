"""The arrival wait tells a store that timed out from a store whose server went away, by the error's type.

Real stores: hpcdist's HashStore and TCPStore, and torch's (which the torch
backend hands to the rendezvous); a TCPStore "goes away" by closing its master.
"""

from __future__ import annotations

from datetime import timedelta

import pytest

from hpcdist.errors import DistTimeoutError
from hpcdist.rendezvous.arrival import Deadline
from hpcdist.store import HashStore, TCPStore

SHORT = timedelta(seconds=0.3)
T10 = timedelta(seconds=10)


def _outcome(store, keys=("never",)) -> str:
    """What Deadline.wait reported: "timeout" or "lost" (its message is told which)."""
    with pytest.raises(DistTimeoutError) as info:
        Deadline(SHORT).wait(store, list(keys), lambda lost: "lost" if lost else "timeout")
    return str(info.value)


def test_hpcdist_store_timeout_is_a_timeout():
    assert _outcome(HashStore()) == "timeout"


def test_hpcdist_store_without_server_is_lost(monkeypatch):
    monkeypatch.delenv("HPCDIST_STORE_SECRET", raising=False)
    monkeypatch.delenv("HPCDIST_STORE_SECRET_FILE", raising=False)
    master = TCPStore("127.0.0.1", 0, None, True, T10)
    client = TCPStore("127.0.0.1", master.port, timeout=T10)
    try:
        client.set("seen", "1")
        master.close()
        assert _outcome(client) == "lost"
    finally:
        client.close()


def test_torch_store_timeout_and_lost_server():
    dist = pytest.importorskip("torch.distributed")
    assert _outcome(dist.HashStore()) == "timeout"
    master = dist.TCPStore("127.0.0.1", 0, 1, True, timeout=T10)
    client = dist.TCPStore("127.0.0.1", master.port, 1, False, timeout=T10)
    client.set("seen", "1")
    del master  # torch's server stops with its last reference
    assert _outcome(client) == "lost"


def test_other_errors_pass_through():
    with pytest.raises(TypeError, match="keys must be a sequence of str keys"):
        Deadline(SHORT).wait(HashStore(), "never", lambda lost: "unused")  # type: ignore[arg-type]


def test_a_wait_that_succeeds_returns():
    store = HashStore()
    store.set("here", "1")
    Deadline(T10).wait(store, ["here"], lambda lost: "unused")


def test_waiting_ranks_fetch_who_arrived_only_when_more_did():
    """Every rank waiting for a late one refreshes its snapshot each second; the list of who arrived (one entry per
    rank) is fetched again only when the count moved: 4096 ranks fetching ~20 KB each second loaded rank 0."""
    from hpcdist.rendezvous.arrival import arrive

    class Counting(HashStore):
        gets = 0

        def get(self, key):
            if key.endswith("/who"):
                Counting.gets += 1
            return super().get(key)

    store = Counting()
    store.append("job/who", "2 ")  # rank 2 arrived; rank 1 never does
    store.add("job/count", 1)
    with pytest.raises(DistTimeoutError, match=r"2 of 3 processes joined \(missing rank\(s\): 1\)"):
        arrive(store, "job", 0, 3, Deadline(timedelta(seconds=2.2)))  # refreshes at about 1 and 2 s, then the message
    assert Counting.gets == 1
