"""Round trips per second of hpcdist's TCPStore beside torch's, on loopback.

Each store's server runs in its own process (as on a real job, where rank 0
serves and the others are clients). Rows:

- sequential: one client in this process, one request at a time (latency
  bound): set, get, add of small values, set/get of 1 MiB values;
- concurrent: ``--clients`` clients spread over ``--procs`` processes (threads
  inside each), each client with its own connection, all doing ``add``
  (server throughput under contention).

Every row is run ``--repeat`` times and the best rate is printed (the
machine may be shared). ``set`` is not acknowledged in either store.

Usage: python examples/benchmarks/bench_store.py [--ops 5000] [--clients 64] [--procs 4] [--repeat 3] [--no-torch]
Prints a Markdown table. Not a test: nothing is asserted.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

_SERVER = {
    "hpcdist": (
        "import sys, time\n"
        "from datetime import timedelta\n"
        "from hpcdist.store import TCPStore\n"
        "s = TCPStore('127.0.0.1', 0, None, True, timedelta(seconds=300))\n"
        "print(s.port, flush=True)\n"
        "sys.stdin.read()\n"
    ),
    "torch": (
        "import sys, time\n"
        "from datetime import timedelta\n"
        "from torch.distributed import TCPStore\n"
        "s = TCPStore('127.0.0.1', 0, None, True, timedelta(seconds=300))\n"
        "print(s.port, flush=True)\n"
        "sys.stdin.read()\n"
    ),
}


def _client(kind: str, port: int) -> Any:
    from datetime import timedelta

    if kind == "hpcdist":
        from hpcdist.store import TCPStore

        return TCPStore("127.0.0.1", port, timeout=timedelta(seconds=300))
    from torch.distributed import TCPStore as TorchTCPStore

    return TorchTCPStore("127.0.0.1", port, None, False, timedelta(seconds=300))


def _start_server(kind: str) -> tuple[subprocess.Popen, int]:
    env = dict(os.environ)
    env.pop("HPCDIST_STORE_SECRET", None)
    env.pop("HPCDIST_STORE_SECRET_FILE", None)
    proc = subprocess.Popen(
        [sys.executable, "-c", _SERVER[kind]], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    return proc, int(proc.stdout.readline())


def _rate(n: int, fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return n / (time.perf_counter() - start)


_CLIENTS = """
import sys, threading, time
sys.path.insert(0, sys.argv[4])
from bench_store import _client
kind, port, n, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[5])
stores = [_client(kind, port) for _ in range(n)]
def work(s):
    for _ in range(per):
        s.add("cnt", 1)
threads = [threading.Thread(target=work, args=(s,)) for s in stores]
print("ready", flush=True)
sys.stdin.readline()
for t in threads: t.start()
for t in threads: t.join()
print("done", flush=True)
"""


def _concurrent(kind: str, port: int, clients: int, procs: int, ops: int) -> float:
    """Total add rate of ``clients`` clients spread over ``procs`` processes."""
    per_proc = max(1, clients // procs)
    per = max(1, (ops * 4) // (per_proc * procs))
    here = os.path.dirname(os.path.abspath(__file__))
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _CLIENTS, kind, str(port), str(per_proc), here, str(per)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(procs)
    ]
    try:
        for c in children:
            assert c.stdout is not None and c.stdout.readline().strip() == "ready"
        start = time.perf_counter()
        for c in children:
            assert c.stdin is not None
            c.stdin.write("go\n")
            c.stdin.flush()
        for c in children:
            assert c.stdout is not None and c.stdout.readline().strip() == "done"
        return per * per_proc * procs / (time.perf_counter() - start)
    finally:
        for c in children:
            c.kill()
            c.wait()


def bench(kind: str, ops: int, clients: int, procs: int) -> dict[str, float]:
    proc, port = _start_server(kind)
    try:
        c = _client(kind, port)
        small = b"x" * 16
        big = b"y" * (1 << 20)
        big_ops = max(20, ops // 50)
        c.set("k", small)
        c.set("big", big)
        for _ in range(200):  # warm up
            c.get("k")
        out: dict[str, float] = {}

        def loop(fn: Callable[[], object], n: int) -> Callable[[], None]:
            def run() -> None:
                for _ in range(n):
                    fn()

            return run

        out["set 16 B"] = _rate(ops, loop(lambda: c.set("k", small), ops))
        out["get 16 B"] = _rate(ops, loop(lambda: c.get("k"), ops))
        out["add"] = _rate(ops, loop(lambda: c.add("n", 1), ops))
        out["set 1 MiB"] = _rate(big_ops, loop(lambda: c.set("big", big), big_ops))
        out["get 1 MiB"] = _rate(big_ops, loop(lambda: c.get("big"), big_ops))

        out[f"add, {clients} clients in {procs} processes (total)"] = _concurrent(kind, port, clients, procs, ops)
        return out
    finally:
        if proc.stdin is not None:
            proc.stdin.close()
        proc.kill()
        proc.wait()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ops", type=int, default=5000, help="requests per sequential row (default 5000)")
    parser.add_argument("--clients", type=int, default=64, help="clients of the concurrent row (default 64)")
    parser.add_argument("--procs", type=int, default=4, help="processes the clients are spread over (default 4)")
    parser.add_argument("--repeat", type=int, default=3, help="runs per row; the best is printed (default 3)")
    parser.add_argument("--no-torch", action="store_true", help="skip torch's TCPStore")
    args = parser.parse_args()

    kinds = ["hpcdist"]
    torch_version = None
    if not args.no_torch:
        try:
            import torch
            import torch.distributed

            torch_version = torch.__version__
            kinds.append("torch")
        except ImportError:
            pass
    runs: dict[str, list[dict[str, float]]] = {k: [] for k in kinds}
    for _ in range(args.repeat):  # interleaved, so both stores see the same machine load
        for kind in kinds:
            runs[kind].append(bench(kind, args.ops, args.clients, args.procs))
    results = {k: {row: max(r[row] for r in rs) for row in rs[0]} for k, rs in runs.items()}

    print(
        f"# TCPStore round trips per second, loopback ({datetime.date.today()}, Python {platform.python_version()}, "
        f"{os.cpu_count()} CPUs, {platform.machine()}{', torch ' + torch_version if torch_version else ''})\n"
    )
    header = "| operation | hpcdist ops/s |" + (" torch ops/s | hpcdist / torch |" if "torch" in results else "")
    print(header)
    print("|" + "---|" * (header.count("|") - 1))
    for row, ours in results["hpcdist"].items():
        line = f"| {row} | {ours:,.0f} |"
        if "torch" in results:
            theirs = results["torch"][row]
            line += f" {theirs:,.0f} | {ours / theirs:.2f} |"
        print(line)


if __name__ == "__main__":
    main()
