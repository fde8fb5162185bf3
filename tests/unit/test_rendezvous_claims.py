"""Rank claims of the port rendezvous: a rank asked for twice is refused by name."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from hpcdist.rendezvous import ports
from hpcdist.store import HashStore, TCPStore


def test_claim_is_exclusive_between_processes_and_reentrant_for_one():
    store = HashStore()
    key = ports._claim_rank(store, 1, 4, "process 10 on a")
    assert ports._claim_rank(store, 1, 4, "process 10 on a") == key  # the same process joins again
    with pytest.raises(ValueError, match=r"rank 1 is claimed twice: process 10 on a .* process 11 on b") as info:
        ports._claim_rank(store, 1, 4, "process 11 on b")
    assert "distinct RANK 0..3" in str(info.value)
    ports._claim_rank(store, 2, 4, "process 11 on b")  # other ranks are free


def test_release_lets_another_process_take_the_rank():
    store = HashStore()
    key = ports._claim_rank(store, 0, 2, "process 10 on a")
    ports._release_rank(store, key, "process 11 on b")  # not the holder: no effect
    with pytest.raises(ValueError, match="claimed twice"):
        ports._claim_rank(store, 0, 2, "process 11 on b")
    ports._release_rank(store, key, "process 10 on a")
    ports._claim_rank(store, 0, 2, "process 11 on b")


@pytest.mark.timeout(20)  # far below the store's 120 s timeout: waiting for it would fail the test
def test_release_is_quick_when_the_store_is_gone():
    """After rank 0's server went away, giving up the claim must not wait for the store timeout."""
    timeout = timedelta(seconds=120)
    server = TCPStore("127.0.0.1", 0, 1, True, timeout, wait_for_workers=False)
    client = TCPStore("127.0.0.1", server.port, 1, False, timeout)
    key = ports._claim_rank(client, 1, 2, "process 10 on a")
    server.close()
    time.sleep(0.2)
    ports._release_rank(client, key, "process 10 on a")
    assert client.timeout == timeout
    client.close()
