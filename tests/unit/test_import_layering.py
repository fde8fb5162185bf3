"""hpcdist's modules import each other without a cycle, and no lower layer imports an upper one.

The graph is read from the source with :mod:`ast` (nothing is imported), so
the test sees what every module imports whatever is installed. What counts
(docs/architecture.md, "Import layering"):

- **Module-level imports** count, including those inside a module-level
  ``try``/``if``/``with`` (they run when the module loads). ``import a.b.c``
  also runs the ``__init__`` of every package on the way (``a.b``), so an
  import of a module counts as an import of each enclosing package too,
  except the packages that enclose the importer itself (they are already
  loading) and the root ``hpcdist`` (the facade, which loads first).
- **``if TYPE_CHECKING:`` imports** do not count: they never run.
- **Function-level imports** do not count: they run when the function is
  called, after every module has loaded, so they cannot make an import cycle
  or change the load order. They are the deliberate, late-bound exceptions
  to the layer order (a timeout dumping the flight recorder, the engine
  factory choosing its path); ``python tests/unit/test_import_layering.py``
  lists them.

The layers are declared by dotted prefix in :data:`LAYERS`, lowest first; a
module belongs to the layer of its longest matching prefix, so a new module
under a known folder (``hpcdist/backends/<path>/...``) needs no entry. A
module may import its own layer and the layers below it; within a layer only
the absence of cycles is asserted.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "hpcdist"

#: (layer, dotted prefixes), lowest layer first. "hpcdist" alone is the facade package itself.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    (
        "foundation: errors, knobs, process state, ops (import nothing above)",
        (
            "hpcdist._version",
            "hpcdist._exit",
            "hpcdist._watchdog",
            "hpcdist._world",
            "hpcdist._launchenv",
            "hpcdist._descriptors",
            "hpcdist._ranklist",
            "hpcdist._torch_autoload",
            "hpcdist.errors",
            "hpcdist.config",
            "hpcdist.ops",
            "hpcdist.topology",
            "hpcdist.debug.levels",
        ),
    ),
    (
        "completion: Work, timed waits, flight recorder, stores",
        ("hpcdist.work", "hpcdist._timed", "hpcdist.flight", "hpcdist.store"),
    ),
    ("rendezvous: joining processes into one communicator", ("hpcdist.rendezvous",)),
    ("buffers: array adapters, dtypes, packing, reduction", ("hpcdist.buffers",)),
    ("device plumbing: GPU adapters, streams, device choice", ("hpcdist.gpu",)),
    ("engines: one folder per path", ("hpcdist.backends",)),
    ("groups", ("hpcdist.group", "hpcdist._queries")),
    (
        "calls: collectives, p2p, objects, debugging aids",
        ("hpcdist.collectives", "hpcdist.p2p", "hpcdist.objects", "hpcdist.debug"),
    ),
    (
        "features: init, meshes, bucketing, symmetric memory, checkpoints",
        ("hpcdist._init", "hpcdist.mesh", "hpcdist.bucketing", "hpcdist.symmetric_memory", "hpcdist.checkpoint"),
    ),
    ("torch backend", ("hpcdist.torch",)),
    (
        "facade and tools",
        (
            "hpcdist",
            "hpcdist.__main__",
            "hpcdist.cli",
            "hpcdist.info",
            "hpcdist.bench",
            "hpcdist.debug_analyze",
            "hpcdist.flight_torch",
            "hpcdist.launch",
        ),
    ),
]


#: (importer, imported) edges tolerated for now, each with its reason; keep it empty.
TOLERATED: set[tuple[str, str]] = set()


def modules(root: Path = ROOT) -> dict[str, tuple[Path, bool]]:
    """Dotted name -> (file, is a package) of every module under ``root``."""
    out = {}
    for path in sorted(root.rglob("*.py")):
        parts = list(path.relative_to(root.parent).with_suffix("").parts)
        is_pkg = parts[-1] == "__init__"
        out[".".join(parts[:-1] if is_pkg else parts)] = (path, is_pkg)
    return out


def _is_type_checking(test: ast.expr) -> bool:
    return isinstance(test, ast.Name | ast.Attribute) and ast.unparse(test).endswith("TYPE_CHECKING")


def _module_level(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The imports that run when the module loads (not in functions, classes or ``if TYPE_CHECKING``)."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from _module_level(node.body)
            yield from _module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from _module_level(block)
        elif isinstance(node, ast.With):
            yield from _module_level(node.body)


def _function_level(tree: ast.Module) -> Iterator[ast.Import | ast.ImportFrom]:
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
            yield from (n for n in ast.walk(fn) if isinstance(n, ast.Import | ast.ImportFrom))


def _targets(node: ast.Import | ast.ImportFrom, name: str, is_pkg: bool, known: dict) -> set[str]:
    """The hpcdist modules an import statement loads, enclosing packages included."""
    if isinstance(node, ast.Import):
        named = [alias.name for alias in node.names]
    else:
        base = node.module or ""
        if node.level:
            package = name.split(".") if is_pkg else name.split(".")[:-1]
            package = package[: len(package) - node.level + 1]
            base = ".".join([*package, *([base] if base else [])])
        named = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in known else base for alias in node.names]
    out = set()
    own = name.split(".") if is_pkg else name.split(".")[:-1]
    for target in named:
        if target != "hpcdist" and not target.startswith("hpcdist."):
            continue
        while target not in known and "." in target:
            target = target.rsplit(".", 1)[0]
        parts = target.split(".")
        for depth in range(2, len(parts) + 1):  # hpcdist.a, hpcdist.a.b, ...: each __init__ runs
            enclosing = ".".join(parts[:depth])
            if enclosing in known and (depth == len(parts) or parts[:depth] != own[:depth]):
                out.add(enclosing)
        if target == "hpcdist":
            out.add("hpcdist")
    return out - {name}


def import_graph(root: Path = ROOT, lazy: bool = False) -> dict[str, set[str]]:
    """Module -> the hpcdist modules it imports at module level (``lazy``: in its functions instead)."""
    known = modules(root)
    graph = {}
    for name, (path, is_pkg) in known.items():
        tree = ast.parse(path.read_text(), str(path))
        nodes = _function_level(tree) if lazy else _module_level(tree.body)
        graph[name] = set().union(*(_targets(n, name, is_pkg, known) for n in nodes))
        graph[name] -= {target for importer, target in TOLERATED if importer == name}
    return graph


def find_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a list of modules (first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*path[path.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        path.pop()
        state[node] = 2
        return None

    for start in sorted(graph):
        if start not in state and (found := visit(start)):
            return found
    return None


def layer_of(name: str) -> int | None:
    """Index in :data:`LAYERS` of the longest prefix matching ``name`` (None: no layer declared)."""
    best, best_len = None, -1
    for index, (_, prefixes) in enumerate(LAYERS):
        for prefix in prefixes:
            matches = name == prefix or (prefix != "hpcdist" and name.startswith(prefix + "."))
            if matches and len(prefix) > best_len:
                best, best_len = index, len(prefix)
    return best


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    """``"a (layer) imports b (higher layer)"`` for every edge against the layer order."""
    out = []
    for name, targets in sorted(graph.items()):
        for target in sorted(targets):
            mine, theirs = layer_of(name), layer_of(target)
            if mine is not None and theirs is not None and theirs > mine:
                out.append(f"{name} ({LAYERS[mine][0]}) imports {target} ({LAYERS[theirs][0]})")
    return out


# --- the tests --------------------------------------------------------------------------------


def test_every_module_has_a_layer():
    missing = [name for name in modules() if layer_of(name) is None]
    assert not missing, f"add these modules' folder or name to LAYERS in {__file__}: {missing}"


def test_no_import_cycle():
    cycle = find_cycle(import_graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_no_lower_layer_imports_an_upper_one():
    wrong = upward_imports(import_graph())
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def test_the_graph_reader_sees_what_python_runs(tmp_path):
    """The reader on a small package: relative and absolute forms, enclosing packages, and what does not count."""
    pkg = tmp_path / "hpcdist"
    (pkg / "sub").mkdir(parents=True)
    files = {
        "__init__.py": "from .top import x\n",
        "top.py": "x = 1\n",
        "low.py": (
            "from typing import TYPE_CHECKING\n"
            "import hpcdist.sub.leaf\n"
            "try:\n    from . import top\nexcept ImportError:\n    pass\n"
            "if TYPE_CHECKING:\n    from .other import y\n"
            "def f():\n    from .other import y\n"
        ),
        "other.py": "from .sub import leaf\n",
        "sub/__init__.py": "",
        "sub/leaf.py": "from .. import low\nfrom . import sibling\n",
        "sub/sibling.py": "",
    }
    for rel, text in files.items():
        (pkg / rel).write_text(text)
    graph = import_graph(pkg)
    assert graph["hpcdist"] == {"hpcdist.top"}
    assert graph["hpcdist.low"] == {"hpcdist.sub", "hpcdist.sub.leaf", "hpcdist.top"}
    assert graph["hpcdist.other"] == {"hpcdist.sub", "hpcdist.sub.leaf"}
    assert graph["hpcdist.sub.leaf"] == {"hpcdist.low", "hpcdist.sub.sibling"}  # not its own package
    assert import_graph(pkg, lazy=True)["hpcdist.low"] == {"hpcdist.other"}
    assert find_cycle(graph) == ["hpcdist.low", "hpcdist.sub.leaf", "hpcdist.low"]
    assert find_cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize(
    ("name", "layer"),
    [
        ("hpcdist", "facade and tools"),
        ("hpcdist.backends.nccl.watchdog", "engines: one folder per path"),
        ("hpcdist.debug", "calls: collectives, p2p, objects, debugging aids"),
        ("hpcdist.debug.levels", "foundation: errors, knobs, process state, ops (import nothing above)"),
        ("hpcdist.debug_analyze", "facade and tools"),
    ],
)
def test_layers_match_by_longest_dotted_prefix(name, layer):
    index = layer_of(name)
    assert index is not None and LAYERS[index][0] == layer


def main() -> None:
    """Print the function-level imports that go up the layers: the late-bound exceptions."""
    for line in upward_imports(import_graph(lazy=True)):
        print(line)


if __name__ == "__main__":
    main()
