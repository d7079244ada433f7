"""The rules on the real Kineto traces of ../shared/traces (skipped when that folder is absent).

They run through the same path as `gpudoctor analyze`: parse.load_inputs → analysis.analyze_trace →
engine.diagnose.
"""

from __future__ import annotations

import dataclasses
import importlib
from functools import cache
from pathlib import Path

import pytest

from gpudoctor.config import Config
from gpudoctor.engine import diagnose
from gpudoctor.model import Report, Severity

pytestmark = pytest.mark.shared_traces


def _pipeline():
    parse = importlib.import_module("gpudoctor.parse")
    analysis = importlib.import_module("gpudoctor.analysis")
    load_inputs = getattr(parse, "load_inputs", None)
    analyze_trace = getattr(analysis, "analyze_trace", None)
    if load_inputs is None or analyze_trace is None:
        pytest.skip("gpudoctor.parse.load_inputs / gpudoctor.analysis.analyze_trace are not available yet")
    return load_inputs, analyze_trace


@cache
def _report(path: str) -> Report:
    load_inputs, analyze_trace = _pipeline()
    loaded = load_inputs([Path(path)])
    metrics = tuple(analyze_trace(t, loaded.run) for t in loaded.timelines)
    return diagnose(dataclasses.replace(loaded.run, metrics=metrics), Config(), "analyze")


def report_for(shared_traces: Path, name: str) -> Report:
    path = shared_traces / name
    if not path.is_file():
        pytest.skip(f"{name} is not in {shared_traces}")
    return _report(str(path))


def codes(rep: Report) -> set[str]:
    return {f.code for f in rep.findings}


def test_deepseek_healthy_run_has_no_stall_warnings(shared_traces):
    rep = report_for(shared_traces, "deepseek/h800_rank0_of64_train.json.gz")
    loud = [
        f for f in rep.findings
        if f.code[:3] in ("GD1", "GD2", "GD3") and f.severity.rank <= Severity.WARNING.rank
    ]
    assert not loud, [f"{f.code} {f.severity.value}: {f.message}" for f in loud]
    assert not rep.errors


def test_rtx2080ti_resnet_pageable_copies(shared_traces):
    rep = report_for(shared_traces, "param/rtx2080ti_resnet.json.gz")
    (f,) = [f for f in rep.findings if f.code == "GD301"]
    metrics = {m.name: m for m in f.evidence.metrics}
    assert metrics["pageable_h2d_count"].value == 61
    assert 2.0e9 < metrics["pageable_h2d_bytes"].value < 2.6e9 and metrics["pageable_h2d_bytes"].unit == "bytes"
    assert 400e6 < metrics["pageable_h2d_ns"].value < 900e6 and metrics["pageable_h2d_ns"].unit == "ns"
    assert "61 host→device copies" in f.message
    # each copy is followed by a stream sync: the host-blocking side is GD302's
    (blocking,) = [f for f in rep.findings if f.code == "GD302"]
    assert "61 host→device (pageable)" in blocking.message


def test_b200_eager_is_launch_bound(shared_traces):
    rep = report_for(shared_traces, "tracelens/b200_eager.json.gz")
    assert "GD103" in codes(rep), [f"{f.code}: {f.message}" for f in rep.findings]


def test_a100_negative_queue_idle_with_sync_among_causes(shared_traces):
    rep = report_for(shared_traces, "hta/a100_rank0_of16_negative_queue.json.gz")
    (f,) = [f for f in rep.findings if f.code == "GD101"]
    assert "host synchronization" in f.message
    assert f.severity == Severity.ERROR


@pytest.mark.parametrize("name", ["hta/v100_ns_resolution.pt.trace.json.gz", "hta/v100_rank1_of2_trace_diff_test.json.gz"])
def test_busy_v100_traces_have_no_gpu_idle_finding(shared_traces, name):
    rep = report_for(shared_traces, name)
    assert "GD101" not in codes(rep)
    item = next(i for i in rep.checklist if i.codes == ("GD101",))
    assert item.status.value == "applied"


def test_every_shared_trace_diagnoses_without_a_crashed_rule(shared_traces):
    for path in sorted(shared_traces.rglob("*.json.gz")):
        rep = _report(str(path))
        assert not rep.errors, (path.name, rep.errors)
