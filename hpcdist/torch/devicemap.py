"""Device maps such as ``"cpu:hpcdist,cuda:nccl"`` and ``"cpu:gloo,cuda:hpcdist"``.

torch lets a Python backend be only a whole ``ProcessGroup`` (its C++
``Backend`` cannot be subclassed from Python): when the creator returns one,
torch uses it for every device and drops the backends of the map's other
devices. So, for a map that names other backends too, the creator builds
them itself (torch's ``ProcessGroupGloo``/``ProcessGroupNCCL``, on a store
prefix of their own) and returns a :class:`RoutedProcessGroup`: each call
goes to the backend of its tensors' device, hpcdist's own for the devices
mapped to "hpcdist".

The map is read from torch's ``BackendConfig`` of the group being made (the
creator's caller); when torch changes that, every device falls to hpcdist.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from .backend import BACKEND_NAME, HpcdistProcessGroup

__all__ = ["RoutedProcessGroup", "device_map", "make_delegates"]


def device_map(depth: int = 2) -> dict[str, str]:
    """The device -> backend map of the group torch is making (``{}`` when it cannot be read)."""
    frame = sys._getframe(depth)
    for _ in range(4):
        if frame is None:
            break
        config = frame.f_locals.get("backend_config")
        if config is not None and hasattr(config, "get_device_backend_map"):
            return {str(d): str(b) for d, b in config.get_device_backend_map().items()}
        frame = frame.f_back  # type: ignore[assignment]
    return {}


def make_delegates(
    dmap: dict[str, str], store: Any, rank: int, size: int, timeout: timedelta, ranks: list[int], name: str
) -> dict[str, Any]:
    """torch backends for the devices ``dmap`` maps to something other than hpcdist (collective)."""
    out: dict[str, Any] = {}
    for device, backend in sorted(dmap.items()):
        if backend == BACKEND_NAME:
            continue
        factory = _FACTORIES.get(backend)
        if factory is None:
            raise ValueError(
                f"hpcdist backend: device map entry '{device}:{backend}' is not supported beside hpcdist; "
                f"supported: {', '.join(sorted(_FACTORIES))} (e.g. 'cpu:hpcdist,cuda:nccl')"
            )
        sub = dist.PrefixStore(f"hpcdist-delegate/{device}/", store)
        out[device] = factory(sub, rank, size, timeout, ranks, name)
    return out


def _gloo(store: Any, rank: int, size: int, timeout: timedelta, ranks: list[int], name: str) -> Any:
    from torch.distributed import ProcessGroupGloo

    pg = ProcessGroupGloo(store, rank, size, timeout=timeout)
    pg.options.global_ranks_in_group = ranks
    pg.options.group_name = name  # type: ignore[assignment]
    return pg


def _nccl(store: Any, rank: int, size: int, timeout: timedelta, ranks: list[int], name: str) -> Any:
    if not dist.is_nccl_available():
        raise RuntimeError(
            "hpcdist backend: the device map asks for nccl, but this torch has no NCCL (a CPU build); use "
            "'cpu:hpcdist,cuda:hpcdist' or install a CUDA build of torch"
        )
    from torch.distributed import ProcessGroupNCCL

    opts = ProcessGroupNCCL.Options()
    opts.is_high_priority_stream = False
    opts._timeout = timeout
    opts.global_ranks_in_group = ranks
    opts.group_name = name  # type: ignore[assignment]
    return ProcessGroupNCCL(store, rank, size, opts)


_FACTORIES: dict[str, Callable[..., Any]] = {"gloo": _gloo, "nccl": _nccl}


def _first(args: tuple[Any, ...], i: int) -> Any:
    """The first tensor of argument ``i`` (a tensor, or a list, maybe nested once)."""
    x = args[i]
    while isinstance(x, (list, tuple)):
        if not x:
            return None
        x = x[0]
    return x


class _Joined(dist._Work):
    """Several torch Works as one (a coalesced call a delegate makes one by one)."""

    def __init__(self, works: list[Any], result: list[Any]) -> None:
        super().__init__()
        self._works = works
        self._result = result

    def wait(self, timeout: Any = None) -> bool:
        for w in self._works:
            w.wait() if timeout is None else w.wait(timeout)
        return True

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)

    def result(self) -> list[Any]:
        return self._result

    def get_future(self) -> Any:
        futs = [w.get_future() for w in self._works]
        return torch.futures.collect_all(futs).then(lambda _: self._result)


def _pairwise(method: str) -> Callable[..., Any]:
    def call(backend: Any, outs: list[Any], ins: list[Any], opts: Any = None) -> Any:
        fn = getattr(backend, method)
        works = [fn(o, i, opts) if opts is not None else fn(o, i) for o, i in zip(outs, ins, strict=True)]
        return _Joined(works, list(outs))

    return call


def _named(method: str) -> Callable[..., Any]:
    def call(backend: Any, *args: Any) -> Any:
        return getattr(backend, method)(*args)

    return call


#: method of HpcdistProcessGroup -> (which argument holds a tensor, how the delegate runs it)
_ROUTES: dict[str, tuple[int, Callable[..., Any]]] = {
    "broadcast": (0, _named("broadcast")),
    "allreduce": (0, _named("allreduce")),
    "allreduce_coalesced": (0, _named("allreduce_coalesced")),
    "reduce": (0, _named("reduce")),
    "allgather": (1, _named("allgather")),
    "all_gather_single": (1, _named("_allgather_base")),
    "_allgather_base": (1, _named("_allgather_base")),
    "allgather_coalesced": (1, _named("allgather_coalesced")),
    "all_gather_single_coalesced": (1, _pairwise("_allgather_base")),
    "allgather_into_tensor_coalesced": (1, _pairwise("_allgather_base")),
    "gather": (1, _named("gather")),
    "scatter": (0, _named("scatter")),
    "reduce_scatter": (0, _named("reduce_scatter")),
    "reduce_scatter_single": (0, _named("_reduce_scatter_base")),
    "_reduce_scatter_base": (0, _named("_reduce_scatter_base")),
    "reduce_scatter_single_coalesced": (0, _pairwise("_reduce_scatter_base")),
    "reduce_scatter_tensor_coalesced": (0, _pairwise("_reduce_scatter_base")),
    "alltoall": (0, _named("alltoall")),
    "all_to_all_single": (0, _named("alltoall_base")),
    "alltoall_base": (0, _named("alltoall_base")),
    "send": (0, _named("send")),
    "recv": (0, _named("recv")),
    "recv_anysource": (0, _named("recv_anysource")),
}


class RoutedProcessGroup(HpcdistProcessGroup):
    """An hpcdist group whose calls on some devices go to other torch backends (a device map)."""

    def __init__(self, *args: Any, delegates: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._delegates = delegates

    def _backend_for(self, device_type: str) -> Any:
        """The delegate (torch's own Backend) of a device the map gives to another backend, else this group."""
        delegate = self._delegates.get(device_type)
        return super()._backend_for(device_type) if delegate is None else delegate

    def shutdown(self) -> None:
        for backend in self._delegates.values():
            try:
                backend.shutdown()
            except Exception:  # pragma: no cover - teardown goes on
                pass
        super().shutdown()


def _routed(name: str, arg: int, run: Callable[..., Any]) -> Callable[..., Any]:
    own = getattr(HpcdistProcessGroup, name)

    def method(self: RoutedProcessGroup, *args: Any) -> Any:
        t = _first(args, arg)
        backend = None if t is None else self._delegates.get(t.device.type)
        return own(self, *args) if backend is None else run(backend, *args)

    method.__name__ = name
    method.__doc__ = own.__doc__
    return method


for _name, (_arg, _run) in _ROUTES.items():
    setattr(RoutedProcessGroup, _name, _routed(_name, _arg, _run))
