"""Shared fixtures.

``shared_traces``: the public Kineto traces of ``../shared/traces`` (relative to the
project root), or the folder named by ``GPUDOCTOR_SHARED_TRACES``. Tests that use it
skip cleanly when it is absent, so the suite passes for a user who clones the
project alone. The traces are never copied into the repository.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def shared_traces_dir() -> Path | None:
    env = os.environ.get("GPUDOCTOR_SHARED_TRACES")
    candidate = Path(env) if env else ROOT.parent / "shared" / "traces"
    return candidate if candidate.is_dir() else None


@pytest.fixture(scope="session")
def shared_traces() -> Path:
    d = shared_traces_dir()
    if d is None:
        pytest.skip("../shared/traces is absent (set GPUDOCTOR_SHARED_TRACES to point at it)")
    return d


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(autouse=True)
def _signals_not_ignored():
    """The suite run under ``nohup`` (or ``cmd &`` in a script) ignores SIGHUP/SIGINT, and every
    process started here would inherit that: gpudoctor rightly keeps an ignored signal ignored.
    The tests that send them (the fault suite, Ctrl-C in profile, view and verify) and check what a
    worker inherits need the defaults, so every test starts with the default dispositions."""
    saved = {s: signal.getsignal(s) for s in (signal.SIGHUP, signal.SIGINT)}
    for s, h in saved.items():
        if h == signal.SIG_IGN:
            signal.signal(s, signal.SIG_DFL)
    yield
    for s, h in saved.items():
        if h == signal.SIG_IGN:
            signal.signal(s, h)
