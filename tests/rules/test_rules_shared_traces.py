"""The rules on the real Kineto traces of ../shared/traces (skipped when that folder is absent).

They run through the same path as `gpudoctor analyze`: parse.load_inputs → analysis.analyze_trace →
engine.diagnose. Beyond single diagnoses, every trace must give one consistent account of its step
(docs/account.md): an exact ledger, findings that claim at most the step between them, GD101 after
its causes, no rule that points to another rule which found nothing, and "applied" only on evidence.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
from collections import defaultdict
from functools import cache
from pathlib import Path

import pytest

from gpudoctor.config import Config
from gpudoctor.engine import diagnose, run_rules
from gpudoctor.model import ChecklistStatus, Report, RunData, Severity
from gpudoctor.rules.context import RuleContext
from gpudoctor.rules.registry import all_rules
from gpudoctor.rules.results import RuleResult, Verdict

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
def _run(path: str) -> RunData:
    load_inputs, analyze_trace = _pipeline()
    loaded = load_inputs([Path(path)])
    metrics = tuple(analyze_trace(t, loaded.run) for t in loaded.timelines)
    return dataclasses.replace(loaded.run, metrics=metrics)


@cache
def _report(path: str) -> Report:
    return diagnose(_run(path), Config(), "analyze")


@cache
def _results(path: str) -> dict[str, RuleResult]:
    """Every rule's own verdict on the trace, as the engine ran it."""
    results, *_ = run_rules(RuleContext(_run(path), Config().thresholds), Config(), all_rules())
    return results


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
    assert item.status.value == "no_problem_seen"  # it looked and found nothing: not "applied"


def test_every_shared_trace_diagnoses_without_a_crashed_rule(shared_traces):
    for path in sorted(shared_traces.rglob("*.json.gz")):
        rep = _report(str(path))
        assert not rep.errors, (path.name, rep.errors)


# ---------------------------------------------------------------- one account of the step


def _all(shared_traces: Path) -> list[Path]:
    paths = sorted(shared_traces.rglob("*.json.gz"))
    if not paths:
        pytest.skip(f"no traces in {shared_traces}")
    return paths


def test_every_ledger_is_exact_and_gpu_idle_is_its_host_side(shared_traces):
    for path in _all(shared_traces):
        for m in _run(str(path)).metrics:
            led = m.ledger
            assert led is not None, path.name
            assert sum(s.ns for s in led.slices) == led.total_ns > 0, path.name
            assert all(sum(b.parts_ns.values()) == b.dur_ns for b in m.breakdown), path.name
            assert sum(b.dur_ns for b in m.breakdown) == led.total_ns, path.name
            if m.has_gpu_activity:
                idle, _ = RuleContext.idle(m)
                assert led.basis == "gpu" and abs(led.idle_pct - idle) < 0.01, (path.name, led.idle_pct, idle)
                assert led.ns("unexplained") == 0, path.name


def test_findings_claim_at_most_the_step_and_never_the_same_time_twice(shared_traces):
    for path in _all(shared_traces):
        rep = _report(str(path))
        per_rank: dict[object, float] = defaultdict(float)
        per_part: dict[tuple[str, str], int] = defaultdict(int)
        for f in rep.findings:
            per_rank[f.rank] += f.gain.share_pct or 0.0
            for c in f.gain.claims:
                per_part[(c.ledger, c.component)] += c.granted_ns
                assert c.granted_ns <= c.requested_ns <= c.part_ns, (path.name, f.code, c)
            if f.gain.share_pct is not None and f.gain.share_pct > 0:
                assert f.gain.claims, (path.name, f.code, "a share of step time that is no ledger part")
        assert all(v <= 100.0 + 1e-6 for v in per_rank.values()), (path.name, dict(per_rank))
        for (_, part), granted in per_part.items():
            claim = next(c for f in rep.findings for c in f.gain.claims if c.component == part)
            assert granted <= claim.part_ns, (path.name, part)
        if rep.account is not None:
            assert rep.account.claimed_pct <= 100.0 + 1e-6


def test_gd101_never_ranks_above_a_cause_and_names_only_findings(shared_traces):
    for path in _all(shared_traces):
        rep = _report(str(path))
        codes_ = [f.code for f in rep.findings]
        if "GD101" not in codes_:
            continue
        first = codes_.index("GD101")
        assert all(c == "GD101" for c in codes_[first:]), (path.name, codes_)
        (f,) = [x for x in rep.findings if x.code == "GD101"]
        named = set(re.findall(r"GD\d{3}", f.message + " " + f.fix.instruction))
        assert named <= set(codes_), (path.name, named)


_SEE = re.compile(r"\bsee (GD\d{3})")


def test_no_rule_points_to_a_rule_that_found_nothing(shared_traces):
    for path in _all(shared_traces):
        rep, results = _report(str(path)), _results(str(path))
        for f in rep.findings:
            text = " ".join((f.message, f.fix.instruction, f.gain.note, *f.evidence.notes))
            for code in _SEE.findall(text):
                r = results.get(code)
                assert r is None or r.verdict != Verdict.FINE, (path.name, f.code, "points to", code, r.reason)
        for code, r in results.items():  # fine verdicts do not send the reader elsewhere either
            if r.verdict == Verdict.FINE:
                for other in _SEE.findall(r.reason):
                    assert results.get(other) is None or results[other].verdict != Verdict.FINE, (path.name, code)


def test_applied_only_on_positive_evidence(shared_traces):
    for path in _all(shared_traces):
        rep, results = _report(str(path)), _results(str(path))
        for item in rep.checklist:
            if item.status != ChecklistStatus.APPLIED:
                continue
            evidence = (
                item.key == "profiler"  # the trace itself
                or "the trace shows" in item.reason
                or any(results[c].applied for c in item.codes if c in results)
            )
            assert evidence, (path.name, item.key, item.reason)


def test_an_inference_trace_without_a_dataloader_claims_no_loader_technique(shared_traces):
    rep = report_for(shared_traces, "tracelens/mi300x_sglang_qwen3_prefilldecode.json.gz")
    items = {i.key: i for i in rep.checklist}
    for key in ("dataloader-workers", "prefetch"):
        assert items[key].status == ChecklistStatus.NOT_APPLICABLE, items[key]
        assert "no DataLoader" in items[key].reason


def test_rtx2080ti_resnet_puts_the_dataloader_first(shared_traces):
    """GPU idle 67%, three quarters of it waiting for the (multi-process) DataLoader: the cure first."""
    rep = report_for(shared_traces, "param/rtx2080ti_resnet.json.gz")
    assert rep.findings[0].code == "GD201"
    assert rep.account is not None and rep.account.actions[0].code == "GD201"
    assert "GPU idle 67.4% of step time: waiting for the DataLoader 45.9%" in rep.account.headline
    f = rep.findings[0]
    assert "_MultiProcessingDataLoaderIter" in f.message and "num_workers" in f.fix.instruction
    # the copies' syncs are GD102's: GD302 is included in it, no time counted twice
    (blocking,) = [x for x in rep.findings if x.code == "GD302"]
    assert blocking.gain.share_pct == 0.0 and blocking.gain.included_in == ("GD102",)
    workers = next(i for i in rep.checklist if i.key == "dataloader-workers")
    assert workers.status == ChecklistStatus.RECOMMENDED


def test_launch_bound_is_one_test_for_gd101_and_gd103(shared_traces):
    """GD103 fires exactly when the ledger's launch overhead (GD101's cause) crosses its threshold."""
    t = Config().thresholds
    for path in _all(shared_traces):
        run = _run(str(path))
        m = run.metrics[0]
        if not m.has_gpu_activity or m.kernels is None:
            continue
        fired = _results(str(path))["GD103"].verdict == Verdict.FIRED
        assert fired == (m.ledger.pct("launch_overhead") >= t.launch_gap_min_share_pct), path.name
