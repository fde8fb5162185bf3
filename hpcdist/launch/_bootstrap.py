"""Per-rank bootstrap: ``python -m hpcdist.launch._bootstrap [OPTIONS] -- PROGRAM``.

``hpcdist run`` starts this module on every rank instead of the user's
program, because Hydra's ``mpiexec`` cannot give each rank its own
environment. It:

1. reads rank, size and locality from the launcher's variables (``PMI_RANK``,
   ``SLURM_PROCID``, ``OMPI_COMM_WORLD_RANK``, ...) and sets torchrun's
   ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE`` (and
   ``MASTER_ADDR``/``MASTER_PORT`` when the launcher did not pass them);
2. optionally prefixes every line this rank prints with ``[rank N] ``;
3. runs ``script.py args...`` or ``-m module args...`` (with :mod:`runpy`), as
   ``python script.py`` would (``sys.argv``, ``sys.path[0]``, ``__main__``, an absolute ``__file__``);
4. on an unhandled exception prints the traceback once, each line prefixed
   ``[rank N] `` (through hpcdist's own hook when ``init_process_group``
   installed it), records the failure for ``hpcdist run``'s summary, and ends
   the job (``MPI_Abort`` when MPI is initialised, else exit status 1, which
   the launcher turns into the end of the job).

With ``--status-dir`` (under ``hpcdist run``) the process forks first and stays the
rank's parent, its *warden* (:func:`_warden`): it records a rank that Python could
not report (killed by a signal of its own, or gone through ``os._exit``) and ends
as the rank ended. ``HPCDIST_RUN_WARDEN=0`` turns it off.

PROGRAM is ``script.py [args...]`` or ``-m module [args...]``. OPTIONS:
``--prefix-output``, ``--status-dir DIR`` (where a failing rank writes
``rank-N.json``), ``--map-gpu`` (set ``CUDA_VISIBLE_DEVICES`` to the
``LOCAL_RANK``-th of the node's visible GPUs, so each rank sees one device).
"""

from __future__ import annotations

import builtins
import contextlib
import io
import json
import os
import runpy
import signal
import socket
import sys
import time
import traceback
import types
import zipfile
from collections.abc import Iterable, MutableMapping
from pathlib import Path
from types import TracebackType
from typing import Any, BinaryIO, TextIO

from hpcdist.launch.ranks import RankInfo, rank_info

_OWN_MODULES = {"runpy", "hpcdist.launch._bootstrap"}


class PrefixWriter:
    """A text stream that starts every line with ``prefix`` (unless it already does).

    Whole lines go to the wrapped stream in one write, so lines of different
    ranks do not interleave mid-line; a partial line goes out on ``flush()``
    (a progress bar's ``\r`` updates do). Bytes written to ``buffer`` (or to the
    file descriptor) go out as they are, after the text before them, unprefixed.
    """

    def __init__(self, stream: TextIO, prefix: str) -> None:
        self._stream = stream
        self._prefix = prefix
        self._pending = ""
        self._at_line_start = True

    def write(self, text: str) -> int:
        self._pending += text
        if "\n" in self._pending:
            head, _, self._pending = self._pending.rpartition("\n")
            self._emit(head + "\n")
            self._stream.flush()
        return len(text)

    def _emit(self, text: str) -> None:
        out = []
        for piece in text.splitlines(keepends=True):
            if self._at_line_start and not piece.startswith(self._prefix):
                out.append(self._prefix)
            out.append(piece)
            self._at_line_start = piece.endswith("\n")
        self._stream.write("".join(out))

    def flush(self) -> None:
        if self._pending:
            self._emit(self._pending)
            self._pending = ""
        self._stream.flush()

    def writelines(self, lines: Iterable[str]) -> None:
        for line in lines:
            self.write(line)

    @property
    def buffer(self) -> BinaryIO:
        """The wrapped stream's binary buffer, after this writer's pending text: bytes are not prefixed."""
        self.flush()
        return self._stream.buffer

    def reconfigure(self, **kwargs: Any) -> None:
        self.flush()
        self._stream.reconfigure(**kwargs)  # type: ignore[attr-defined]

    @property
    def closed(self) -> bool:
        return self._stream.closed

    def fileno(self) -> int:
        return self._stream.fileno()

    def isatty(self) -> bool:
        return self._stream.isatty()

    def writable(self) -> bool:
        return True

    @property
    def encoding(self) -> str:
        return self._stream.encoding

    @property
    def errors(self) -> str | None:
        return self._stream.errors


def _parse(argv: list[str]) -> tuple[dict[str, str | bool], list[str]]:
    opts: dict[str, str | bool] = {"prefix_output": False, "status_dir": "", "map_gpu": False}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg == "--":
            return opts, argv[i + 1 :]
        if arg == "--prefix-output":
            opts["prefix_output"] = True
        elif arg == "--map-gpu":
            opts["map_gpu"] = True
        elif arg == "--status-dir" and i + 1 < len(argv):
            opts["status_dir"] = argv[i + 1]
            i += 1
        else:
            return opts, argv[i:]
        i += 1
    return opts, []


def _first_slurm_host(env: MutableMapping[str, str]) -> str | None:
    nodelist = env.get("SLURM_STEP_NODELIST") or env.get("SLURM_JOB_NODELIST")
    if not nodelist:
        return None
    from hpcdist.launch.hostlist import expand_hostlist

    hosts = expand_hostlist(nodelist)
    return hosts[0] if hosts else None


def _node_place(info: RankInfo, env: MutableMapping[str, str]) -> tuple[int, int] | None:
    """``(GROUP_RANK, GROUP_WORLD_SIZE)``: this node's index and the number of nodes, as torchrun's agents count.

    Exact on one node and under srun (``SLURM_NODEID``); across nodes under mpiexec, the ranks are taken to
    fill the nodes in blocks of ``LOCAL_WORLD_SIZE`` (Hydra's default, torchrun's only layout); None where
    this rank sees that they do not.
    """
    nodes = env.get("SLURM_STEP_NUM_NODES") or env.get("SLURM_JOB_NUM_NODES") or env.get("SLURM_NNODES") or ""
    node_id = env.get("SLURM_NODEID", "")
    if info.launcher == "srun" and node_id.isdigit() and nodes.isdigit():
        return int(node_id), int(nodes)
    if info.local_size == info.size:
        return 0, 1
    if info.size % info.local_size == 0 and info.rank % info.local_size == info.local_rank:
        return info.rank // info.local_size, info.size // info.local_size
    return None


def set_torchrun_env(info: RankInfo, env: MutableMapping[str, str] | None = None) -> None:
    """Set torchrun's per-worker variables: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
    ``GROUP_RANK``/``GROUP_WORLD_SIZE`` (the node), ``ROLE_*`` (one role, ``default``),
    ``TORCHELASTIC_RESTART_COUNT``/``TORCHELASTIC_MAX_RESTARTS`` (0: no restarts); default ``MASTER_*``.

    Not set: the variables of torchrun's elastic agent (``TORCHELASTIC_RUN_ID``,
    ``TORCHELASTIC_USE_AGENT_STORE``, ``TORCHELASTIC_ERROR_FILE``): there is no agent, rank 0 hosts the
    env:// store, and ``torch.distributed.is_torchelastic_launched()`` stays False.
    """
    env = os.environ if env is None else env
    env["RANK"] = str(info.rank)
    env["WORLD_SIZE"] = str(info.size)
    env["LOCAL_RANK"] = str(info.local_rank)
    env["LOCAL_WORLD_SIZE"] = str(info.local_size)
    place = _node_place(info, env)
    if place is None:
        env.pop("GROUP_RANK", None)
        env.pop("GROUP_WORLD_SIZE", None)
    else:
        env["GROUP_RANK"], env["GROUP_WORLD_SIZE"] = str(place[0]), str(place[1])
    env["ROLE_RANK"], env["ROLE_WORLD_SIZE"], env["ROLE_NAME"] = str(info.rank), str(info.size), "default"
    env["TORCHELASTIC_RESTART_COUNT"] = env["TORCHELASTIC_MAX_RESTARTS"] = "0"
    if not env.get("MASTER_ADDR"):
        env["MASTER_ADDR"] = _first_slurm_host(env) or "127.0.0.1"
    if not env.get("MASTER_PORT"):
        job = env.get("SLURM_JOB_ID", "")
        env["MASTER_PORT"] = str(20000 + int(job) % 20000) if job.isdigit() else "29500"


def map_gpu(info: RankInfo, env: MutableMapping[str, str] | None = None) -> str:
    """Give this rank one GPU: the ``local_rank``-th of ``CUDA_VISIBLE_DEVICES`` (or of
    ``0..local_size-1`` when unset), round-robin when ranks outnumber GPUs. Returns it.

    Set to no device (``CUDA_VISIBLE_DEVICES=""``, as a job without GPUs may have), CUDA sees
    none, and neither does the rank: it is left so and ``""`` is returned.
    """
    env = os.environ if env is None else env
    raw = env.get("CUDA_VISIBLE_DEVICES")
    visible = [d for d in (raw or "").split(",") if d.strip()]
    if not visible:
        if raw is not None:
            return ""
        visible = [str(i) for i in range(info.local_size)]
    device = visible[info.local_rank % len(visible)].strip()
    env["CUDA_VISIBLE_DEVICES"] = device
    return device


def _trim(tb: TracebackType | None) -> TracebackType | None:
    """Drop the bootstrap's and runpy's own frames from the top of ``tb``."""
    while tb is not None and (
        tb.tb_frame.f_globals.get("__name__") in _OWN_MODULES
        or os.path.abspath(tb.tb_frame.f_code.co_filename) == os.path.abspath(__file__)
    ):
        tb = tb.tb_next
    return tb


def _record(status_dir: str, rank: int, exc: BaseException | None, code: object = None) -> None:
    """Write ``rank-N.json``: the error's first line and the exit status (Python's: 1 unless an int)."""
    status = code if isinstance(code, int) and exc is None else 1
    if exc is not None:
        what = f"{type(exc).__name__}: {exc}"
    elif isinstance(code, int):
        what = f"exited with status {code}"
    else:  # sys.exit("message"): Python prints the message and exits with 1
        what = f"exited with status 1: {code}"
    _write_record(status_dir, rank, what, int(status))


def _write_record(status_dir: str, rank: int, what: str, status: int) -> None:
    """``rank-N.json`` in ``status_dir`` (nothing without one): the first line of ``what`` and ``status``."""
    if not status_dir:
        return
    path = Path(status_dir, f"rank-{rank}.json")
    part = path.with_name(path.name + ".part")  # written whole, then renamed: `hpcdist run` polls for the name
    try:
        first = (what.splitlines() or [""])[0][:300]
        rec = {"rank": rank, "error": first, "status": status, "time": time.time(), "host": socket.gethostname()}
        part.write_text(json.dumps(rec))
        os.replace(part, path)
    except OSError:
        pass  # a remote node without the launcher's /tmp: the summary line is a nicety


#: signals a launcher or batch system sends the whole job (Hydra and slurmstepd signal each rank's process group,
#: so the rank gets them itself): the warden notes them, and a rank that then dies of one of them is not reported
_JOB_SIGNALS = ("SIGTERM", "SIGINT", "SIGHUP", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")
_PR_SET_PDEATHSIG = 1


def _death(status: int) -> str:
    """What ``hpcdist run``'s summary says of a rank whose process ended with wait status ``status``."""
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        why = {
            "SIGKILL": "the kernel's out-of-memory killer, or a kill -9",
            "SIGSEGV": "a crash in native code",
            "SIGBUS": "a crash in native code",
            "SIGABRT": "abort() in native code",
            "SIGFPE": "a crash in native code",
            "SIGILL": "a crash in native code",
        }.get(name, "sent to this rank alone")
        return f"killed by {name} (signal {sig}: {why})"
    return f"exited with status {os.WEXITSTATUS(status)} outside Python's exit path (os._exit, or native code)"


def _warden(rank: int, status_dir: str) -> None:
    """Fork: the child returns and runs the program; this process stays its parent until it ends, and then ends
    the same way (the launcher sees the child's exit status or signal). It records what Python in the child could
    not: a rank killed by a signal sent to it alone (the OOM killer's SIGKILL, a SIGSEGV), or leaving with a
    non-zero status past Python's exit path (``os._exit``), as ``rank-N.json`` for ``hpcdist run`` (which, before
    MPI is up, ends the job that the launcher would leave waiting). The child gets SIGKILL if this process dies
    (``PR_SET_PDEATHSIG``): a launcher's SIGKILL of this pid alone leaves no rank behind."""
    import ctypes

    noted: list[int] = []
    handlers = {}
    for name in _JOB_SIGNALS:
        sig = getattr(signal, name, None)
        if sig is not None:
            handlers[sig] = signal.signal(sig, lambda signum, _frame: noted.append(signum))
    parent = os.getpid()
    child = os.fork()
    if child == 0:
        for sig, handler in handlers.items():  # None: a handler not set from Python, which Python cannot restore
            signal.signal(sig, signal.SIG_DFL if handler is None else handler)
        with contextlib.suppress(AttributeError, OSError):  # a C library without prctl: no death signal
            ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
        if os.getppid() != parent:  # the warden died before prctl: nobody would report this rank
            os._exit(1)
        return
    _, status = os.waitpid(child, 0)  # retried after a noted signal (PEP 475)
    # a job-wide signal that reached the child itself too (the warden noted it) is not this rank's fault
    lost = os.WIFSIGNALED(status) and os.WTERMSIG(status) not in noted
    late = os.WIFEXITED(status) and os.WEXITSTATUS(status) != 0
    if (lost or late) and not Path(status_dir, f"rank-{rank}.json").exists():  # Python in the child said nothing
        code = 128 + os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        _write_record(status_dir, rank, _death(status), code)
    if os.WIFSIGNALED(status):  # end as the child ended: the launcher reports the same signal
        import resource

        sig = os.WTERMSIG(status)
        with contextlib.suppress(ValueError, OSError):  # no core file of the warden over the rank's own
            resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
        with contextlib.suppress(OSError, ValueError):  # SIGKILL's action cannot be set (nor needs to be)
            signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
        os._exit(128 + sig)
    os._exit(os.WEXITSTATUS(status) if os.WIFEXITED(status) else 1)


def _mpi_initialized() -> bool:
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is None:
        return False
    try:
        return bool(mpi.Is_initialized() and not mpi.Is_finalized())
    except Exception:
        return False


def _knob_on(name: str) -> bool:
    """``name`` (an HPCDIST_* on/off knob, default on) as the bootstrap reads it: a garbled value counts as on
    (the program itself reports it, at init_process_group)."""
    from hpcdist.config import env_flag

    try:
        return env_flag(name, True) is not False
    except ValueError:
        return True


def _report(exc: BaseException, info: RankInfo) -> None:
    """Print the traceback once, prefixed; then end the job."""
    tb = _trim(exc.__traceback__)
    if sys.excepthook is not sys.__excepthook__:
        # hpcdist's hook (installed by init_process_group) prints with [rank N] and aborts
        sys.excepthook(type(exc), exc.with_traceback(tb), tb)
    else:
        prefix = f"[rank {info.rank}] "
        text = "".join(traceback.format_exception(type(exc), exc, tb))
        sys.stderr.write("".join(ln if ln.startswith(prefix) else prefix + ln for ln in text.splitlines(keepends=True)))
    sys.stderr.flush()
    sys.stdout.flush()
    if _mpi_initialized() and _knob_on("HPCDIST_ABORT_ON_EXCEPTION"):
        mpi = sys.modules["mpi4py.MPI"]
        mpi.COMM_WORLD.Abort(1)
    os._exit(1)


def _lookup_failure(exc: BaseException) -> bool:
    """``-m name`` names no module: runpy's ImportError, raised before any frame of the program ran."""
    return isinstance(exc, ImportError) and _trim(exc.__traceback__) is None


def _note_exit(code: object) -> None:
    """A failing SystemExit (``raise SystemExit(1)`` too): end the job at exit when hpcdist's group is up."""
    init = sys.modules.get("hpcdist._init")
    if init is not None:
        init.note_exit(code)


def run_program(program: list[str]) -> None:
    """Run ``script args...`` or ``-m module args...`` as ``python`` would."""
    if program[0] == "-m":
        if len(program) < 2:
            raise SystemExit("hpcdist bootstrap: -m needs a module name")
        sys.argv = [program[1], *program[2:]]
        sys.path[0] = os.getcwd()
        runpy.run_module(program[1], run_name="__main__", alter_sys=True)
    else:
        script = program[0]
        sys.argv = [script, *program[1:]]
        sys.path[0] = os.path.dirname(os.path.realpath(script))  # as python: a symlink's target's directory
        _run_script(script)


def _run_script(script: str) -> None:
    """Run the file ``script`` as ``__main__``, as ``python script`` does: ``__file__`` and the code's file name
    absolute (cwd joined, not resolved), ``sys.argv[0]`` as given (``runpy.run_path`` would set it to the path)."""
    path = script if os.path.isabs(script) else os.path.join(os.getcwd(), script)
    if zipfile.is_zipfile(path):  # a zip application (its __main__.py): runpy's way
        runpy.run_path(script, run_name="__main__")
        return
    with io.open_code(path) as f:
        code = compile(f.read(), path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __cached__=None, __loader__=None, __package__=None, __spec__=None)
    main.__dict__["__builtins__"] = builtins
    sys.modules["__main__"] = main  # pickle and multiprocessing's spawn find the program's classes there
    exec(code, main.__dict__)


def main(argv: list[str] | None = None) -> None:
    opts, program = _parse(sys.argv[1:] if argv is None else argv)
    if not program:
        raise SystemExit("hpcdist bootstrap: missing program (script.py or -m module)")
    info = rank_info()
    set_torchrun_env(info)
    if opts["map_gpu"]:
        map_gpu(info)
    status_dir = str(opts["status_dir"])
    if status_dir and hasattr(os, "fork") and sys.platform.startswith("linux") and _knob_on("HPCDIST_RUN_WARDEN"):
        _warden(info.rank, status_dir)  # returns in the child, which runs the program
    if opts["prefix_output"]:
        sys.stdout = PrefixWriter(sys.stdout, f"[rank {info.rank}] ")  # type: ignore[assignment]
        sys.stderr = PrefixWriter(sys.stderr, f"[rank {info.rank}] ")  # type: ignore[assignment]
    try:
        run_program(program)
    except SystemExit as exc:
        if exc.code not in (None, 0):
            _record(status_dir, info.rank, None, exc.code)
            _note_exit(exc.code)
        raise
    except BaseException as exc:
        _record(status_dir, info.rank, exc)
        if _lookup_failure(exc):  # as python -m: the message, no traceback of runpy's internals
            sys.stderr.write(f"[rank {info.rank}] {sys.executable}: {exc}\n")
            sys.stderr.flush()
            os._exit(1)
        _report(exc, info)
    finally:
        sys.stdout.flush()
        sys.stderr.flush()


if __name__ == "__main__":
    main()
