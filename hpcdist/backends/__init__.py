"""The backend registry: a backend name -> the factory of its per-group engine.

``mpi`` is native. ``gloo`` is accepted for compatibility and runs on MPI.
``nccl`` drives CUDA arrays through NCCL. The registry itself, and the
choice of engine for a (group, device) pair, live in
:mod:`hpcdist.backends.selection`; the interface every engine implements in
:mod:`hpcdist.backends.engine`. Third parties add backends with
:meth:`Backend.register_backend`.

The engines, one folder per path: :mod:`.mpi` (host arrays over MPI),
:mod:`.shm` (host arrays through shared memory on a node),
:mod:`.hierarchical` (host arrays of groups spanning nodes),
:mod:`.cuda_aware` (device pointers to a CUDA-aware MPI), :mod:`.staged`
(device arrays through pinned host memory) and :mod:`.nccl`.

A group's backend spec is a device map, ``{"cpu": "mpi", "cuda": "nccl"}``,
parsed from strings such as ``"mpi"``, ``"nccl"`` or ``"cpu:mpi,cuda:nccl"``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

from . import selection
from .engine import Engine

__all__ = ["Backend", "Engine", "parse_backend", "registered_backends"]


class Backend(str):
    """torch's ``Backend``: a lower-case backend name, with the registry on it.

    ``Backend("MPI") == "mpi"``; ``Backend("nope")`` raises ValueError.
    ``gloo`` is accepted and runs on MPI: hpcdist has no gloo transport.
    """

    UNDEFINED = "undefined"
    GLOO = "gloo"
    NCCL = "nccl"
    UCC = "ucc"
    MPI = "mpi"
    XCCL = "xccl"
    FAKE = "fake"

    backend_list = ["undefined", "gloo", "nccl", "mpi"]
    default_device_backend_map: dict[str, str] = {"cpu": "mpi", "cuda": "mpi"}
    backend_capability: dict[str, list[str]] = {n: list(selection.devices_of(n)) for n in selection.known()}

    def __new__(cls, name: str) -> Backend:
        if not isinstance(name, str):  # ValueError, as torch's Backend
            raise ValueError(
                f"backend must be a string such as 'mpi', 'gloo' or 'nccl', got {type(name).__name__} ({name!r})"
            )
        value = name.lower()
        if value != "undefined" and value not in selection.known():
            raise ValueError(
                f"unknown backend {name!r}: expected one of {selection.known()} (or a device map like 'cpu:mpi,cuda:nccl')"
            )
        return str.__new__(cls, value)

    @classmethod
    def register_backend(
        cls,
        name: str,
        func: Callable[..., Any],
        extended_api: bool = False,
        devices: str | list[str] | None = None,
    ) -> None:
        """Register backend ``name``; ``func(pg, device_type)`` builds its engine for one group.

        Args:
            name: the backend's name (an identifier; stored lower case).
            func: ``func(pg, device_type)`` returns an instance of a subclass
                of :class:`hpcdist.backends.Engine` serving group ``pg``'s
                arrays of ``device_type`` (see docs/architecture.md, "Write
                an engine").
            extended_api: accepted for torch compatibility and ignored.
            devices: the device types the backend serves (``"cpu"``,
                ``"cuda"`` or a list); default both.

        A name already registered raises ValueError.
        """
        if not isinstance(name, str) or not name or not name.replace("_", "").isalnum():
            raise ValueError(f"backend name must be a non-empty identifier, got {name!r}")
        key = name.lower()
        if key in selection.known():
            raise ValueError(f"backend {name!r} is already registered")
        if not callable(func):
            raise TypeError(f"register_backend: func must be callable, got {type(func).__name__}")
        devs = (devices,) if isinstance(devices, str) else tuple(devices or ("cpu", "cuda"))
        selection.register(key, func, devs)
        setattr(cls, name.upper(), key)
        cls.backend_list.append(key)
        cls.backend_capability[key] = list(devs)


def registered_backends() -> list[str]:
    return selection.known()


def parse_backend(spec: Any) -> dict[str, str]:
    """``"mpi"`` / ``"nccl"`` / ``"cpu:mpi,cuda:nccl"`` / None -> ``{device_type: name}``.

    Raises ValueError naming the bad part.
    """
    if spec is None or (isinstance(spec, str) and spec.lower() == "undefined"):
        return dict(Backend.default_device_backend_map)
    if not isinstance(spec, str):
        raise TypeError(f"backend must be a string such as 'mpi' or 'cpu:mpi,cuda:nccl', got {type(spec).__name__}")
    text = spec.strip().lower()
    if ":" not in text:
        name = str(Backend(text))
        return {d: name for d in selection.devices_of(name)}
    out: dict[str, str] = {}
    for part in text.split(","):
        dev, sep, name = part.strip().partition(":")
        if not sep or not dev or not name:
            raise ValueError(
                f"backend {spec!r}: each entry must be 'device:backend' (e.g. 'cpu:mpi,cuda:nccl'), got {part!r}"
            )
        if dev not in ("cpu", "cuda"):
            raise ValueError(f"backend {spec!r}: device must be 'cpu' or 'cuda', got {dev!r}")
        out[dev] = str(Backend(name))
    return out


def is_backend_available(backend: str) -> bool:
    """Whether ``backend`` can be used here (nccl needs cupy with NCCL)."""
    name = str(backend).lower()
    if name in ("mpi", "gloo"):
        try:
            import mpi4py  # noqa: F401
        except ImportError:
            return False
        return True
    if name == "nccl":
        try:
            nccl = importlib.import_module("hpcdist.backends.nccl")
        except ImportError:
            return False
        return bool(nccl.available())
    return name in selection.known()
