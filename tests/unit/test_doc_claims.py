"""Claims of README.md and docs/*.md that are cheap to check without MPI ("a promise in the docs is a test").

- every ``HPCDIST_*`` variable the docs name is a knob of ``hpcdist/config.py`` (or one of the few read
  elsewhere, each of which the code still reads), and the README's knob table states config.py's defaults;
- every relative link of the docs reaches a file, and every ``#anchor`` a heading (GitHub's slugs) or an
  explicit ``<a id>``;
- every ``hpcdist COMMAND`` the docs show is a subcommand, and every option they give ``hpcdist run``,
  ``hpcdist bench``, ``hpcdist info`` and ``hpcdist debug analyze``/``export-torch`` is one its parser accepts.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

#: variables the docs name that are not config.py knobs -> a file of the repository that reads them
NOT_CONFIG_KNOBS = {
    "HPCDIST_TORCH_AUTOLOAD": "hpcdist/_torch_autoload.py",  # read at `import torch`, before hpcdist is imported
    "HPCDIST_SUITE_START": "tests/torch_suite/suite_spawn.py",  # the torch suite's test harness
    "HPCDIST_SUITE_PROFILE": "tests/torch_suite/suite_spawn.py",  # the torch suite's gating profile
    "HPCDIST_TEST_CUDA_AWARE": "tests/gpu/conftest.py",  # the GPU tests' harness
    "HPCDIST_TEST_DEADLINE": "tests/mpi_pytest.py",  # the MPI tests' harness: a hung test names itself
    "HPCDIST_CLUSTER_ROOT_PID": "scripts/cluster-ssh",  # the simulated cluster's ssh for MPI launchers
}


def _text(path: Path) -> str:
    return path.read_text(encoding="utf-8")


def _without_code_blocks(text: str) -> str:
    return re.sub(r"^(```|~~~).*?^\1", "", text, flags=re.S | re.M)


def _code(text: str) -> list[str]:
    """Every inline code span and every line of a fenced code block."""
    spans = re.findall(r"`([^`\n]+)`", _without_code_blocks(text))
    blocks = re.findall(r"^```[^\n]*\n(.*?)^```", text, flags=re.S | re.M)
    return spans + [line for block in blocks for line in block.splitlines()]


# ------------------------------------------------------------------ environment knobs


def test_every_hpcdist_variable_the_docs_name_exists():
    from hpcdist.config import KNOBS

    named = {m for doc in DOCS for m in re.findall(r"\bHPCDIST_[A-Z0-9_]*[A-Z0-9]", _text(doc))}
    unknown = sorted(named - set(KNOBS) - set(NOT_CONFIG_KNOBS))
    assert unknown == [], f"the docs name variables that nothing reads: {unknown}"
    for name, reader in NOT_CONFIG_KNOBS.items():
        assert name in _text(ROOT / reader), f"{name}: {reader} no longer reads it"


def _readme_rows() -> dict[str, str]:
    table = _text(ROOT / "README.md").split("## Environment knobs", 1)[1].split("\n## ", 1)[0]
    return {m.group(1): m.group(2) for m in re.finditer(r"^\| `(HPCDIST_[A-Z_]+)` \| (.*) \|$", table, flags=re.M)}


@pytest.fixture
def clean_env(monkeypatch):
    import os

    for name in list(os.environ):
        if name.startswith("HPCDIST_") or name == "TORCH_DISTRIBUTED_DEBUG":
            monkeypatch.delenv(name)


def test_readme_knob_defaults_are_configs(clean_env):
    """Each default the README's table states is what config.py's reader returns with the variable unset."""
    from hpcdist import config

    rows = _readme_rows()
    stated = {  # knob -> (the README row's wording of the default, the reader's value unset, the expected value)
        "HPCDIST_TIMEOUT": ("seconds (1800)", config.default_timeout().total_seconds(), 1800),
        "HPCDIST_WAIT": ("`block` (default", config.wait_mode(), "block"),
        "HPCDIST_ABORT_ON_EXCEPTION": ("`1` (default)", config.abort_on_exception(), True),
        "HPCDIST_DEBUG": ("`OFF` / `INFO` / `DETAIL`", config.debug_level(), "OFF"),
        "HPCDIST_FLIGHT_RECORDER": ("(2000;", config.flight_recorder_size(), 2000),
        "HPCDIST_FLIGHT_DIR": ("(`./hpcdist-flight`)", config.flight_dir(), "hpcdist-flight"),
        "HPCDIST_FLIGHT_DUMP": ("`1` (default)", config.flight_dump_on_error(), True),
        "HPCDIST_OBJECT_UNPICKLER": ("`full` (default)", config.object_unpickler(), "full"),
        "HPCDIST_CUDA_AWARE": ("`1`/`0`", config.cuda_aware_override(), None),
        "HPCDIST_NCCL_WATCHDOG": ("`1` (default)", config.nccl_watchdog_enabled(), True),
        "HPCDIST_MPI_TUNE": ("`1` (default)", config._mpi_tune(), True),
        "HPCDIST_RUN_WARDEN": ("`1` (default)", config.run_warden(), True),
        "HPCDIST_KEEPALIVE": ("(120;", config.keepalive_seconds(), 120),
        "HPCDIST_SHM": ("`auto` (default)", config.shm_mode(), "auto"),
        "HPCDIST_SHM_SLOT": ("(1 MiB)", config.shm_slot_bytes(), 1 << 20),
        "HPCDIST_SHM_DIRECT": ("`0` (default)", config.shm_direct(), False),
        "HPCDIST_HIER": ("`auto` (default)", config._tristate("HPCDIST_HIER"), "auto"),
        "HPCDIST_HIER_MIN_BYTES": ("(512 KiB)", config.hierarchical_min_bytes(), 512 << 10),
        "HPCDIST_HIER_ALGO": ("`auto` (default)", config.hierarchical_algorithm(), "auto"),
        "HPCDIST_HIER_ASYNC": ("`1` (default)", config.hierarchical_async(), True),
    }
    for knob, (wording, value, expected) in stated.items():
        assert wording in rows[knob], f"README row of {knob} no longer says {wording!r}: {rows[knob]!r}"
        assert value == expected, f"{knob} unset: config gives {value!r}, the README says {wording!r}"


def test_boolean_knobs_take_the_words_the_readme_lists(monkeypatch):
    """README: "Boolean knobs take 1/0/true/false/yes/no/on/off; an empty value counts as unset"."""
    from hpcdist import config

    assert "`1/0/true/false/yes/no/on/off`; an empty value counts as unset" in _text(ROOT / "README.md")
    for word, value in [("1", True), ("true", True), ("yes", True), ("on", True)]:
        for raw in (word, word.upper()):
            monkeypatch.setenv("HPCDIST_SHM_DIRECT", raw)
            assert config.shm_direct() is value
    for word in ("0", "false", "no", "off"):
        monkeypatch.setenv("HPCDIST_ABORT_ON_EXCEPTION", word)
        assert config.abort_on_exception() is False
    for name in ("HPCDIST_ABORT_ON_EXCEPTION", "HPCDIST_WAIT", "HPCDIST_TIMEOUT", "HPCDIST_SHM", "HPCDIST_HIER"):
        monkeypatch.setenv(name, "")
    assert config.abort_on_exception() is True
    assert config.wait_mode() == "block"
    assert config.default_timeout().total_seconds() == 1800
    assert config.shm_mode() == "auto"
    monkeypatch.setenv("HPCDIST_HIER", "yes")  # "(also `true`, `yes`, `on`)"
    assert config.hierarchical_min_bytes() == 0


# ------------------------------------------------------------------ links and anchors


def _slug(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"<[^>]+>", "", heading.strip().lower())
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    text = _text(path)
    out: set[str] = set(re.findall(r'<a (?:id|name)="([^"]+)"', text))
    seen: dict[str, int] = {}
    for heading in re.findall(r"^#{1,6}\s+(.*?)\s*#*$", _without_code_blocks(text), flags=re.M):
        slug = _slug(heading)
        n = seen.get(slug, -1) + 1
        seen[slug] = n
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_every_relative_link_and_anchor_resolves():
    broken = []
    for doc in DOCS:
        for target in re.findall(r"\]\(([^)\s]+)\)", _without_code_blocks(_text(doc))):
            if re.match(r"[a-z][a-z0-9+.-]*:", target):  # https:, mailto:
                continue
            path, _, anchor = target.partition("#")
            dest = (doc.parent / path).resolve() if path else doc
            where = f"{doc.relative_to(ROOT)} -> {target}"
            if not dest.exists():
                broken.append(f"{where}: no such file")
            elif anchor and dest.suffix == ".md" and anchor not in _anchors(dest):
                broken.append(f"{where}: no such anchor")
    assert broken == []


# ------------------------------------------------------------------ the hpcdist command


def _hpcdist_commands() -> list[list[str]]:
    """The words after ``hpcdist`` of every command line the docs show (code spans and code blocks)."""
    out = []
    for doc in DOCS:
        for code in _code(_text(doc)):
            code = re.sub(r"(^|\s)#.*", "", code)  # a shell comment
            for m in re.finditer(
                r"(?:^\s*(?:\S+=\S*\s+)*|\b(?:mpiexec|mpirun|srun)\s[^|]*?)hpcdist((?: +[^\s|`]+)+)", code
            ):
                words = m.group(1).split()
                if words[0] in ("as", "import") or not re.fullmatch(r"[a-z]+", words[0]):
                    continue  # `import hpcdist as dist`, `from hpcdist import ...`
                out.append(words)
    return out


def test_every_hpcdist_subcommand_the_docs_show_exists():
    from hpcdist.cli import SUBCOMMANDS

    shown = {words[0] for words in _hpcdist_commands()}
    assert {"run", "info", "bench", "debug"} <= shown
    assert sorted(shown - set(SUBCOMMANDS)) == []


def _options(words: list[str]) -> list[str]:
    """The ``--option`` / ``-o`` names among ``words`` (``--opt=value`` gives ``--opt``; placeholders are skipped)."""
    return [w.split("=", 1)[0] for w in words if re.fullmatch(r"--?[a-z][a-z-]*(=\S*)?", w)]


def _accepts(parser, option: str) -> bool:
    """Whether argparse's ``parser`` takes ``option``, written out or as an unambiguous abbreviation."""
    names = [s for action in parser._actions for s in action.option_strings]
    return option in names or (option.startswith("--") and len([n for n in names if n.startswith(option)]) == 1)


def test_every_hpcdist_run_option_the_docs_show_exists():
    from hpcdist.launch.run import _parser, _split

    parser = _parser()
    bad = []
    for words in _hpcdist_commands():
        if words[0] != "run":
            continue
        head, _ = _split([w for w in words[1:] if not w.startswith(("[", "("))])  # `[options]`, `(script.py | ...)`
        bad += [o for o in _options(head) if not _accepts(parser, o)]
    cli = _text(ROOT / "docs" / "cli.md").split("## `hpcdist run`", 1)[1].split("\n## ", 1)[0]
    for cell in re.findall(r"^\| (`-[^|]*) \|", cli, flags=re.M):  # the options table's first column
        bad += [o for o in re.findall(r"`(--?[a-z][a-z-]*)", cell) if not _accepts(parser, o)]
    assert bad == []


def _help(main, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exc:
        main(argv)
    assert exc.value.code == 0
    return capsys.readouterr().out


def test_every_bench_info_and_debug_option_the_docs_show_exists(capsys):
    from hpcdist import bench, debug_analyze, info

    helps = {
        "bench": _help(bench.main, ["--help"], capsys),
        "info": _help(info.main, ["--help"], capsys),
        "debug": "".join(_help(debug_analyze.main, [cmd, "--help"], capsys) for cmd in ("analyze", "export-torch")),
    }
    bad = []
    for words in _hpcdist_commands():
        if words[0] in helps:
            bad += [
                (words[0], o) for o in _options(words[1:]) if not re.search(rf"(?<![\w-]){o}(?![\w-])", helps[words[0]])
            ]
    cli = _text(ROOT / "docs" / "cli.md").split("## `hpcdist bench`", 1)[1]
    for option in re.findall(r"^\| `(--[a-z-]+)", cli, flags=re.M):
        if not re.search(rf"(?<![\w-]){option}(?![\w-])", helps["bench"]):
            bad.append(("bench", option))
    assert bad == []
