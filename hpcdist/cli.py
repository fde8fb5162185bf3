"""The ``hpcdist`` command: ``hpcdist run | info | bench | debug`` (also ``python -m hpcdist``).

Subcommands live in a registry (name -> module path and one-line help); each
module has ``main(argv) -> int``. Modules are imported only when their
subcommand runs, so ``hpcdist info`` works even where ``run``'s needs do not.
"""

from __future__ import annotations

import importlib
import sys

__all__ = ["SUBCOMMANDS", "main"]

#: name -> (module with ``main(argv) -> int``, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "run": ("hpcdist.launch.run", "launch N ranks of a script or module (mpiexec, or srun inside Slurm)"),
    "info": ("hpcdist.info", "versions, MPI library, launcher, GPU support, environment (--json)"),
    "bench": ("hpcdist.bench", "time collectives x sizes x ranks beside raw mpi4py and gloo (under mpiexec)"),
    "debug": (
        "hpcdist.debug_analyze",
        "analyze DIR: where a stuck job's ranks diverge (flight recorder dumps); export-torch DIR OUT: the dumps in "
        "torch's flight recorder format",
    ),
}


def _usage() -> str:
    lines = ["usage: hpcdist COMMAND [ARGS...]", "", "commands:"]
    lines += [f"  {name:<6} {help_}" for name, (_, help_) in SUBCOMMANDS.items()]
    lines += ["", "hpcdist COMMAND --help shows a command's options."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Run ``hpcdist`` with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    args = sys.argv[1:] if argv is None else list(argv)
    if not args or args[0] in ("-h", "--help", "help"):
        print(_usage(), file=sys.stdout if args else sys.stderr)  # no command is a usage error: stderr, 2
        return 0 if args else 2
    if args[0] in ("-V", "--version"):
        from hpcdist._version import __version__

        print(f"hpcdist {__version__}")
        return 0
    entry = SUBCOMMANDS.get(args[0])
    if entry is None:
        print(f"hpcdist: unknown command {args[0]!r}; expected one of {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return 2
    module = importlib.import_module(entry[0])
    return int(module.main(args[1:]))


if __name__ == "__main__":
    sys.exit(main())
