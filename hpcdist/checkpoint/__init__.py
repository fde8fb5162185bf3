"""Checkpoints in HDF5: sharded save and load with resharding, crash-safe, async, Slurm-aware.

``import hpcdist.checkpoint as ckpt`` (this package is not imported by
``import hpcdist``; h5py is imported only when a checkpoint is written or read).

* :func:`save` / :func:`load`: collective over a group; nested dicts of arrays
  (NumPy, torch, CuPy), :class:`Sharded` arrays, torch DTensors and values.
  Load reshards: a checkpoint written by N ranks loads on M with any slicing.
* :func:`async_save`: returns after the host copy; writes and commits in the background.
* :func:`latest`: the newest complete checkpoint of a directory.
* :class:`Preemption`: Slurm's warning signal → save at a step boundary → requeue.

On disk a checkpoint is a directory of HDF5 files plus ``hpcdist-checkpoint.json``;
see docs/checkpoint.md.
"""

from __future__ import annotations

from .api import load, save
from .asyncsave import SaveWork, async_save
from .errors import CheckpointError, ChecksumError, StructureError
from .layout import latest
from .preemption import Preemption
from .shard import Shard, Sharded

__all__ = [
    "CheckpointError",
    "ChecksumError",
    "Preemption",
    "SaveWork",
    "Shard",
    "Sharded",
    "StructureError",
    "async_save",
    "latest",
    "load",
    "save",
]
