"""The restricted unpickler against a corpus of known bypass shapes (issue #10 defect 5).

Each payload is a hand-built pickle that, unpickled by the standard
unpickler, would run code (or read files): it must be refused with
``UnpicklingError`` before anything runs. Plain data must still round-trip.
"""

from __future__ import annotations

import collections
import datetime
import decimal
import fractions
import io
import os
import pickle

import numpy as np
import pytest

from hpcdist.objects import _RestrictedUnpickler, dumps, loads

CANARY = "HPCDIST_UNPICKLER_CANARY"
CODE = f"__import__('os').environ.__setitem__('{CANARY}', 'ran')"


def _str(s: str) -> bytes:
    raw = s.encode()
    return b"\x8c" + bytes([len(raw)]) + raw  # SHORT_BINUNICODE


def _bytes(b: bytes) -> bytes:
    return b"C" + bytes([len(b)]) + b  # SHORT_BINBYTES


def glob4(module: str, name: str) -> bytes:
    """Protocol 4 STACK_GLOBAL: the module and a (possibly dotted) name from the stack."""
    return _str(module) + _str(name) + b"\x93"


def glob0(module: str, name: str) -> bytes:
    """Protocol 0 GLOBAL opcode."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def call(fn: bytes, *args: bytes) -> bytes:
    """REDUCE: fn(*args)."""
    return fn + b"(" + b"".join(args) + b"tR"


def pickle4(body: bytes) -> bytes:
    return b"\x80\x04" + body + b"."


CORPUS = {
    # dotted names resolved by protocol 4 through an allowed (or formerly prefix-allowed) module
    "numpy.dtypes __builtins__.get -> eval": pickle4(
        call(call(glob4("numpy.dtypes", "__builtins__.get"), _str("eval")), _str(CODE))
    ),
    "numpy dtypes.__builtins__": pickle4(call(glob4("numpy", "dtypes.__builtins__.get"), _str("eval"))),
    "numpy.dtypes any name": pickle4(call(glob4("numpy.dtypes", "__builtins__"), _str("x"))),
    "allowed pair's __globals__": pickle4(glob4("numpy._core.multiarray", "_reconstruct.__globals__")),
    "class attribute path": pickle4(call(glob4("builtins", "dict.fromkeys"), _str("ab"))),
    "object.__subclasses__": pickle4(call(glob4("builtins", "object.__subclasses__"))),
    "numpy DType suffix": pickle4(glob4("numpy", "__builtins__.getDType")),
    "dunder name": pickle4(glob4("builtins", "__import__")),
    "__builtins__ module attr": pickle4(glob4("collections", "__builtins__")),
    # plain globals that run code, read files or recurse
    "builtins.eval": pickle4(call(glob4("builtins", "eval"), _str(CODE))),
    "builtins.exec": pickle4(call(glob4("builtins", "exec"), _str(CODE))),
    "builtins.open": pickle4(call(glob4("builtins", "open"), _str("/etc/passwd"))),
    "builtins.__import__ (protocol 0)": glob0("builtins", "__import__") + b"(Vos\ntR.",
    "builtins.getattr": pickle4(call(glob4("builtins", "getattr"), _str("x"), _str("y"))),
    "builtins.globals": pickle4(call(glob4("builtins", "globals"))),
    "builtins.type": pickle4(call(glob4("builtins", "type"), _str("x"))),
    "builtins.object": pickle4(call(glob4("builtins", "object"))),
    "os.system": pickle4(call(glob4("os", "system"), _str("true"))),
    "posix.system": pickle4(call(glob4("posix", "system"), _str("true"))),
    "os.system (protocol 0)": glob0("os", "system") + b"(Vtrue\ntR.",
    "subprocess.Popen": pickle4(call(glob4("subprocess", "Popen"), _str("true"))),
    "subprocess.check_output": pickle4(call(glob4("subprocess", "check_output"), _str("true"))),
    "operator.attrgetter": pickle4(call(glob4("operator", "attrgetter"), _str("__globals__"))),
    "operator.methodcaller": pickle4(call(glob4("operator", "methodcaller"), _str("system"))),
    "functools.partial": pickle4(call(glob4("functools", "partial"), glob4("builtins", "eval"))),
    "pickle.loads recursion": pickle4(
        call(glob4("pickle", "loads"), _bytes(pickle4(call(glob4("builtins", "eval"), _str(CODE)))))
    ),
    "_pickle.loads": pickle4(call(glob4("_pickle", "loads"), _str("x"))),
    "codecs.encode": pickle4(call(glob4("codecs", "encode"), _str("x"), _str("latin1"))),
    "_codecs.encode": pickle4(call(glob4("_codecs", "encode"), _str("x"), _str("latin1"))),
    "copyreg._reconstructor": pickle4(call(glob4("copyreg", "_reconstructor"))),
    "numpy.load": pickle4(call(glob4("numpy", "load"), _str("/etc/passwd"))),
    "numpy.fromfile": pickle4(call(glob4("numpy", "fromfile"), _str("/etc/passwd"))),
    "numpy.loadtxt": pickle4(call(glob4("numpy", "loadtxt"), _str("/etc/passwd"))),
    "numpy.core.multiarray other name": pickle4(glob4("numpy.core.multiarray", "c_einsum")),
    "sys.modules": pickle4(glob4("sys", "modules")),
    "importlib.import_module": pickle4(call(glob4("importlib", "import_module"), _str("os"))),
    # an allowed type whose arguments carry a forbidden callable
    "defaultdict(eval)": pickle4(call(glob4("collections", "defaultdict"), glob4("builtins", "eval"))),
    "dtype(eval)": pickle4(call(glob4("numpy", "dtype"), glob4("builtins", "eval"))),
}


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_bypass_shape_is_refused_before_anything_runs(name, monkeypatch):
    monkeypatch.delenv(CANARY, raising=False)
    payload = CORPUS[name]
    with pytest.raises(pickle.UnpicklingError, match="restricted refuses"):
        _RestrictedUnpickler(io.BytesIO(payload)).load()
    assert CANARY not in os.environ


def test_the_corpus_is_live_under_the_standard_unpickler(monkeypatch):
    """The eval payloads really run code when unpickled without restriction (the corpus is not inert)."""
    for name in ("numpy.dtypes __builtins__.get -> eval", "builtins.eval"):
        monkeypatch.delenv(CANARY, raising=False)
        pickle.loads(CORPUS[name])
        assert os.environ.get(CANARY) == "ran", name


def test_plain_data_round_trips_through_the_restricted_unpickler(monkeypatch):
    monkeypatch.setenv("HPCDIST_OBJECT_UNPICKLER", "restricted")
    utc = datetime.timezone.utc
    objs = [
        np.arange(6.0).reshape(2, 3),
        np.arange(6).reshape(2, 3)[:, ::2],
        np.array([1, "a", None], dtype=object),
        np.array(["ab", "c"]),
        np.zeros(2, dtype=[("a", "i4"), ("b", "f8")]),
        np.float64(1.5),
        np.int32(-3),
        np.bool_(True),
        np.datetime64("2020-01-01"),
        np.dtype("complex64"),
        datetime.datetime(2026, 1, 2, 3, 4, 5, tzinfo=utc),
        datetime.date(2026, 1, 2),
        datetime.timedelta(seconds=3),
        collections.OrderedDict(a=1),
        collections.defaultdict(list, {"k": [1]}),
        collections.deque([1, 2]),
        collections.Counter("abca"),
        decimal.Decimal("1.25"),
        fractions.Fraction(1, 3),
        {1, 2},
        frozenset([3]),
        bytearray(b"xy"),
        b"bytes",
        slice(1, 5, 2),
        range(3),
        complex(1, 2),
        {"nested": [(1, 2.0, "s", None, True)]},
    ]
    for obj in objs:
        back = loads(dumps(obj))
        if isinstance(obj, np.ndarray):
            assert back.dtype == obj.dtype and np.array_equal(back, obj), obj
        else:
            assert back == obj and type(back) is type(obj), obj
