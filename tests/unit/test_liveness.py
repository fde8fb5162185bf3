"""The liveness connections of a launcher-free world (hpcdist/rendezvous/liveness.py): errors at setup.

Real sockets on the loopback and hpcdist's HashStore; no MPI. A peer that never connects must give a
DistTimeoutError naming it within the timeout (it was a bare ``TimeoutError: timed out``), and a rank
that cannot reach rank 0 a DistNetworkError naming the address.
"""

from __future__ import annotations

import re
import socket
import struct
import threading
import time
from datetime import timedelta

import pytest

from hpcdist.errors import DistNetworkError, DistTimeoutError
from hpcdist.rendezvous.liveness import Liveness
from hpcdist.store import HashStore

pytestmark = pytest.mark.timeout(60)


def _connect_as(store: HashStore, rank: int) -> socket.socket:
    store.wait(["hpcdist/liveness/1"], timedelta(seconds=10))
    host, port = store.get("hpcdist/liveness/1").decode().rsplit(":", 1)
    conn = socket.create_connection((host, int(port)), timeout=10)
    conn.sendall(struct.pack("!i", rank))
    return conn


@pytest.mark.parametrize("present", [[], [2]])
def test_rank0_names_the_ranks_that_never_connect(present):
    store = HashStore()
    conns: list[socket.socket] = []
    threads = [threading.Thread(target=lambda r=r: conns.append(_connect_as(store, r))) for r in present]
    for t in threads:
        t.start()
    missing = sorted({1, 2, 3} - set(present))
    t0 = time.monotonic()
    with pytest.raises(
        DistTimeoutError, match=re.escape(f"rank(s) {missing} of this launcher-free world did not open")
    ):
        Liveness(store, 0, 4, timedelta(seconds=0.5), "127.0.0.1")
    assert time.monotonic() - t0 < 5
    for t in threads:
        t.join(10)
    for c in conns:
        c.close()


def test_a_rank_that_cannot_reach_rank0_names_the_address():
    with socket.create_server(("127.0.0.1", 0)) as s:
        port = s.getsockname()[1]  # closed again below: nobody listens there
    store = HashStore()
    store.add("hpcdist/liveness/epoch/0", 1)
    store.set("hpcdist/liveness/1", f"127.0.0.1:{port}")
    with pytest.raises(
        DistNetworkError, match=rf"rank 1 could not open its liveness connection to rank 0 at 127.0.0.1:{port}"
    ):
        Liveness(store, 1, 2, timedelta(seconds=1), "127.0.0.1")
