"""Slurm-style hostlists, expanded in Python (no ``scontrol show hostnames``).

>>> expand_hostlist("node[01-03,10],login")
['node01', 'node02', 'node03', 'node10', 'login']
>>> expand_hostlist("a[1-2]b[3-4]")
['a1b3', 'a1b4', 'a2b3', 'a2b4']

Grammar, as Slurm reads it: a comma-separated list of host expressions (commas
inside brackets belong to the bracket); each expression is literal text and
bracket groups ``[r1,r2,...]``; each range ``lo-hi`` or a single number keeps
the zero padding of ``lo`` (``[08-11]`` gives ``08 09 10 11``). Several bracket
groups give their product, the leftmost varying slowest. Duplicates are kept,
in order, as Slurm keeps them.
"""

from __future__ import annotations

import itertools
import re

from hpcdist._ranklist import ranks_text

__all__ = ["expand_hostlist", "parse_tasks_per_node", "ranks_text"]

_MAX_HOSTS = 1 << 20  # guard against a typo like node[0-99999999]
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


def _split_top_level(text: str) -> list[str]:
    """Split ``text`` at commas outside brackets; check bracket balance."""
    parts: list[str] = []
    depth = 0
    start = 0
    for i, ch in enumerate(text):
        if ch == "[":
            if depth:
                raise ValueError(f"hostlist: nested '[' at position {i} in {text!r}; expected name[ranges]")
            depth = 1
        elif ch == "]":
            if not depth:
                raise ValueError(f"hostlist: unmatched ']' at position {i} in {text!r}")
            depth = 0
        elif ch == "," and not depth:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError(f"hostlist: unclosed '[' in {text!r}")
    parts.append(text[start:])
    return parts


def _expand_ranges(body: str, expr: str) -> list[str]:
    """``01-03,7`` -> ``['01', '02', '03', '7']``."""
    out: list[str] = []
    for item in body.split(","):
        m = _RANGE.match(item.strip())
        if not m:
            raise ValueError(f"hostlist: bad range {item!r} in {expr!r}; expected N or LO-HI with digits")
        lo_s, hi_s = m.group(1), m.group(2) or m.group(1)
        lo, hi = int(lo_s), int(hi_s)
        if hi < lo:
            raise ValueError(f"hostlist: range {item!r} in {expr!r} runs backwards; expected LO <= HI")
        if len(out) + hi - lo >= _MAX_HOSTS:  # counted before expanding: many ranges add up
            raise ValueError(f"hostlist: brackets in {expr!r} give more than {_MAX_HOSTS} hosts")
        width = len(lo_s)
        out.extend(str(n).zfill(width) for n in range(lo, hi + 1))
    return out


def _expand_one(expr: str) -> list[str]:
    pieces: list[list[str]] = []
    pos = 0
    for m in re.finditer(r"\[([^\]]*)\]", expr):
        if m.start() > pos:
            pieces.append([expr[pos : m.start()]])
        if not m.group(1).strip():
            raise ValueError(f"hostlist: empty brackets in {expr!r}")
        pieces.append(_expand_ranges(m.group(1), expr))
        pos = m.end()
    if pos < len(expr):
        pieces.append([expr[pos:]])
    total = 1
    for p in pieces:
        total *= len(p)
    if total > _MAX_HOSTS:
        raise ValueError(f"hostlist: {expr!r} expands to {total} hosts, more than {_MAX_HOSTS}")
    return ["".join(combo) for combo in itertools.product(*pieces)]


def _check_total(count: int, hostlist: str) -> None:
    if count > _MAX_HOSTS:
        raise ValueError(f"hostlist: {hostlist!r} expands to more than {_MAX_HOSTS} hosts")


def expand_hostlist(hostlist: str) -> list[str]:
    """Expand a Slurm hostlist expression into host names, in order.

    Raises ``ValueError`` naming the bad part (unbalanced or nested brackets,
    a range that is not ``N`` or ``LO-HI``, a backwards range). Whitespace
    around items is ignored; an empty string gives ``[]``.
    """
    if not isinstance(hostlist, str):
        raise TypeError(f"hostlist must be a str, got {type(hostlist).__name__}")
    text = hostlist.strip()
    if not text:
        return []
    hosts: list[str] = []
    for expr in _split_top_level(text):
        expr = expr.strip()
        if expr:
            hosts.extend(_expand_one(expr))
            _check_total(len(hosts), text)
    return hosts


def parse_tasks_per_node(spec: str) -> list[int]:
    """Expand Slurm's ``SLURM_TASKS_PER_NODE`` (``"2(x3),1"`` -> ``[2, 2, 2, 1]``)."""
    out: list[int] = []
    for item in spec.split(","):
        item = item.strip()
        if not item:
            continue
        m = re.match(r"^(\d+)(?:\(x(\d+)\))?$", item)
        if not m:
            raise ValueError(f"SLURM_TASKS_PER_NODE: bad item {item!r} in {spec!r}; expected N or N(xM)")
        out.extend([int(m.group(1))] * int(m.group(2) or 1))
    return out
