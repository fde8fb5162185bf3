"""Object collectives: any picklable Python object, torch's *_object API.

    hpcdist run -n 3 examples/object_collectives.py

- ``all_gather_object``: every rank's dict, on every rank;
- ``broadcast_object_list``: rank 0's configuration to all;
- ``gather_object`` / ``scatter_object_list``: results to rank 0, work items from it.

These pickle: only use them between processes you trust (``HPCDIST_OBJECT_UNPICKLER=restricted``
limits what may be unpickled). For arrays, the buffer collectives (``all_gather``) are faster.
"""

from __future__ import annotations

import socket

import hpcdist as dist


def main() -> None:
    dist.init_process_group("mpi")
    rank, world = dist.get_rank(), dist.get_world_size()

    everyone: list = [None] * world
    dist.all_gather_object(everyone, {"rank": rank, "host": socket.gethostname(), "square": rank * rank})
    if rank == 0:
        print("all_gather_object:", [d["square"] for d in everyone])

    config = [{"lr": 0.1, "layers": [64, 64], "name": "demo"}] if rank == 0 else [None]
    dist.broadcast_object_list(config, src=0)
    print(f"rank {rank}: broadcast_object_list -> {config[0]['name']} lr={config[0]['lr']}", flush=True)

    work = [f"task-{i}" for i in range(world)] if rank == 0 else None
    mine: list = [None]
    dist.scatter_object_list(mine, work, src=0)
    result = f"{mine[0]} done by rank {rank}"
    results: list | None = [None] * world if rank == 0 else None
    dist.gather_object(result, results, dst=0)
    if rank == 0:
        print("gather_object:", results)

    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
