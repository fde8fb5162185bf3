"""The restricted unpickler against NumPy's own classes given crafted arguments (adversarial p2p/objects round).

Every class the restricted mode allows is NumPy's or the standard library's,
but NumPy's trust their arguments: a dtype state with forged flags, a call
of ``numpy.ndarray`` over the sender's bytes, or a second ``BUILD`` of a
dtype or array already in use hand the reader object pointers the sender
chose, or memory NumPy freed. Payloads here use zero bytes (NULL pointers
read as None) so that a refusal is what the test sees, never a crash; the
two that would read freed or foreign memory run in a child process.
"""

from __future__ import annotations

import io
import pickle
import struct
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from hpcdist.objects import _RestrictedUnpickler, dumps, loads


def _str(s: str) -> bytes:
    raw = s.encode()
    return b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE


def _bytes(b: bytes) -> bytes:
    return b"C" + bytes([len(b)]) + b  # SHORT_BINBYTES


def _int(i: int) -> bytes:
    return b"J" + struct.pack("<i", i)  # BININT


def glob4(module: str, name: str) -> bytes:
    return _str(module) + _str(name) + b"\x93"  # STACK_GLOBAL


def tup(*items: bytes) -> bytes:
    return b"(" + b"".join(items) + b"t"  # MARK ... TUPLE


def call(fn: bytes, *args: bytes) -> bytes:
    return fn + tup(*args) + b"R"  # REDUCE


def pickle4(body: bytes) -> bytes:
    return b"\x80\x04" + body + b"."


NUMERIC = "numpy._core.numeric" if hasattr(np, "_core") else "numpy.core.numeric"
MULTIARRAY = "numpy._core.multiarray" if hasattr(np, "_core") else "numpy.core.multiarray"


def dtype_build(args: tuple[bytes, ...], state: bytes) -> bytes:
    """``numpy.dtype(*args)`` then BUILD with ``state`` (how NumPy pickles a dtype)."""
    return call(glob4("numpy", "dtype"), *args) + state + b"b"


def dtype_state(names: bytes, fields: bytes, elsize: int, alignment: int, flags: int) -> bytes:
    return tup(_int(3), _str("|"), b"N", names, fields, _int(elsize), _int(alignment), _int(flags))


#: an object dtype whose state says "no Python objects" (flags 0)
FORGED_OBJECT = dtype_build((_str("O8"), b"\x89", b"\x88"), dtype_state(b"N", b"N", -1, -1, 0))
#: a structured dtype with an object field, flags 0
FORGED_FIELD = dtype_build(
    (_str("V8"), b"\x89", b"\x88"),
    dtype_state(
        tup(_str("a")), b"}" + _str("a") + tup(call(glob4("numpy", "dtype"), _str("O8")), _int(0)) + b"s", 8, 1, 0
    ),
)
#: a structured dtype whose field lies beyond its item size
FORGED_OFFSET = dtype_build(
    (_str("V8"), b"\x89", b"\x88"),
    dtype_state(
        tup(_str("a")), b"}" + _str("a") + tup(call(glob4("numpy", "dtype"), _str("f8")), _int(4096)) + b"s", 8, 1, 0
    ),
)


def frombuffer(dtype: bytes) -> bytes:
    return call(glob4(NUMERIC, "_frombuffer"), _bytes(b"\0" * 8), dtype, tup(_int(1)), _str("C"))


GADGETS = {
    "forged object dtype via _frombuffer": pickle4(frombuffer(FORGED_OBJECT)),
    "forged object field via _frombuffer": pickle4(frombuffer(FORGED_FIELD)),
    "field beyond the item size": pickle4(frombuffer(FORGED_OFFSET)),
    "forged dtype alone": pickle4(FORGED_OBJECT),
    "ndarray(shape, 'O', buffer) by REDUCE": pickle4(
        call(glob4("numpy", "ndarray"), tup(_int(1)), _str("O"), _bytes(b"\0" * 8))
    ),
    "ndarray.__new__ by NEWOBJ": pickle4(
        glob4("numpy", "ndarray") + tup(tup(_int(1)), _str("O"), _bytes(b"\0" * 8)) + b"\x81"
    ),
    "ndarray by OBJ": pickle4(b"(" + glob4("numpy", "ndarray") + tup(_int(1)) + _str("O") + _bytes(b"\0" * 8) + b"o"),
}


@pytest.mark.parametrize("name", sorted(GADGETS))
def test_numpy_gadget_is_refused(name, monkeypatch):
    payload = GADGETS[name]
    with pytest.raises(pickle.UnpicklingError, match="restricted refuses"):
        _RestrictedUnpickler(io.BytesIO(payload)).load()
    # the same through loads(), the path every object collective takes (its fast path hands NumPy names over)
    monkeypatch.setenv("HPCDIST_OBJECT_UNPICKLER", "restricted")
    main = np.frombuffer(payload, dtype=np.uint8)
    framed = np.concatenate([np.array([0, main.size], dtype=np.int64).view(np.uint8), main])
    with pytest.raises(pickle.UnpicklingError, match="restricted refuses"):
        loads(framed)


# A dtype BUILT after an array was made over it, and an array BUILT after a view was made of it: NumPy changes the
# object in place, so the earlier array reads the sender's bytes as object pointers, and the view reads freed memory.
_LATE_DTYPE = pickle4(
    call(glob4("numpy", "dtype"), _str("V8"), b"\x89", b"\x88")
    + b"\x94"  # MEMOIZE: memo[0] is the dtype, still V8
    + call(glob4(NUMERIC, "_frombuffer"), _bytes(b"\x41" * 8), b"h\x00", tup(_int(1)), _str("C"))
    + b"h\x00"
    + dtype_state(
        tup(_str("a")),
        b"}" + _str("a") + tup(call(glob4("numpy", "dtype"), _str("O8")), _int(0)) + b"s",
        8,
        1,
        int(np.dtype([("a", "O")]).flags),
    )
    + b"b"  # BUILD: a consistent state, but the array above already uses this dtype
    + b"\x86"  # TUPLE2 (array, dtype)
)
_LATE_ARRAY = pickle4(
    call(glob4(MULTIARRAY, "_reconstruct"), glob4("numpy", "ndarray"), tup(_int(1 << 20)), _bytes(b"d"))
    + b"\x94"  # MEMOIZE: memo[0] is the array (8 MiB)
    + call(
        glob4(NUMERIC, "_frombuffer"),
        b"h\x00",
        call(glob4("numpy", "dtype"), _str("f8")),
        tup(_int(1 << 20)),
        _str("C"),
    )
    + b"h\x00"
    + tup(_int(1), tup(_int(1)), call(glob4("numpy", "dtype"), _str("f8")), b"\x89", _bytes(b"\0" * 8))
    + b"b"  # BUILD: NumPy frees the 8 MiB the view above still points into
    + b"\x86"  # TUPLE2 (view, array)
)

_CHILD = """
import io, sys
import numpy as np
from hpcdist.objects import _RestrictedUnpickler
payload = bytes.fromhex(sys.argv[2])
try:
    first, second = _RestrictedUnpickler(io.BytesIO(payload)).load()
except Exception as exc:  # a refusal is as good as a safe result
    print("refused", type(exc).__name__)
    raise SystemExit(0)
if sys.argv[1] == "dtype":
    assert not first.dtype.hasobject, first.dtype  # the array keeps the dtype it was made with
    print("safe", first.dtype, bytes(first.tobytes()).hex())
else:
    assert second.size == 1 and first.size == 1 << 20
    first[:] = 1.0  # writes into the view's memory: freed memory if the array was changed in place
    print("safe", float(first.sum()))
"""


@pytest.mark.parametrize("case", ["dtype", "array"])
def test_build_never_changes_an_object_already_in_use(case):
    payload = _LATE_DTYPE if case == "dtype" else _LATE_ARRAY
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_CHILD), case, payload.hex()],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0 and ("safe" in proc.stdout or "refused" in proc.stdout), (
        proc.returncode,
        proc.stdout[-500:],
        proc.stderr[-1500:],
    )


def test_numpy_objects_still_round_trip_through_the_checked_path(monkeypatch):
    """What NumPy's own pickles do (dtype and array BUILDs, memo references to them) still comes back equal."""
    monkeypatch.setenv("HPCDIST_OBJECT_UNPICKLER", "restricted")
    shared = np.dtype([("a", ">i4"), ("b", "O"), ("c", "f8", (2,))], align=True)
    objs = [
        [np.zeros(3, dtype=shared), np.ones(2, dtype=shared)],  # one dtype, referenced twice through the memo
        {"x": np.arange(12.0).reshape(3, 4).T, "y": np.array([np.ones(2), None, "s"], dtype=object)},
        np.zeros(4, "M8[ns]"),
        np.dtype("f8", metadata={"m": 1}),
        np.zeros(2, dtype=[("a", "i4")])[0],
    ]
    for obj in objs:
        back = loads(dumps(obj))
        assert repr(back) == repr(obj)
    a, b = loads(dumps([np.zeros(3, dtype=shared), np.ones(2, dtype=shared)]))
    assert a.dtype == shared and a.dtype.flags == shared.flags and a.dtype is b.dtype
