"""Device arrays over an MPI that is not CUDA-aware, staged through pinned host memory.

* :mod:`.engine` — :class:`StagedEngine`: copy down, run the host MPI engine, copy back;
* :mod:`.pinned` — the pool of pinned host blocks it reuses across calls (:func:`pinned_pool`).
"""

from .engine import StagedEngine
from .pinned import PinnedPool, pinned_pool

__all__ = ["PinnedPool", "StagedEngine", "pinned_pool"]
