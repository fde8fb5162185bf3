"""Putting a new checkpoint directory in place of an old one, and recovering from a crash while doing it.

An overwrite swaps two directories. On Linux ``renameat2(RENAME_EXCHANGE)``
does that atomically: the final name always holds a complete checkpoint, the
old or the new. Where the file system or kernel lacks it (``EINVAL``,
``ENOSYS``, ``EOPNOTSUPP``; not Linux), the swap is two renames: the old
checkpoint to ``.NAME.old-TOKEN``, the new one to ``NAME``. A crash between
them leaves ``NAME`` missing and its previous checkpoint under the hidden
name; :func:`recover` (run by the next save or load of ``NAME``, on group rank
0) renames it back, and :func:`~hpcdist.checkpoint.latest` finds it meanwhile.
"""

from __future__ import annotations

import ctypes
import errno
import os
import shutil
from pathlib import Path
from typing import Any

from .layout import META_NAME, fsync_path

__all__ = ["exchange", "recover", "remove_leftovers", "siblings"]

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
#: errors that mean "no atomic exchange here": fall back to two renames
_UNSUPPORTED = {errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP, errno.ENOTSUP}
_FN: list[Any] = []


def _renameat2() -> Any:
    if not _FN:
        try:
            fn = ctypes.CDLL(None, use_errno=True).renameat2
            fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
            fn.restype = ctypes.c_int
        except (OSError, AttributeError, TypeError):  # no libc symbol (not Linux, old glibc)
            fn = None
        _FN.append(fn)
    return _FN[0]


def exchange(a: Path, b: Path) -> bool:
    """Swap the directories ``a`` and ``b`` atomically; False (nothing done) where that is not supported."""
    fn = _renameat2()
    if fn is None:
        return False
    if fn(_AT_FDCWD, os.fsencode(a), _AT_FDCWD, os.fsencode(b), _RENAME_EXCHANGE) == 0:
        return True
    err = ctypes.get_errno()
    if err in _UNSUPPORTED:
        return False
    raise OSError(err, os.strerror(err), str(a), None, str(b))


def siblings(final: Path, kind: str) -> list[Path]:
    """The hidden ``.NAME.<kind>-TOKEN`` directories next to ``final`` (kind: ``tmp`` or ``old``)."""
    prefix = f".{final.name}.{kind}-"
    if not final.parent.is_dir():
        return []
    return [p for p in final.parent.iterdir() if p.name.startswith(prefix)]


def recover(final: Path) -> bool:
    """If ``final`` is missing and an overwrite left its previous checkpoint as ``.NAME.old-*``, rename it back.

    True when it did. Group rank 0 only (a save or a load of ``final``).
    """
    if final.exists() or final.is_symlink():
        return False
    olds = [p for p in siblings(final, "old") if (p / META_NAME).is_file()]
    if not olds:
        return False
    os.rename(max(olds, key=lambda p: p.stat().st_mtime), final)
    fsync_path(final.parent, directory=True)
    return True


def remove_leftovers(final: Path) -> None:
    """Remove what killed saves of ``final`` left: temporaries, and old copies once ``final`` is in place.

    Call :func:`recover` first: an old copy is removed only while ``final`` exists.
    """
    stale = siblings(final, "tmp") + (siblings(final, "old") if final.exists() else [])
    for p in stale:
        shutil.rmtree(p, ignore_errors=True)
