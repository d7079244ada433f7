"""Shared fixtures.

``shared_traces``: the public Kineto traces of ``../shared/traces`` (relative to the
project root), or the folder named by ``GPUDOCTOR_SHARED_TRACES``. Tests that use it
skip cleanly when it is absent, so the suite passes for a user who clones the
project alone. The traces are never copied into the repository.
"""

from __future__ import annotations

import os
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
