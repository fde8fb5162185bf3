"""Process subgroups: new_group, new_subgroups, and collectives on a group.

    hpcdist run -n 4 examples/subgroups.py      (any N >= 2; odd N too)

1. ``new_group(ranks)`` of the even ranks: a sum over the evens only. Every
   rank calls ``new_group`` (it is collective over the world), but only members
   use the group (a non-member calling a collective on it gets a warning, as in torch).
2. ``new_subgroups(group_size=2)``: consecutive pairs ``[0,1] [2,3] ...``;
   each rank gets its own pair's group and broadcasts from the pair's first
   rank. With an odd world size the pairs cannot tile it, so this step uses
   ``new_subgroups_by_enumeration`` with a last group of one.
"""

from __future__ import annotations

import numpy as np

import hpcdist as dist


def main() -> None:
    dist.init_process_group("mpi")
    rank, world = dist.get_rank(), dist.get_world_size()

    evens = list(range(0, world, 2))
    even_group = dist.new_group(evens)  # collective: every rank calls it
    if rank in evens:
        x = np.array([float(rank)])
        dist.all_reduce(x, group=even_group)
        print(f"rank {rank}: sum over even ranks {evens} = {x[0]:g} (rank in group {dist.get_rank(even_group)})")
    else:
        print(f"rank {rank}: not in the even group {evens} (it still had to call new_group)")

    if world % 2 == 0:
        my_pair, _all_pairs = dist.new_subgroups(group_size=2)
    else:
        pairs = [list(range(i, min(i + 2, world))) for i in range(0, world, 2)]
        my_pair, _all_pairs = dist.new_subgroups_by_enumeration(pairs)
    members = dist.get_process_group_ranks(my_pair)
    value = np.array([100.0 + rank])
    dist.broadcast(value, src=members[0], group=my_pair)  # src is a global rank, as in torch
    print(f"rank {rank}: pair {members} got {value[0]:g} from rank {members[0]}")

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
