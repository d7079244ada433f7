"""`tensorboard --logdir gpudoctor-runs` with torch-tb-profiler lists each run and serves Overview and Trace.

A real TensorBoard process on 127.0.0.1, queried through the profiler plugin's HTTP API.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import pytest
from collect_testlib import FAST_SCHEDULE, copy_script, env, manifest, only_run_dir, run_profile

pytestmark = pytest.mark.slow

PLUGIN = "/data/plugin/pytorch_profiler"


def _get(base: str, path: str, **params: str):  # noqa: ANN202
    url = base + PLUGIN + path + ("?" + urllib.parse.urlencode(params) if params else "")
    with urllib.request.urlopen(url, timeout=30) as r:
        body = r.read()
    return json.loads(body) if body[:1] in (b"{", b"[") else body


@pytest.fixture(scope="module")
def tensorboard(tmp_path_factory):
    pytest.importorskip("torch_tb_profiler")
    if shutil.which("tensorboard") is None and not _has_tb_module():
        pytest.skip("tensorboard is not installed")
    work = tmp_path_factory.mktemp("tb")
    copy_script("train_small.py", work)
    proc = run_profile("--no-report", "--out", "gpudoctor-runs", *FAST_SCHEDULE, "train_small.py", "--", "--epochs", "2", cwd=work)
    assert proc.returncode == 0, proc.stderr
    run_dir = only_run_dir(work / "gpudoctor-runs")
    tb = subprocess.Popen(
        [sys.executable, "-m", "tensorboard.main", "--logdir", "gpudoctor-runs", "--host", "127.0.0.1", "--port", "0"],
        cwd=work, env=env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        base = None
        deadline = time.monotonic() + 90
        seen = []
        while time.monotonic() < deadline and base is None:
            line = tb.stdout.readline()
            if not line:
                break
            seen.append(line)
            m = re.search(r"(http://127\.0\.0\.1:\d+)/", line)
            if m:
                base = m.group(1)
        assert base, "".join(seen[-20:])
        # the plugin loads runs in the background: wait until ours is listed and loaded
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            runs = _get(base, "/runs")
            if run_dir.name in runs["runs"] and not runs["loading"]:
                break
            time.sleep(0.5)
        yield base, run_dir
    finally:
        tb.terminate()
        try:
            tb.wait(timeout=15)
        except subprocess.TimeoutExpired:
            tb.kill()


def _has_tb_module() -> bool:
    try:
        import tensorboard  # noqa: F401
    except ImportError:
        return False
    return True


def test_run_listed_under_its_own_name(tensorboard):
    base, run_dir = tensorboard
    runs = _get(base, "/runs")
    assert runs["runs"] == [run_dir.name]


def test_overview_and_trace_are_served(tensorboard):
    base, run_dir = tensorboard
    run = run_dir.name
    views = _get(base, "/views", run=run)
    assert "Overview" in views and "Trace" in views
    workers = _get(base, "/workers", run=run, view="Overview")
    trace_files = manifest(run_dir)["traces"]
    expected_worker = trace_files[0].split(".")[0]
    assert workers == [expected_worker]
    spans = _get(base, "/spans", run=run, worker=expected_worker)
    assert spans == ["1", "2"]  # two windows, in step order
    overview = _get(base, "/overview", run=run, worker=expected_worker, span="1")
    rows = overview["steps"]["rows"]
    assert [r[0] for r in rows] == ["3", "4", "5"]  # ProfilerStep#N = step N of steps.jsonl
    second = _get(base, "/overview", run=run, worker=expected_worker, span="2")
    assert [r[0] for r in second["steps"]["rows"]] == ["9", "10", "11"]
    trace = _get(base, "/trace", run=run, worker=expected_worker, span="1")
    if isinstance(trace, bytes):  # served gzipped
        import gzip

        trace = json.loads(gzip.decompress(trace))
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"} <= names
