"""The backend registry: a backend name -> the factory of its per-group engine.

``mpi`` is native. ``gloo`` is accepted for compatibility and runs on MPI.
``nccl`` drives CUDA arrays through NCCL (registered by
:mod:`hpcdist.backends.nccl`, loaded on first use). Third parties add
backends with :meth:`Backend.register_backend`.

A group's backend spec is a device map, ``{"cpu": "mpi", "cuda": "nccl"}``,
parsed from strings such as ``"mpi"``, ``"nccl"`` or ``"cpu:mpi,cuda:nccl"``.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

__all__ = ["Backend", "backend_factory", "parse_backend", "registered_backends"]

#: name -> (factory(pg, device_type) -> engine, devices it supports)
_REGISTRY: dict[str, tuple[Callable[..., Any], tuple[str, ...]]] = {}
#: names whose module registers them lazily on first use
_LAZY: dict[str, str] = {"mpi": "hpcdist.backends.mpi", "gloo": "hpcdist.backends.mpi", "nccl": "hpcdist.backends.nccl"}
_DEFAULT_DEVICES: dict[str, tuple[str, ...]] = {"mpi": ("cpu", "cuda"), "gloo": ("cpu", "cuda"), "nccl": ("cuda",)}


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
    backend_capability: dict[str, list[str]] = {"mpi": ["cpu", "cuda"], "gloo": ["cpu", "cuda"], "nccl": ["cuda"]}

    def __new__(cls, name: str) -> Backend:
        if not isinstance(name, str):  # ValueError, as torch's Backend
            raise ValueError(
                f"backend must be a string such as 'mpi', 'gloo' or 'nccl', got {type(name).__name__} ({name!r})"
            )
        value = name.lower()
        if value != "undefined" and value not in _known():
            raise ValueError(
                f"unknown backend {name!r}: expected one of {sorted(_known())} (or a device map like 'cpu:mpi,cuda:nccl')"
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

        The engine has the methods of :class:`hpcdist.backends.mpi.MPIEngine`
        it supports. A name already registered raises ValueError.
        """
        if not isinstance(name, str) or not name or not name.replace("_", "").isalnum():
            raise ValueError(f"backend name must be a non-empty identifier, got {name!r}")
        key = name.lower()
        if key in _REGISTRY or key in _LAZY:
            raise ValueError(f"backend {name!r} is already registered")
        if not callable(func):
            raise TypeError(f"register_backend: func must be callable, got {type(func).__name__}")
        devs = (devices,) if isinstance(devices, str) else tuple(devices or ("cpu", "cuda"))
        _REGISTRY[key] = (func, devs)
        setattr(cls, name.upper(), key)
        cls.backend_list.append(key)
        cls.backend_capability[key] = list(devs)


def _known() -> set[str]:
    return set(_REGISTRY) | set(_LAZY)


def registered_backends() -> list[str]:
    return sorted(_known())


def _load(name: str) -> tuple[Callable[..., Any], tuple[str, ...]]:
    hit = _REGISTRY.get(name)
    if hit is None and name in _LAZY:
        importlib.import_module(_LAZY[name])
        hit = _REGISTRY.get(name)
    if hit is None:
        raise ValueError(f"unknown backend {name!r}: expected one of {registered_backends()}")
    return hit


def register_builtin(name: str, func: Callable[..., Any], devices: tuple[str, ...]) -> None:
    """For hpcdist's own backend modules: register a lazily loaded backend."""
    _REGISTRY[name] = (func, devices)


def backend_factory(name: str) -> Callable[..., Any]:
    return _load(name)[0]


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
        devices = _REGISTRY[name][1] if name in _REGISTRY else _DEFAULT_DEVICES.get(name, ("cpu", "cuda"))
        return {d: name for d in devices}
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
    return name in _REGISTRY
