"""Fixtures of the fault suite: one real run directory, profiled once per session."""

from __future__ import annotations

import shutil
import signal
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


@pytest.fixture(autouse=True)
def _signals_not_ignored():
    """The suite run under ``nohup`` (or ``cmd &`` in a script) ignores SIGHUP/SIGINT, and every
    process started here would inherit that: gpudoctor rightly keeps an ignored signal ignored.
    The signal tests send them (and check what a worker inherits), so every test here starts with the default
    dispositions."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGINT)}
    for s, h in saved.items():
        if h == signal.SIG_IGN:
            signal.signal(s, signal.SIG_DFL)
    yield
    for s, h in saved.items():
        if h == signal.SIG_IGN:
            signal.signal(s, h)
