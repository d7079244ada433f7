"""Fixtures of the fault suite: one real run directory, profiled once per session."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
from faultlib import WINDOW, gd, only_run_dir, write_train


@pytest.fixture(scope="session")
def profiled_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A complete run directory of a tiny CPU training script (30 steps, one trace)."""
    base = tmp_path_factory.mktemp("profiled")
    write_train(base)
    done = gd("profile", "--out", "runs", *WINDOW, "train.py", cwd=base)
    assert done.returncode == 0, done.stderr
    return only_run_dir(base / "runs")


@pytest.fixture
def run_copy(profiled_run: Path, tmp_path: Path) -> Path:
    """A copy of ``profiled_run`` the test may damage."""
    dest = tmp_path / profiled_run.name
    shutil.copytree(profiled_run, dest)
    return dest

