"""torch's ``torch.backends`` entry point: registers the torch backend "hpcdist" at ``import torch``.

Kept outside :mod:`hpcdist.torch` (importing that package registers), so that
``HPCDIST_TORCH_AUTOLOAD=0`` can decline before anything is imported. No MPI
call; a failure is reported, never raised into torch's import.
"""

from __future__ import annotations

import os
import sys

__all__ = ["entry_point"]


def entry_point() -> None:
    """Register "hpcdist" with torch.distributed unless ``HPCDIST_TORCH_AUTOLOAD=0``."""
    if os.environ.get("HPCDIST_TORCH_AUTOLOAD", "1") == "0":
        return
    try:
        import hpcdist.torch  # noqa: F401  registers on import
    except Exception as exc:  # pragma: no cover - a broken install must not break `import torch`
        print(f"hpcdist: could not register the torch backend 'hpcdist': {exc}", file=sys.stderr)
