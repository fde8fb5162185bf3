"""``python -m hpcdist.torch script.py args...``: run a torch script with backend "hpcdist" registered.

The script runs as ``__main__`` (as ``python script.py`` would run it), so
``init_process_group("hpcdist")`` in it works with no import of hpcdist;
``-m module`` runs a module instead. Typical use::

    mpiexec -n 4 python -m hpcdist.torch train.py --epochs 3
"""

from __future__ import annotations

import runpy
import sys

_USAGE = "usage: python -m hpcdist.torch (script.py | -m module) [args...]"


def main(argv: list[str] | None = None) -> int:
    """Register the backend, then run the script or module given in ``argv`` as ``__main__``."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help"):
        print(_USAGE, file=sys.stderr if not args else sys.stdout)
        return 0 if args else 2
    import hpcdist.torch  # noqa: F401  registers the backend

    if args[0] == "-m":
        if len(args) < 2:
            print(_USAGE, file=sys.stderr)
            return 2
        sys.argv = args[1:]
        runpy.run_module(args[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(args)
        sys.path.insert(0, __import__("os").path.dirname(__import__("os").path.abspath(args[0])))
        runpy.run_path(args[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
