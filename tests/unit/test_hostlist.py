"""Slurm hostlist expansion against known answers (what `scontrol show hostnames` prints)."""

from __future__ import annotations

import pytest

from hpcdist.launch.hostlist import expand_hostlist, parse_tasks_per_node

KNOWN = [
    ("", []),
    ("node1", ["node1"]),
    ("a,b,c", ["a", "b", "c"]),
    (" a , b ", ["a", "b"]),
    ("node[01-04,10]", ["node01", "node02", "node03", "node04", "node10"]),
    ("node[1-3]", ["node1", "node2", "node3"]),
    ("n[8-11]", ["n8", "n9", "n10", "n11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("a[1-2]b[3-4]", ["a1b3", "a1b4", "a2b3", "a2b4"]),
    ("gpu[1-2]-ib", ["gpu1-ib", "gpu2-ib"]),
    ("login,node[1-2],gpu[07,09]", ["login", "node1", "node2", "gpu07", "gpu09"]),
    ("c[1,3-4]x,d", ["c1x", "c3x", "c4x", "d"]),
    ("r[0-1]n[00-01]", ["r0n00", "r0n01", "r1n00", "r1n01"]),
    ("node[5]", ["node5"]),
    ("a,a", ["a", "a"]),
]


@pytest.mark.parametrize("text, hosts", KNOWN)
def test_expand_known(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize(
    "text, words",
    [
        ("node[1-", "unclosed"),
        ("node]", "unmatched"),
        ("node[]", "empty"),
        ("node[3-1]", "backwards"),
        ("node[a-b]", "bad range"),
        ("node[[1]]", "nested"),
        ("node[1-2-3]", "bad range"),
        ("node[0-99999999]", "more than"),
    ],
)
def test_expand_bad_input_names_the_problem(text, words):
    with pytest.raises(ValueError, match="hostlist") as info:
        expand_hostlist(text)
    assert words in str(info.value)
    assert repr(text) in str(info.value) or text in str(info.value)


def test_expand_rejects_non_str():
    with pytest.raises(TypeError, match="hostlist must be a str, got list"):
        expand_hostlist(["a"])  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "spec, counts",
    [("2", [2]), ("2(x3),1", [2, 2, 2, 1]), ("4(x2)", [4, 4]), ("1,2,3", [1, 2, 3])],
)
def test_tasks_per_node(spec, counts):
    assert parse_tasks_per_node(spec) == counts


def test_tasks_per_node_bad():
    with pytest.raises(ValueError, match="SLURM_TASKS_PER_NODE"):
        parse_tasks_per_node("2(3)")


@pytest.mark.timeout(20)
@pytest.mark.parametrize(
    "text",
    [
        "n[" + ",".join(["0-999999"] * 60) + "]",  # many ranges in one bracket add up
        ",".join(["n[0-999999]"] * 60),  # many expressions add up
    ],
)
def test_expand_caps_the_total_before_allocating_it(text):
    """The host cap counts every range and expression, refusing before tens of millions of names exist."""
    with pytest.raises(ValueError, match="more than"):
        expand_hostlist(text)


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([5], "5"),
        ([3, 1], "1, 3"),
        ([2, 3], "2, 3"),  # two in a row stay two: the analyzer's "rank(s) 0, 1" lines read as before
        ([0, 1, 2, 3, 5, 7, 8], "0-3, 5, 7, 8"),
        ([*range(512), *range(513, 1024), 512 + 2048], "0-511, 513-1023, 2560"),
        ([4, 4, 5, 6], "4-6"),
    ],
)
def test_ranks_text_folds_runs_of_three_or_more(ranks, text):
    from hpcdist.launch.hostlist import expand_hostlist, ranks_text

    assert ranks_text(ranks) == text
    # the reference: Slurm's hostlist grammar expands the same text back to the ranks (a prefix keeps it a hostlist)
    assert [int(h[1:]) for h in expand_hostlist(",".join(f"r[{p.strip()}]" for p in text.split(",")))] == sorted(
        set(ranks)
    )


def test_ranks_text_cuts_a_long_text_after_a_whole_part_and_counts_the_ranks():
    from hpcdist.launch.hostlist import ranks_text

    evens = list(range(0, 4096, 2))
    text = ranks_text(evens, limit=40)
    assert text.endswith(", ... (2048 ranks)") and len(text) <= 40 + len(", ... (2048 ranks)")
    shown = [int(p) for p in text.split(", ")[:-1]]
    assert shown == evens[: len(shown)] and len(shown) >= 8  # whole numbers, the first ones, none cut
    assert ranks_text(range(4096), limit=10) == "0-4095"  # what fits is not cut
    assert ranks_text([1, 2, 3, 7], limit=6) == "1-3, 7"
    assert ranks_text([1, 2, 3, 7], limit=5) == "1-3, ... (4 ranks)"
