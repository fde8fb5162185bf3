"""hpcdist: torch.distributed's programming model on MPI.

``import hpcdist as dist`` gives the names of ``torch.distributed`` —
``init_process_group``, groups, point-to-point, collectives, object
collectives, ``Work``, stores — on NumPy arrays, PyTorch tensors and CuPy
arrays, over any MPI. Importing hpcdist does no MPI work: MPI starts in
:func:`init_process_group`.
"""

from __future__ import annotations

from . import (
    group,  # the module is torch's ``group`` namespace: ``hpcdist.group.WORLD`` (see its __getattr__)
    symmetric_memory,  # hpcdist.symmetric_memory.empty: arrays collectives read where they lie
)
from ._init import (
    destroy_process_group,
    get_backend,
    get_backend_config,
    get_pg_count,
    get_rank,
    get_world_size,
    init_process_group,
    is_initialized,
)
from ._queries import (
    get_default_backend_for_device,
    get_node_local_rank,
    is_available,
    is_backend_available,
    is_gloo_available,
    is_mpi_available,
    is_nccl_available,
    is_torchelastic_launched,
    is_ucc_available,
    is_xccl_available,
)
from ._version import __version__
from .backends import Backend
from .bucketing import all_reduce_bucketed, bucket_indices, bucket_views
from .collectives import (
    all_gather,
    all_gather_coalesced,
    all_gather_into_tensor,
    all_gather_single,
    all_reduce,
    all_reduce_coalesced,
    all_to_all,
    all_to_all_single,
    barrier,
    broadcast,
    gather,
    reduce,
    reduce_scatter,
    reduce_scatter_single,
    reduce_scatter_tensor,
    scatter,
)
from .debug import DebugLevel, breakpoint, get_debug_level, monitored_barrier, set_debug_level, set_debug_level_from_env
from .errors import (
    DistBackendError,
    DistError,
    DistNetworkError,
    DistStoreError,
    DistStoreTimeoutError,
    DistTimeoutError,
    DtypeMismatchError,
    QueueEmptyError,
)
from .flight import dump_flight_recorder
from .gpu import cuda_aware_mpi, device_for_local_rank, set_device_for_local_rank
from .group import (
    GroupMember,
    ProcessGroup,
    get_global_rank,
    get_group_rank,
    get_process_group_ranks,
    new_group,
    new_subgroups,
    new_subgroups_by_enumeration,
    shrink_group,
    split_group,
)
from .launch.spawn import ProcessContext, ProcessExitedException, ProcessRaisedException, spawn
from .mesh import DeviceMesh, init_device_mesh
from .objects import (
    all_gather_object,
    broadcast_object_list,
    gather_object,
    recv_object_list,
    scatter_object_list,
    send_object_list,
)
from .ops import RedOpType, ReduceOp, _make_nccl_premul_sum, reduce_op, supports_complex
from .p2p import P2POp, batch_isend_irecv, irecv, isend, recv, send
from .rendezvous import register_rendezvous_handler, rendezvous
from .store import FileStore, HashStore, PrefixStore, Store, TCPStore
from .work import Future, Work

__all__ = [
    "Backend",
    "DebugLevel",
    "DeviceMesh",
    "DistBackendError",
    "DistError",
    "DistNetworkError",
    "DistStoreError",
    "DistStoreTimeoutError",
    "DistTimeoutError",
    "DtypeMismatchError",
    "FileStore",
    "Future",
    "GroupMember",
    "HashStore",
    "P2POp",
    "PrefixStore",
    "ProcessContext",
    "ProcessExitedException",
    "ProcessGroup",
    "ProcessRaisedException",
    "QueueEmptyError",
    "RedOpType",
    "ReduceOp",
    "Store",
    "TCPStore",
    "Work",
    "__version__",
    "_make_nccl_premul_sum",
    "all_gather",
    "all_gather_coalesced",
    "all_gather_into_tensor",
    "all_gather_object",
    "all_gather_single",
    "all_reduce",
    "all_reduce_bucketed",
    "all_reduce_coalesced",
    "all_to_all",
    "all_to_all_single",
    "barrier",
    "batch_isend_irecv",
    "breakpoint",
    "broadcast",
    "bucket_indices",
    "bucket_views",
    "broadcast_object_list",
    "cuda_aware_mpi",
    "destroy_process_group",
    "device_for_local_rank",
    "dump_flight_recorder",
    "gather",
    "gather_object",
    "get_backend",
    "get_backend_config",
    "get_debug_level",
    "get_default_backend_for_device",
    "get_global_rank",
    "get_group_rank",
    "get_node_local_rank",
    "get_pg_count",
    "get_process_group_ranks",
    "get_rank",
    "get_world_size",
    "group",
    "init_device_mesh",
    "init_process_group",
    "irecv",
    "is_available",
    "is_backend_available",
    "is_gloo_available",
    "is_initialized",
    "is_mpi_available",
    "is_nccl_available",
    "is_torchelastic_launched",
    "is_ucc_available",
    "is_xccl_available",
    "isend",
    "monitored_barrier",
    "new_group",
    "new_subgroups",
    "new_subgroups_by_enumeration",
    "recv",
    "recv_object_list",
    "reduce",
    "reduce_op",
    "reduce_scatter",
    "reduce_scatter_single",
    "reduce_scatter_tensor",
    "register_rendezvous_handler",
    "rendezvous",
    "scatter",
    "scatter_object_list",
    "send",
    "send_object_list",
    "set_debug_level",
    "set_debug_level_from_env",
    "set_device_for_local_rank",
    "shrink_group",
    "spawn",
    "split_group",
    "supports_complex",
    "symmetric_memory",
]
