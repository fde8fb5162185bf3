"""Fixtures shared by the unit tests."""

from __future__ import annotations

import pytest


@pytest.fixture
def script(tmp_path, monkeypatch):
    """A script ``train.py`` in a fresh working directory (``hpcdist run`` checks that the script exists)."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.py").write_text("print('hi')\n")
    return "train.py"
