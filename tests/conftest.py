"""Shared fixtures.

``shared_traces``: the public Kineto traces of ``../shared/traces`` (relative to the
project root), or the folder named by ``GPUDOCTOR_SHARED_TRACES``. Tests that use it
skip cleanly when it is absent, so the suite passes for a user who clones the
project alone. The traces are never copied into the repository.

``gpu_run``: the run directories recorded on a real GPU, kept in ``tests/fixtures/gpu/<run>/``
(tests/fixtures/gpu/README.md): a function from a run's name to a readable run directory, its
gzipped records unpacked into a temporary folder (``benchmarks/gpu_acceptance.py`` writes them
plain; either is read). ``gpu_index``: what ``index.json`` there says each run planted;
``gpu_report``: a recorded run analysed and diagnosed in this process, once per session.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
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


GPU_FIXTURES = ROOT / "tests" / "fixtures" / "gpu"


@pytest.fixture(scope="session")
def gpu_index() -> dict:
    path = GPU_FIXTURES / "index.json"
    if not path.is_file():
        pytest.skip("no recorded GPU runs in tests/fixtures/gpu")
    return json.loads(path.read_text(encoding="utf-8"))


@pytest.fixture(scope="session")
def gpu_run(tmp_path_factory):
    """``gpu_run(name)``: the recorded run ``name`` as a run directory (records unpacked), or a skip."""
    made: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name in made:
            return made[name]
        src = GPU_FIXTURES / name
        if not (src / "manifest.json").is_file() and not (src / "manifest.json.gz").is_file():
            pytest.skip(f"tests/fixtures/gpu has no recorded run {name!r}")
        dest = tmp_path_factory.mktemp("gpu-runs") / name
        dest.mkdir()
        for f in sorted(src.iterdir()):
            if f.name.endswith(".pt.trace.json.gz") or not f.name.endswith(".gz"):
                shutil.copyfile(f, dest / f.name)  # traces stay gzipped: the parser reads them so
            else:
                with gzip.open(f, "rb") as fh:
                    (dest / f.name[: -len(".gz")]).write_bytes(fh.read())
        made[name] = dest
        return dest

    return get


@pytest.fixture(scope="session")
def gpu_report(gpu_run):
    """``gpu_report(name)``: (the analysed ``RunData``, the ``Report`` of ``gpudoctor analyze``) of a
    recorded GPU run, made once per session."""
    from gpudoctor.config import Config
    from gpudoctor.engine import diagnose
    from gpudoctor.pipeline import analyze_paths

    made: dict[str, tuple] = {}

    def get(name: str):
        if name not in made:
            run = analyze_paths([str(gpu_run(name))], jobs=1)
            made[name] = (run, diagnose(run, Config(), kind="analyze"))
        return made[name]

    return get


@pytest.fixture(scope="session", autouse=True)
def _state_dir(tmp_path_factory):
    """gpudoctor's per-user state (the secret and the records of trusted runs, gpudoctor.trust) goes to a
    folder of the test session, never the real home: the runs ``profile`` makes in the session are
    trusted by the ``verify`` of the same session (the processes they start inherit the setting)."""
    from gpudoctor.trust import STATE_ENV

    saved = os.environ.get(STATE_ENV)
    os.environ[STATE_ENV] = str(tmp_path_factory.mktemp("gpudoctor-state") / "state")
    yield
    if saved is None:
        os.environ.pop(STATE_ENV, None)
    else:
        os.environ[STATE_ENV] = saved


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
