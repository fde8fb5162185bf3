"""torch's own distributed test suite, ``DistributedTest._DistTestBase``, on a chosen backend.

Driven as torch's ``test/distributed/test_distributed_spawn.py`` drives it: one
``TestDistBackend`` subclass whose ``setUp`` spawns ``WORLD_SIZE`` fresh
processes per test (``multiprocessing`` spawn), each joining the default
process group through ``file://`` with an explicit rank and world size, running
the test body, and exiting; the parent collects the exit codes.

Environment (set by ``run_suite.py``):

- ``HPCDIST_SUITE_BACKEND``: the backend every process group of the suite is
  made with, ``gloo`` or ``hpcdist`` (importing ``hpcdist.torch`` registers it,
  in the parent and in every spawned rank, because each imports this module).
- ``WORLD_SIZE``: ranks per test.
- ``HPCDIST_SUITE_PROFILE``: the *gating profile*, ``gloo`` (the default) or
  ``mpi``: the backend name the suite's decorators and run-time skips see.

The suite decides which tests apply to a backend by its name, at import (it
skips DDP tests for backends outside ``backend_feature["ddp"]``, runs the
timeout and sparse tests only for a backend named ``gloo``, the CPU
``all_to_all`` tests only for one named ``mpi``, and so on) and at run time
(``skip_if_small_worldsize`` reads ``os.environ["BACKEND"]``). Here both
see the profile: with ``gloo``, hpcdist is asked to pass exactly the tests
gloo is asked to pass (the same set, the same skips); with ``mpi``, the tests
torch holds its own MPI backend to (``ProcessGroupMPI``, which torch's CPU
wheels do not build). After the import the module's ``BACKEND`` is switched
to the backend under test, which is the name every ``init_process_group`` and
``new_group`` call of the suite passes and what ``get_backend`` is checked
against (see ``_CpuBackendName`` for the test bodies that branch on the
profile's name).
"""

from __future__ import annotations

import os

BACKEND = os.environ.get("HPCDIST_SUITE_BACKEND", "gloo")
PROFILE = os.environ.get("HPCDIST_SUITE_PROFILE", "gloo")  # the gating profile: see the module docstring
os.environ["BACKEND"] = PROFILE
os.environ.setdefault("WORLD_SIZE", "2")

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

torch.backends.cuda.matmul.allow_tf32 = False

from torch.testing._internal.distributed import distributed_test as _dt  # noqa: E402


class _CpuBackendName(str):
    """The name of the backend under test, which the suite's test bodies also take for the profile's (``"gloo"``).

    A few test bodies pick their model by the backend's name
    (``if BACKEND == "mpi" or BACKEND == "gloo":`` builds the CPU model of
    ``_test_accumulate_gradients_no_sync``); a backend the suite does not know
    would take none of the branches. Equal to the profile's name as well as to itself,
    it is in every other way the plain name: ``BACKEND.lower()`` and
    ``dist.Backend(BACKEND)`` give ``"hpcdist"``, the name every process group
    is made with and ``get_backend`` is checked against.
    """

    def __eq__(self, other: object) -> bool:
        return str.__eq__(self, other) is True or other == PROFILE

    def __ne__(self, other: object) -> bool:
        return not self.__eq__(other)

    __hash__ = str.__hash__


if BACKEND != "gloo":
    import hpcdist.torch  # noqa: F401  registers the backend "hpcdist" with torch.distributed
if BACKEND != PROFILE:
    _dt.BACKEND = _CpuBackendName(BACKEND)
assert dist.is_available()


#: how ranks start: "spawn" is torch's choice (each rank imports torch and the suite afresh, ~10 s
#: of CPU per rank); "forkserver" forks each rank from a server that imported this module once,
#: so ranks are equally fresh processes (no state of the parent pytest process) but start in ~0.1 s
START_METHOD = os.environ.get("HPCDIST_SUITE_START", "forkserver")


def _start_rank(environ: dict[str, str], target, *args, **kwargs):
    """A rank forked from the server takes the parent's environment at this test's start, as a spawned one does."""
    os.environ.clear()
    os.environ.update(environ)
    return target(*args, **kwargs)


def _process_factory(ctx):
    def make(*, target, name, args, kwargs):
        return ctx.Process(target=_start_rank, name=name, args=(dict(os.environ), target, *args), kwargs=kwargs)

    return make


class TestDistBackendWithSpawn(_dt.TestDistBackend, _dt.DistributedTest._DistTestBase):
    def setUp(self) -> None:
        super().setUp()
        if START_METHOD == "spawn":
            self._spawn_processes()
        else:
            ctx = torch.multiprocessing.get_context(START_METHOD)
            if START_METHOD == "forkserver":
                ctx.set_forkserver_preload([__name__])
            self._start_processes(_process_factory(ctx))
        torch.backends.cudnn.flags(enabled=True, allow_tf32=False).__enter__()
