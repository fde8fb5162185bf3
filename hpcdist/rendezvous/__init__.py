"""Rendezvous: bring the processes of a job onto one MPI intracommunicator.

=====================  =====================================================
``registry``           ``register_rendezvous_handler``, ``rendezvous``
``handlers``           ``env://``, ``tcp://``, ``file://``, ``mpi://``
``fields``             parse and check rank, world size, host, port
``detect``             which launcher started this process (env only)
``ports``              join MPI singletons over MPI ports, in rank order
``join``               ``join_world``: the entry point of ``init_process_group``
``group_store``        a TCP store for an MPI-connected group
``torchrun_env``       export RANK, WORLD_SIZE, LOCAL_RANK, ... after init
=====================  =====================================================

Importing this package does no MPI work (mpi4py.MPI is imported inside the
functions that need it).
"""

from __future__ import annotations

from hpcdist.rendezvous import handlers as _handlers  # noqa: F401  (registers the built-in schemes)
from hpcdist.rendezvous.detect import detect_launcher, launcher_local_rank_size, launcher_rank_size
from hpcdist.rendezvous.group_store import group_store
from hpcdist.rendezvous.join import Joined, join_world
from hpcdist.rendezvous.registry import register_rendezvous_handler, registered_schemes, rendezvous
from hpcdist.rendezvous.torchrun_env import export_torchrun_env, restore_env

__all__ = [
    "Joined",
    "detect_launcher",
    "export_torchrun_env",
    "group_store",
    "join_world",
    "launcher_local_rank_size",
    "launcher_rank_size",
    "register_rendezvous_handler",
    "registered_schemes",
    "rendezvous",
    "restore_env",
]
