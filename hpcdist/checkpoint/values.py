"""Non-array leaves of a state: Python scalars, strings, bytes, None and small picklable objects.

Each value is encoded as a small NumPy array plus an encoding name, so it is
stored as an ordinary HDF5 dataset (readable by plain h5py: numbers as 0-d
datasets, strings as their UTF-8 bytes in a ``uint8`` dataset, encoding
``"utf8"``, so every string comes back exactly, trailing NULs included).
Checkpoints written before that stored strings as fixed-length ``S`` data
(encoding ``"str"``); they still load as they did. Only exact ``int``,
``float``, ``complex``, ``str`` and ``bytes`` take the plain encodings (NumPy
scalars keep their type, subclasses such as an ``IntEnum`` are pickled), so a
value loads with the type it was saved with. Anything else is pickled; pickles
are loaded through hpcdist's restricted unpickler unless the caller trusts the
checkpoint (:func:`load_pickle`, the one place that unpickles).
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import numpy as np

__all__ = ["ENCODINGS", "decode", "dump_pickle", "encode", "load_pickle"]


def dump_pickle(obj: Any) -> bytes:
    """The bytes a picklable leaf is stored as."""
    try:
        return pickle.dumps(obj, protocol=5)
    except Exception as exc:
        raise TypeError(
            f"cannot checkpoint a {type(obj).__name__}: it is neither an array nor picklable ({exc})"
        ) from None


def load_pickle(raw: bytes, trusted: bool) -> Any:
    """Unpickle a stored leaf: with hpcdist's restricted unpickler unless ``trusted``."""
    if trusted:
        return pickle.loads(raw)
    from ..objects import _RestrictedUnpickler

    try:
        return _RestrictedUnpickler(io.BytesIO(raw)).load()
    except pickle.UnpicklingError as exc:
        raise pickle.UnpicklingError(
            f"{exc} (checkpoint objects are unpickled restricted; pass trusted=True to load() for a checkpoint "
            "you wrote yourself)"
        ) from None


def encode(value: Any) -> tuple[str, np.ndarray]:
    """(encoding name, array) for a non-array leaf; the value's exact type decides (no subclasses)."""
    t = type(value)
    if value is None:
        return "none", np.zeros(0, dtype=np.uint8)
    if isinstance(value, np.generic) and value.dtype.kind in "biufc":
        return "numpy-scalar", np.array(value)
    if t is bool:
        return "bool", np.array(value, dtype=np.bool_)
    if t is int and -(2**63) <= value < 2**63:
        return "int", np.array(value, dtype=np.int64)
    if t is float:
        return "float", np.array(value, dtype=np.float64)
    if t is complex:
        return "complex", np.array(value, dtype=np.complex128)
    if t is str:
        return "utf8", np.frombuffer(value.encode("utf-8"), dtype=np.uint8).copy()
    if t is bytes:
        return "bytes", np.frombuffer(value, dtype=np.uint8).copy()
    return "pickle", np.frombuffer(dump_pickle(value), dtype=np.uint8).copy()


def decode(encoding: str, arr: np.ndarray, trusted: bool) -> Any:
    """The value :func:`encode` made ``arr`` of."""
    return _DECODERS[encoding](arr, trusted)


_DECODERS: dict[str, Any] = {
    "none": lambda a, t: None,
    "bool": lambda a, t: bool(a[()]),
    "int": lambda a, t: int(a[()]),
    "float": lambda a, t: float(a[()]),
    "complex": lambda a, t: complex(a[()]),
    "str": lambda a, t: bytes(a[()]).rstrip(b"\0").decode("utf-8"),  # the format before "utf8" (NULs lost)
    "utf8": lambda a, t: a.tobytes().decode("utf-8"),
    "bytes": lambda a, t: a.tobytes(),
    "numpy-scalar": lambda a, t: a[()],
    "pickle": lambda a, t: load_pickle(a.tobytes(), t),
}

#: the encodings a checkpoint's metadata may name (old ones included)
ENCODINGS = frozenset(_DECODERS)
