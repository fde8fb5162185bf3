"""Starting ranks: ``hpcdist run`` (:mod:`.run`), the launcher registry
(:mod:`.launchers`), the per-rank bootstrap (:mod:`._bootstrap`), Slurm
hostlists (:mod:`.hostlist`) and :func:`spawn` (:mod:`.spawn`).

Nothing is imported here: ``import hpcdist.launch.spawn`` and friends load
only what they need.
"""
