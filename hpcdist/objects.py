"""Object collectives: picklable Python objects instead of arrays.

Objects are pickled with protocol 5; large buffers inside them (NumPy
arrays, bytes-like data) travel out of band, without an extra pickle copy,
and are unpickled as views of the receive buffer. Objects of any size work
(above 2 GiB through MPI-4's large counts).

Security: unpickling runs code chosen by the sender. Use these calls only
between ranks you trust (the ranks of your own job). Set
``HPCDIST_OBJECT_UNPICKLER=restricted`` to allow only builtins, ``datetime``,
``collections``, ``decimal``/``fractions`` and NumPy arrays to be unpickled.

SPMD contract: as for the array collectives; every rank of the group calls,
in the same order.
"""

from __future__ import annotations

import io
import pickle
import sys
import time
from typing import Any

import numpy as np

from . import config
from .buffers.packing import displacements
from .errors import DistError, DistTimeoutError
from .flight import END, on_timeout
from .group import ProcessGroup, group_rank, resolve_group
from .work import timeout_error, wait_requests

__all__ = [
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "recv_object_list",
    "scatter_object_list",
    "send_object_list",
]

_HEAD = 8  # bytes of the int64 length header
_FIRST = 8192  # bytes broadcast in the first round; small objects need one round only
_CHUNK = 512  # bytes per rank gathered in the first round of the gathers


def _chunk(payload: np.ndarray, failure: BaseException | None = None) -> np.ndarray:
    """[int64 length][the payload's first bytes] padded to _CHUNK: the first round of a gather.

    A failure payload (:func:`_pickled`) goes as it is: its header already says ``_FAILED``.
    """
    out = np.zeros(_CHUNK, dtype=np.uint8)
    if failure is not None:
        out[: payload.size] = payload
        return out
    out[:_HEAD] = np.array([payload.size], dtype=np.int64).view(np.uint8)
    k = min(payload.size, _CHUNK - _HEAD)
    out[_HEAD : _HEAD + k] = payload[:k]
    return out


#: the length header of a rank that could not pickle its object: its error message follows, so every rank
#: finishes the exchange in step and raises (instead of waiting for an object that never comes)
_FAILED = -1


def _pickled(obj: Any) -> tuple[np.ndarray, BaseException | None]:
    """``(dumps(obj), None)``, or ``(failure payload, the error)`` when ``obj`` cannot be pickled.

    The failure payload is ``[_FAILED][the error's text]``, no longer than a
    gather's chunk, so it travels where the object's first bytes would.
    """
    try:
        return dumps(obj), None
    except Exception as exc:  # TypeError, PicklingError, AttributeError, RecursionError, a __reduce__ that raised
        return _failure_payload(f"{type(exc).__name__}: {exc}"), exc


def _failure_payload(text: str) -> np.ndarray:
    """``[_FAILED][text]``, the text cut to fit a gather's chunk."""
    raw = text.encode("utf-8", "replace")[: _CHUNK - _HEAD]
    out = np.empty(_HEAD + len(raw), dtype=np.uint8)
    out[:_HEAD] = np.array([_FAILED], dtype=np.int64).view(np.uint8)
    out[_HEAD:] = np.frombuffer(raw, dtype=np.uint8)
    return out


def _failure_text(body: np.ndarray) -> str:
    return bytes(body).rstrip(b"\0").decode("utf-8", "replace")


def _raise_failures(pg: ProcessGroup, op: str, failed: dict[int, str], mine: BaseException | None) -> None:
    """After an exchange in which the group ranks ``failed`` (rank -> error text) could not pickle: raise.

    The rank whose object failed raises its own error; the others a DistError naming the ranks and errors.
    """
    if mine is not None:
        raise mine
    if failed:
        said = "; ".join(f"rank {pg._ranks[r]}: {text}" for r, text in sorted(failed.items()))
        raise DistError(
            f"{op} on {pg!r}: {len(failed)} rank(s) could not pickle their object ({said}); nothing was "
            "delivered, and the group stays usable"
        )


# ------------------------------------------------------------------ (de)serialization


def dumps(obj: Any) -> np.ndarray:
    """Pickle ``obj`` into one uint8 array: [k, len(main), len(buf_i)...] main buf_1 .. buf_k."""
    bufs: list[pickle.PickleBuffer] = []
    main = pickle.dumps(obj, protocol=5, buffer_callback=bufs.append)
    raws = [b.raw() for b in bufs]
    header = np.array([len(raws), len(main), *[r.nbytes for r in raws]], dtype=np.int64)
    total = header.nbytes + len(main) + sum(r.nbytes for r in raws)
    out = np.empty(total, dtype=np.uint8)
    pos = header.nbytes
    out[:pos] = header.view(np.uint8)
    out[pos : pos + len(main)] = np.frombuffer(main, dtype=np.uint8)
    pos += len(main)
    for r in raws:
        out[pos : pos + r.nbytes] = np.frombuffer(r, dtype=np.uint8)
        pos += r.nbytes
    return out


#: The exact (module, name) pairs the restricted unpickler resolves: the classes and functions that pickles of
#: builtins, collections, datetime, decimal, fractions and NumPy arrays, scalars and dtypes name (NumPy 1.x and
#: 2.x spell the module differently). Nothing else: no prefix matching, no attribute paths.
_SAFE: frozenset[tuple[str, str]] = frozenset(
    [
        *(
            ("builtins", n)
            for n in (
                [
                    "list",
                    "dict",
                    "set",
                    "frozenset",
                    "tuple",
                    "bytearray",
                    "bytes",
                    "str",
                    "int",
                    "float",
                    "complex",
                    "bool",
                    "slice",
                    "range",
                ]
            )
        ),
        *(("collections", n) for n in ("OrderedDict", "defaultdict", "deque", "Counter")),
        *(("datetime", n) for n in ("datetime", "date", "time", "timedelta", "timezone")),
        ("decimal", "Decimal"),
        ("fractions", "Fraction"),
        ("numpy", "ndarray"),
        ("numpy", "dtype"),
        *((m, n) for m in ("numpy.core.multiarray", "numpy._core.multiarray") for n in ("_reconstruct", "scalar")),
        *((m, "_frombuffer") for m in ("numpy.core.numeric", "numpy._core.numeric")),
    ]
)


def _check_dtype(dt: np.dtype) -> None:
    """Refuse a NumPy dtype whose pickled state contradicts its layout.

    ``dtype.__setstate__`` takes the dtype's flags, sizes and fields from the
    pickle as given: a state whose flags say "holds no Python objects" for an
    object dtype (or one with object fields) makes arrays of it hold object
    pointers read from the sender's bytes (``_frombuffer``), which crash the
    reader or worse. The dtype is rebuilt through NumPy's public constructor,
    which computes flags, item size and alignment itself, and must agree.
    """
    try:
        if dt.names is not None:
            assert dt.fields is not None
            fields = [dt.fields[n] for n in dt.names]
            canon = np.dtype(
                {
                    "names": list(dt.names),
                    "formats": [f[0] for f in fields],
                    "offsets": [f[1] for f in fields],
                    "titles": [f[2] if len(f) > 2 else None for f in fields],
                    "itemsize": dt.itemsize,
                    "aligned": dt.isalignedstruct,
                }
            )
        elif dt.subdtype is not None:
            canon = np.dtype(dt.subdtype)
        else:
            canon = np.dtype(dt.str)
        same = (canon.flags, canon.itemsize, canon.alignment) == (dt.flags, dt.itemsize, dt.alignment) and canon == dt
    except Exception:
        same = False
    if not same:
        raise pickle.UnpicklingError(
            f"HPCDIST_OBJECT_UNPICKLER=restricted refuses a NumPy dtype whose pickled state does not match its "
            f"layout (flags {dt.flags}, itemsize {dt.itemsize}, alignment {dt.alignment} for {dt!r:.80}): NumPy "
            "never writes such a pickle"
        )


def _check_call(fn: Any) -> None:
    """Refuse calling ``numpy.ndarray`` (REDUCE, NEWOBJ, INST, OBJ): ``ndarray(shape, dtype, buffer)`` builds an
    array over the sender's bytes, object pointers included. NumPy's pickles only pass the class to
    ``_reconstruct``."""
    if isinstance(fn, type) and issubclass(fn, np.ndarray):
        raise pickle.UnpicklingError(
            "HPCDIST_OBJECT_UNPICKLER=restricted refuses to call numpy.ndarray (NumPy's pickles never do; it "
            "would build an array over bytes the sender chose)"
        )


def _resolve(module: str, name: str) -> Any:
    """``find_class`` of the restricted unpicklers: the exact pairs of :data:`_SAFE`, nothing else."""
    if "." not in name and not name.startswith("__") and (module, name) in _SAFE:
        sys.audit("pickle.find_class", module, name)
        __import__(module)
        return getattr(sys.modules[module], name)
    raise pickle.UnpicklingError(
        f"HPCDIST_OBJECT_UNPICKLER=restricted refuses to unpickle {module}.{name}; send plain data "
        "(builtins, collections, datetime, decimal, fractions, NumPy arrays) or set "
        "HPCDIST_OBJECT_UNPICKLER=full between trusted ranks"
    )


#: the pure-Python unpickler (its opcodes are methods; typeshed types it as the C one)
_PyUnpickler: Any = pickle._Unpickler  # type: ignore[attr-defined]


class _RestrictedUnpickler(_PyUnpickler):
    """Resolves only the exact pairs of :data:`_SAFE`, and checks what NumPy's classes are given.

    Protocol 4 lets a pickle name an attribute *path* (``"a.b.c"``), which
    the default ``find_class`` walks; a dotted or dunder name is refused
    before any lookup, so no path can reach ``__builtins__``, ``__globals__``
    or a module's other attributes. Allowed NumPy classes still trust their
    arguments, so this is the pure-Python unpickler, whose opcodes can be
    checked: ``BUILD`` of a ``numpy.dtype`` or ``numpy.ndarray`` sets a fresh
    object (a dtype checked by :func:`_check_dtype`), and a call of
    ``numpy.ndarray`` is refused (:func:`_check_call`). Only what NumPy's
    own pickles do is allowed; an object array that holds itself comes back
    holding an empty array instead.
    """

    def find_class(self, module: str, name: str) -> Any:
        return _resolve(module, name)

    def load_build(self) -> None:
        inst = self.stack[-2]
        if not isinstance(inst, (np.dtype, np.ndarray)):
            super().load_build()
            return
        # NumPy's __setstate__ changes a dtype or array in place: arrays made over that dtype earlier in the pickle
        # would see the new layout, views of that array its freed memory. The state goes into a fresh object, which
        # takes the old one's place on the stack and in the memo (where NumPy's own pickles refer to it later).
        state = self.stack.pop()
        fresh: Any
        if isinstance(inst, np.dtype):
            fresh = np.dtype(inst.str, False, True)  # copy=True: a new dtype object
            if fresh is inst:
                raise pickle.UnpicklingError("HPCDIST_OBJECT_UNPICKLER=restricted could not copy a NumPy dtype")
            fresh.__setstate__(state)
            _check_dtype(fresh)
        else:
            fresh = np.ndarray((0,), np.int8)  # what NumPy's pickles BUILD: _reconstruct(ndarray, (0,), b"b")
            fresh.__setstate__(state)
        self.stack[-1] = fresh
        memo = self.memo
        for key in reversed(memo):
            if memo[key] is inst:
                memo[key] = fresh
                break

    def load_reduce(self) -> None:
        _check_call(self.stack[-2])
        super().load_reduce()

    def load_newobj(self) -> None:
        _check_call(self.stack[-2])
        super().load_newobj()

    def load_newobj_ex(self) -> None:
        _check_call(self.stack[-3])
        super().load_newobj_ex()

    def _instantiate(self, klass: Any, args: Any) -> None:  # INST and OBJ
        _check_call(klass)
        super()._instantiate(klass, args)

    dispatch = {
        **_PyUnpickler.dispatch,
        pickle.BUILD[0]: load_build,
        pickle.REDUCE[0]: load_reduce,
        pickle.NEWOBJ[0]: load_newobj,
        pickle.NEWOBJ_EX[0]: load_newobj_ex,
    }


class _NamesNumpy(Exception):
    """Raised by :class:`_PlainUnpickler` at the first NumPy name: the pickle needs :class:`_RestrictedUnpickler`."""


class _PlainUnpickler(pickle.Unpickler):
    """The restricted unpickler at C speed, for pickles that name nothing from NumPy.

    Plain data (builtins, collections, datetime, decimal, fractions) needs no
    checks beyond :data:`_SAFE`; at the first NumPy name it gives up and
    :func:`loads` starts over with :class:`_RestrictedUnpickler` (unpickling
    the allowed classes has no side effects, so starting over is safe).
    """

    def find_class(self, module: str, name: str) -> Any:
        if module == "numpy" or module.startswith("numpy."):
            raise _NamesNumpy
        return _resolve(module, name)


def loads(arr: np.ndarray) -> Any:
    """Inverse of :func:`dumps`; out-of-band buffers are views of ``arr``."""
    k = int(arr[:_HEAD].view(np.int64)[0])
    header = arr[: _HEAD * (2 + k)].view(np.int64)
    main_len = int(header[1])
    pos = _HEAD * (2 + k)
    main = arr[pos : pos + main_len].data
    pos += main_len
    buffers = []
    for i in range(k):
        n = int(header[2 + i])
        buffers.append(arr[pos : pos + n].data)
        pos += n
    if config.object_unpickler() == "restricted":
        try:
            return _PlainUnpickler(io.BytesIO(main), buffers=buffers).load()
        except _NamesNumpy:
            return _RestrictedUnpickler(io.BytesIO(main), buffers=buffers).load()
    return pickle.loads(main, buffers=buffers)


def _wait(pg: ProcessGroup, reqs: list[Any], what: str) -> None:
    if not wait_requests(reqs, pg._timeout_s):
        raise timeout_error((what, pg), pg._timeout_s)


def _record(pg: ProcessGroup, op: str, peer: int, p2p: bool = False) -> list[Any] | None:
    """The flight-recorder entry of an object operation (None when recording is off)."""
    fr = pg._flight
    if fr is None:
        return None
    return fr.p2p(op, None, 0, peer) if p2p else fr.coll(op, None, 0, peer)


def _complete(entry: list[Any] | None) -> None:
    if entry is not None:
        entry[END] = time.time()


def _counts_displs(lengths: np.ndarray) -> tuple[list[int], list[int]]:
    counts = [int(x) for x in lengths]
    return counts, displacements(counts)


def _root(pg: ProcessGroup, glob: Any, grp: Any, name: str, default_zero: bool = False) -> int:
    if default_zero and glob is None and grp is None:
        glob = 0
    return group_rank(pg, glob, grp, name)


# ------------------------------------------------------------------ collectives


def broadcast_object_list(
    object_list: list[Any], src: int | None = None, group: Any = None, device: Any = None, group_src: int | None = None
) -> None:
    """Replace ``object_list``'s entries on every rank by those of rank ``src``.

    Every rank passes a list of the same length. Objects up to ~8 KiB take one
    MPI broadcast; larger ones two.

    Args:
        object_list: on ``src`` the objects to send; elsewhere a list of as many entries, replaced in place.
        src: the source, a global rank (default: global rank 0); or give ``group_src``.
        group: the process group (None: the default group); on a non-member nothing happens.
        device: accepted for torch compatibility and ignored (objects travel through host memory).
        group_src: the source as a rank of ``group``.
    """
    pg = resolve_group(group, "broadcast_object_list")
    if pg is None:
        return
    if not isinstance(object_list, list):
        raise TypeError(f"object_list must be a list, got {type(object_list).__name__}")
    root = _root(pg, src, group_src, "src", default_zero=True)
    entry = _record(pg, "broadcast_object_list", root)
    comm = pg._comm
    first = np.zeros(_FIRST, dtype=np.uint8)
    payload = None
    failure: BaseException | None = None
    if pg._rank == root:
        payload, failure = _pickled(list(object_list))
        n = payload.size if failure is None else _FAILED
        first[:_HEAD] = np.array([n], dtype=np.int64).view(np.uint8)
        body = payload if failure is None else payload[_HEAD:]
        k = min(body.size, _FIRST - _HEAD)
        first[_HEAD : _HEAD + k] = body[:k]
    _wait(pg, [comm.Ibcast(first, root)], "broadcast_object_list")
    n = int(first[:_HEAD].view(np.int64)[0])
    if n == _FAILED:
        _complete(entry)
        _raise_failures(pg, "broadcast_object_list", {root: _failure_text(first[_HEAD:])}, failure)
    if pg._rank != root:
        payload = np.empty(n, dtype=np.uint8)
        k = min(n, _FIRST - _HEAD)
        payload[:k] = first[_HEAD : _HEAD + k]
    assert payload is not None
    if n > _FIRST - _HEAD:
        rest = payload[_FIRST - _HEAD :]
        _wait(pg, [comm.Ibcast(rest, root)], "broadcast_object_list")
    if pg._rank != root:
        received = loads(payload)
        if len(received) != len(object_list):
            raise ValueError(
                f"object_list has {len(object_list)} entries here but {len(received)} on the source rank; "
                "every rank must pass a list of the same length"
            )
        object_list[:] = received
    _complete(entry)


def all_gather_object(object_list: list[Any], obj: Any, group: Any = None) -> None:
    """Fill ``object_list[r]`` (a list of group-size entries) with rank ``r``'s ``obj`` on every rank.

    Args:
        object_list: a list with one entry per group rank, replaced in place (a longer one has its first
            group-size entries replaced and the rest left as they were, as torch).
        obj: this rank's object (picklable).
        group: the process group (None: the default group); on a non-member nothing happens.
    """
    pg = resolve_group(group, "all_gather_object")
    if pg is None:
        return
    # a longer list gets its first group-size entries replaced, as torch's
    if not isinstance(object_list, list) or len(object_list) < pg._size:
        raise ValueError(
            f"object_list must be a list with (at least) one entry per rank of the group ({pg._size}), got "
            f"{len(object_list) if isinstance(object_list, list) else type(object_list).__name__}"
        )
    entry = _record(pg, "all_gather_object", -1)
    comm = pg._comm
    mine, failure = _pickled(obj)
    table = np.empty((pg._size, _CHUNK), dtype=np.uint8)
    _wait(pg, [comm.Iallgather(_chunk(mine, failure), table)], "all_gather_object")
    lengths = table[:, :_HEAD].copy().view(np.int64).reshape(-1)
    if lengths.min() < 0:  # every rank sees the same table: all skip the second round and raise
        _complete(entry)
        failed = {r: _failure_text(table[r, _HEAD:]) for r in range(pg._size) if lengths[r] < 0}
        _raise_failures(pg, "all_gather_object", failed, failure)
    if lengths.max() <= _CHUNK - _HEAD:  # every object fitted its chunk: one exchange
        for r in range(pg._size):
            object_list[r] = loads(table[r, _HEAD : _HEAD + int(lengths[r])])
        _complete(entry)
        return
    counts, displs = _counts_displs(lengths)
    flat = np.empty(int(lengths.sum()), dtype=np.uint8)
    _wait(pg, [comm.Iallgatherv(mine, [flat, (counts, displs)])], "all_gather_object")
    for r in range(pg._size):
        object_list[r] = loads(flat[displs[r] : displs[r] + counts[r]])
    _complete(entry)


def gather_object(
    obj: Any,
    object_gather_list: list[Any] | None = None,
    dst: int | None = None,
    group: Any = None,
    group_dst: int | None = None,
) -> None:
    """Gather every rank's ``obj`` into ``object_gather_list`` (group-size entries) on rank ``dst``.

    Args:
        obj: this rank's object (picklable).
        object_gather_list: on ``dst``, a list with one entry per group rank, replaced in place (a longer one has
            its first group-size entries replaced, as torch); None (or ``[]``) elsewhere.
        dst: the destination, a global rank (default: global rank 0); or give ``group_dst``.
        group: the process group (None: the default group); on a non-member nothing happens.
        group_dst: the destination as a rank of ``group``.
    """
    pg = resolve_group(group, "gather_object")
    if pg is None:
        return
    root = _root(pg, dst, group_dst, "dst", default_zero=True)
    is_root = pg._rank == root
    if is_root:
        if not isinstance(object_gather_list, list) or len(object_gather_list) < pg._size:  # longer: as torch's
            raise ValueError(
                f"object_gather_list must be a list with (at least) one entry per rank of the group ({pg._size}) on the "
                f"destination rank, got {object_gather_list!r:.80}"
            )
    elif object_gather_list is not None and not (isinstance(object_gather_list, list) and not object_gather_list):
        # torch accepts an empty list here as well as None (it tests the list's truth); only entries are refused
        raise ValueError(
            "object_gather_list must be None (or an empty list) on ranks other than the destination, got "
            f"{object_gather_list!r:.80}"
        )
    entry = _record(pg, "gather_object", root)
    comm = pg._comm
    mine, failure = _pickled(obj)
    fits = mine.size <= _CHUNK - _HEAD or failure is not None
    tag = _internal_tag("object_gather")
    table = np.empty((pg._size, _CHUNK), dtype=np.uint8) if is_root else None
    reqs = [comm.Igather(_chunk(mine, failure), table, root)]
    if not (fits or is_root):  # the rest goes point to point; small objects need the one exchange only
        reqs.append(comm.Isend(mine, root, tag))
    _wait(pg, reqs, "gather_object")
    if not is_root:
        _complete(entry)
        if failure is not None:
            raise failure
        return
    assert table is not None and object_gather_list is not None
    lengths = table[:, :_HEAD].copy().view(np.int64).reshape(-1)
    rest: dict[int, np.ndarray] = {}
    for r in range(pg._size):
        if lengths[r] > _CHUNK - _HEAD and r != root:
            rest[r] = np.empty(int(lengths[r]), dtype=np.uint8)
    _wait(pg, [comm.Irecv(buf, r, tag) for r, buf in rest.items()], "gather_object")  # also when some failed
    if lengths.min() < 0:
        _complete(entry)
        failed = {r: _failure_text(table[r, _HEAD:]) for r in range(pg._size) if lengths[r] < 0}
        _raise_failures(pg, "gather_object", failed, failure)
    for r in range(pg._size):
        if r in rest:
            object_gather_list[r] = loads(rest[r])
        elif r == root:
            object_gather_list[r] = loads(mine)
        else:
            object_gather_list[r] = loads(table[r, _HEAD : _HEAD + int(lengths[r])])
    _complete(entry)


def scatter_object_list(
    scatter_object_output_list: list[Any],
    scatter_object_input_list: list[Any] | None = None,
    src: int | None = None,
    group: Any = None,
    group_src: int | None = None,
) -> None:
    """Rank ``src`` sends ``scatter_object_input_list[r]`` to rank ``r``, stored in ``scatter_object_output_list[0]``.

    Args:
        scatter_object_output_list: a list of at least one entry; entry 0 receives this rank's object.
        scatter_object_input_list: on ``src``, one object per group rank; ignored elsewhere.
        src: the source, a global rank (default: global rank 0); or give ``group_src``.
        group: the process group (None: the default group); on a non-member nothing happens.
        group_src: the source as a rank of ``group``.
    """
    pg = resolve_group(group, "scatter_object_list")
    if pg is None:
        return
    if not isinstance(scatter_object_output_list, list) or len(scatter_object_output_list) < 1:
        raise ValueError("scatter_object_output_list must be a list with at least one entry (it receives the object)")
    root = _root(pg, src, group_src, "src", default_zero=True)
    is_root = pg._rank == root
    if is_root and (not isinstance(scatter_object_input_list, list) or len(scatter_object_input_list) != pg._size):
        raise ValueError(
            f"scatter_object_input_list must be a list with one object per rank of the group ({pg._size}) on the "
            "source rank"
        )
    entry = _record(pg, "scatter_object_list", root)
    comm = pg._comm
    tag = _internal_tag("object_scatter")
    mine = np.empty(_CHUNK, dtype=np.uint8)
    if is_root:
        assert scatter_object_input_list is not None
        parts = []
        for i, o in enumerate(scatter_object_input_list):
            part, failure = _pickled(o)
            if failure is not None:  # every rank gets the failure instead of its object
                bad = _chunk(
                    _failure_payload(f"scatter_object_input_list[{i}]: {_failure_text(part[_HEAD:])}"), failure
                )
                _wait(pg, [comm.Iscatter(np.stack([bad] * pg._size), mine, root)], "scatter_object_list")
                _complete(entry)
                raise failure
            parts.append(part)
        reqs = [comm.Iscatter(np.stack([_chunk(p) for p in parts]), mine, root)]
        # what does not fit its chunk goes point to point; small objects need the one exchange only
        reqs += [comm.Isend(p, r, tag) for r, p in enumerate(parts) if r != root and p.size > _CHUNK - _HEAD]
        _wait(pg, reqs, "scatter_object_list")
        out = parts[root]
    else:
        _wait(pg, [comm.Iscatter(None, mine, root)], "scatter_object_list")
        length = int(mine[:_HEAD].copy().view(np.int64)[0])
        if length == _FAILED:
            _complete(entry)
            _raise_failures(pg, "scatter_object_list", {root: _failure_text(mine[_HEAD:])}, None)
        if length <= _CHUNK - _HEAD:
            out = mine[_HEAD : _HEAD + length]
        else:
            out = np.empty(length, dtype=np.uint8)
            _wait(pg, [comm.Irecv(out, root, tag)], "scatter_object_list")
    scatter_object_output_list[0] = loads(out)
    _complete(entry)


# ------------------------------------------------------------------ point to point


def _internal_tag(name: str) -> int:
    from .p2p import internal_tag

    return internal_tag(name)


def send_object_list(
    object_list: list[Any],
    dst: int | None = None,
    group: Any = None,
    device: Any = None,
    group_dst: int | None = None,
    use_batch: bool = False,
) -> None:
    """Send the objects of ``object_list`` to rank ``dst`` (one MPI message).

    The receiver passes a list of as many entries to :func:`recv_object_list`.

    Args:
        object_list: the objects to send (picklable).
        dst: the destination, a global rank; or give ``group_dst``.
        group: the process group (None: the default group); on a non-member nothing happens.
        device: accepted for torch compatibility and ignored (objects travel through host memory).
        group_dst: the destination as a rank of ``group``.
        use_batch: accepted for torch compatibility and ignored (the objects go as one message anyway).
    """
    pg = resolve_group(group, "send_object_list")
    if pg is None:
        return
    if not isinstance(object_list, list):
        raise TypeError(f"object_list must be a list, got {type(object_list).__name__}")
    from .p2p import _peer

    peer = _peer(pg, dst, group_dst, "dst", False)
    payload, failure = _pickled(list(object_list))  # a failure still goes: the receiver raises instead of waiting
    entry = _record(pg, "send_object_list", peer, True)
    _wait(pg, [pg._comm.Isend(payload, peer, _internal_tag("objects"))], "send_object_list")
    _complete(entry)
    if failure is not None:
        raise failure


def recv_object_list(
    object_list: list[Any],
    src: int | None = None,
    group: Any = None,
    device: Any = None,
    group_src: int | None = None,
    use_batch: bool = False,
) -> int:
    """Receive objects from ``src`` (None: any rank) into ``object_list``; return the sender's global rank.

    ``object_list`` must have as many entries as the sender's list.

    Args:
        object_list: the list whose entries are replaced by the objects received.
        src: the source, a global rank, or None for any rank of the group; or give ``group_src``.
        group: the process group (None: the default group); on a non-member nothing happens.
        device: accepted for torch compatibility and ignored (objects travel through host memory).
        group_src: the source as a rank of ``group``.
        use_batch: accepted for torch compatibility and ignored (the objects go as one message anyway).

    Returns:
        The sender's global rank; -1 on a non-member.
    """
    pg = resolve_group(group, "recv_object_list")
    if pg is None:
        return -1
    if not isinstance(object_list, list):
        raise TypeError(f"object_list must be a list, got {type(object_list).__name__}")
    from mpi4py import MPI

    from .p2p import _peer

    peer = _peer(pg, src, group_src, "src", True)
    tag = _internal_tag("objects")
    status = MPI.Status()
    entry = _record(pg, "recv_object_list", peer, True)
    deadline = time.monotonic() + pg._timeout_s
    msg = pg._comm.Improbe(peer, tag, status)
    while msg is None:
        if time.monotonic() > deadline:
            err = DistTimeoutError(
                f"recv_object_list on {pg!r}: no message from {'any rank' if src is None else src} within "
                f"{pg._timeout_s:g}s"
            )
            on_timeout(str(err))  # the flight recorder's dump, as timeout_error does
            raise err
        time.sleep(0.0001)
        msg = pg._comm.Improbe(peer, tag, status)
    buf = np.empty(status.Get_count(MPI.BYTE), dtype=np.uint8)
    _wait(pg, [msg.Irecv(buf)], "recv_object_list")
    if buf.size >= _HEAD and int(buf[:_HEAD].view(np.int64)[0]) == _FAILED:  # dumps' header starts with k >= 0
        _complete(entry)
        _raise_failures(pg, "recv_object_list", {status.Get_source(): _failure_text(buf[_HEAD:])}, None)
    received = loads(buf)
    sender = pg._ranks[status.Get_source()]
    if len(received) != len(object_list):
        raise ValueError(f"object_list has {len(object_list)} entries but rank {sender} sent {len(received)} objects")
    object_list[:] = received
    _complete(entry)
    return sender
