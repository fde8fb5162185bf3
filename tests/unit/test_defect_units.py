"""Unit checks of issue #10's smaller fixes: the watchdog's per-thread deadlines and grace, lazy torch views."""

from __future__ import annotations

import threading
import time

import pytest

from hpcdist._watchdog import Watchdog


class Recording(Watchdog):
    """A watchdog whose firing is recorded instead of ending the process."""

    def __init__(self, grace: float) -> None:
        super().__init__(grace)
        self.fired: list[object] = []

    def _fire(self, what, limit, thread):
        self.fired.append(what)


def test_a_call_returning_within_the_grace_period_is_not_aborted():
    wd = Recording(grace=1.0)
    wd.arm(0.1, "quick")
    time.sleep(0.4)  # past the deadline, inside the grace period
    wd.disarm()
    time.sleep(1.5)
    assert wd.fired == []


def test_a_hung_call_fires_while_other_threads_arm_and_disarm():
    wd = Recording(grace=0.1)
    stop = threading.Event()

    def hung():
        wd.arm(0.3, "hung call")
        stop.wait()  # never disarms before the watchdog fires

    def busy():
        while not stop.is_set():
            wd.arm(5.0, "healthy call")
            wd.disarm()
            time.sleep(0.001)

    threads = [threading.Thread(target=hung), threading.Thread(target=busy)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 20
    while not wd.fired and time.monotonic() < deadline:
        time.sleep(0.05)
    stop.set()
    for t in threads:
        t.join()
    assert wd.fired == ["hung call"]


def test_an_armed_stretch_is_watched_again_after_a_nested_one():
    """hpcdist bench arms a whole step; a call inside it that arms and disarms (a segment's setup) must not
    leave the rest of the step unwatched."""
    wd = Recording(grace=0.1)
    outer = wd.arm(0.5, "bench step")
    assert outer is None
    inner = wd.arm(30.0, "segment setup")
    wd.disarm(inner)  # the nested stretch ends well within its limit
    deadline = time.monotonic() + 20
    while not wd.fired and time.monotonic() < deadline:
        time.sleep(0.05)
    wd.disarm(outer)
    assert wd.fired == ["bench step"]


def test_lazy_conjugate_and_negative_torch_views_raise_hpcdists_type_error():
    torch = pytest.importorskip("torch")
    from hpcdist.buffers.adapters import adapt

    z = torch.ones(3, dtype=torch.complex64)
    with pytest.raises(TypeError, match=r"conjugate view .*resolve_conj\(\)"):
        adapt(z.conj(), "tensor", False)
    with pytest.raises(TypeError, match=r"negative view .*resolve_neg\(\)"):
        adapt(z.conj().imag, "tensor", True)
    assert adapt(z.conj().resolve_conj(), "tensor", True).dtype == "complex64"


def test_a_transport_failure_of_the_port_join_names_the_transport_settings_not_the_mpi_version():
    from hpcdist.rendezvous.ports import connect_failure

    lib = "MPICH Version:      4.3.2\nMPICH Release date: Mon Oct  6 2025\n"
    text = connect_failure(1, "Invalid port, error stack:\n...", lib)
    assert "rank 1" in text and "Invalid port" in text and "MPICH Version:      4.3.2" in text
    assert "UCX_TLS=tcp,self" in text and "MPIR_CVAR_CH4_NETMOD=ofi FI_PROVIDER=tcp" in text
    assert "install an MPI" not in text  # the version is fine: do not blame it
    broken = connect_failure(0, "Local and remote groups ...", "MPICH Version:      5.0.0\n")
    assert "MPICH 5.0.x cannot join" in broken
