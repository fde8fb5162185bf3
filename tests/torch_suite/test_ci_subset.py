"""torch's own distributed test suite on the backend "hpcdist": the CI subset passes wherever gloo passes.

The subset (``ci_subset.txt``) runs first on gloo, then on hpcdist, both at
3 ranks through ``run_suite.py`` (each test in fresh processes, as torch's
``test_distributed_spawn.py`` runs it). The expected passes are the tests
gloo passed in this very run, so the list follows the installed torch and
machine; hpcdist must pass every one of them. The full suite at 2, 3 and 4
ranks: ``python tests/torch_suite/run_suite.py run --backend gloo`` then
``--backend hpcdist --only-passed-on gloo``; results in docs/torch-suite.md.

The suite also holds torch's own MPI backend to tests it asks of no other CPU
backend: the CPU ``all_to_all`` tests (``--profile mpi``). gloo cannot be the
reference there (it refuses the uneven list form these tests use), so they
are held to the suite's own assertions: every one must pass on hpcdist, none
skip.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("torch")
pytest.importorskip("expecttest")  # torch.testing._internal needs it (the "test" extra installs it)

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import run_suite  # noqa: E402

RANKS = 3
#: the CPU all_to_all tests of the suite's MPI profile (12; "group" ones on ranks 1.., "full_group" on all)
MPI_SUBSET = [
    f"test_all_to_all{kind}{variant}"
    for kind in ("", "_single_equal_split", "_single_unequal_split")
    for variant in ("", "_complex", "_group", "_full_group")
]
SUBSET = [ln.strip() for ln in (HERE / "ci_subset.txt").read_text().splitlines() if ln.strip() and ln[0] != "#"]


def _not_passed(got: dict[str, dict], tests: list[str]) -> dict[str, str]:
    """Each of ``tests`` the record ``got`` does not show passed (skipped or not run counts) -> outcome: reason."""
    return {
        t: f"{got.get(t, {}).get('outcome', 'not run')}: {got.get(t, {}).get('reason', '')}"
        for t in tests
        if got.get(t, {}).get("outcome") != "passed"
    }


@pytest.mark.timeout(900)
def test_subset_passes_on_hpcdist_wherever_gloo_passes(tmp_path: Path) -> None:
    gloo = run_suite.run("gloo", RANKS, SUBSET, limit=300, test_timeout=60, record=tmp_path / "gloo.jsonl")
    expected = [t for t in SUBSET if gloo.get(t, {}).get("outcome") == "passed"]
    missing = {t: gloo.get(t, {}).get("reason", "not run") for t in SUBSET if t not in expected}
    # the subset was chosen among gloo's passes: gloo failing many means the harness or machine is broken
    assert len(expected) >= 0.9 * len(SUBSET), f"gloo passed only {len(expected)} of {len(SUBSET)}: {missing}"
    got = run_suite.run("hpcdist", RANKS, expected, limit=400, test_timeout=60, record=tmp_path / "hpcdist.jsonl")
    failed = _not_passed(got, expected)
    assert not failed, f"hpcdist fails {len(failed)} of the {len(expected)} tests gloo passes: {failed}"


@pytest.mark.timeout(400)
def test_mpi_profile_all_to_all_passes_on_hpcdist(tmp_path: Path) -> None:
    got = run_suite.run(
        "hpcdist", RANKS, MPI_SUBSET, limit=300, test_timeout=60, record=tmp_path / "hpcdist.mpi.jsonl", profile="mpi"
    )
    failed = _not_passed(got, MPI_SUBSET)
    assert not failed, (
        f"hpcdist fails {len(failed)} of the {len(MPI_SUBSET)} tests torch asks of its MPI backend: {failed}"
    )
