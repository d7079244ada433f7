"""The accuracy benchmark's CPU part as a test: right diagnoses, no false alarms, fixes that pay.

Runs ``benchmarks/accuracy.py`` once, every scenario runnable on this machine planted and
fixed under ``gpudoctor profile --steps 40`` (the README's "diagnosed in a minute": a short
run must name what a whole one does), once each; about 4 minutes on 2 cores. It asserts the
targets of issue 6 scenario by scenario, so a failure names the scenario and what it missed.
GPU-only scenarios are "needs GPU" on a CPU machine and are not asserted here. The
benchmark's whole-script runs, twice each (``python benchmarks/accuracy.py``), are run by
hand; their figures are in docs/development.md.
"""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks" / "accuracy.py"
TIMEOUT_S = 1200  # about 4 minutes on 2 cores (one 40-step run of each variant)
SHORT_STEPS = 40  # the README's quick run: every scenario's problem shows within it


def _load_bench():
    spec = importlib.util.spec_from_file_location("gpudoctor_bench_accuracy_names", BENCH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


acc = _load_bench()
SCENARIOS = [s.name for s in acc.discover()]


# ----------------------------------------------------------------- the verdict logic, on made-up runs


def _variant(fixed: bool, codes=(), severity="warning", per_sample_us=100.0, repeat=1):
    v = acc.Variant(fixed=fixed, exit_code=0, repeat=repeat)
    v.findings = [{"code": c, "severity": severity, "share_pct": None} for c in codes]
    v.time_per_sample_us = per_sample_us
    return v


def _scenario(expected=("GD201",), needs_gpu=False, gpus_for_speedup=0):
    return acc.Scenario("s", BENCH, tuple(expected), needs_gpu, gpus_for_speedup)


def test_judge_passes_a_right_diagnosis_with_a_clean_faster_fix():
    r = acc.judge(_scenario(), [_variant(False, ["GD201", "GD203"], "error", 200)], [_variant(True, ["GD203"], "info", 100)], 0)
    assert (r.top, r.rank, r.fixed_alarms, r.speedup, r.problems) == ("GD201", 1, [], 2.0, [])
    assert r.diagnosed_right


def test_judge_compares_the_fastest_runs_and_judges_every_run():
    planted = [_variant(False, ["GD201"], "error", 300), _variant(False, ["GD204"], "error", 200, repeat=2)]
    fixed = [_variant(True, [], per_sample_us=260), _variant(True, ["GD204"], "warning", 150, repeat=2)]
    r = acc.judge(_scenario(), planted, fixed, 0)
    assert r.speedup == 200 / 150 and r.planted.repeat == 2 and r.fixed.repeat == 2
    assert r.top == "GD201" and r.fixed_alarms == ["GD204"]
    assert any("got top finding GD204 (planted run 2)" in p for p in r.problems)
    assert any("false alarm on the fixed variant (fixed run 2): GD204" in p for p in r.problems)
    assert not r.diagnosed_right  # a miss in any run is a miss


def test_a_busy_machine_is_neither_a_diagnosis_nor_a_false_alarm():
    planted, fixed = acc.Variant(fixed=False, exit_code=0), acc.Variant(fixed=True, exit_code=0, repeat=1)
    acc.read_findings(planted, {"findings": [{"code": "GD205", "severity": "error"},
                                             {"code": "GD201", "severity": "error", "gain": {"share_pct": 30.0}}]})
    acc.read_findings(fixed, {"findings": [{"code": "GD205", "severity": "warning"}]})
    planted.time_per_sample_us, fixed.time_per_sample_us = 200, 100
    r = acc.judge(_scenario(), [planted], [fixed], 0)
    assert (r.top, r.rank, r.fixed_alarms, r.problems, r.machine_busy) == ("GD201", 1, [], [], 2)
    assert "busy (GD205) in 2 run(s)" in acc.summary_line(acc.summary([r]))


def test_a_fix_timed_on_a_busy_machine_is_not_judged_and_says_why():
    planted = acc.Variant(fixed=False, exit_code=0)
    acc.read_findings(planted, {"findings": [{"code": "GD201", "severity": "error", "gain": {"share_pct": 30.0}}]})
    planted.time_per_sample_us = 100
    busy = acc.Variant(fixed=True, exit_code=0, repeat=1)
    acc.read_findings(busy, {"findings": [{"code": "GD205", "severity": "warning"}]})
    busy.time_per_sample_us = 101
    r = acc.judge(_scenario(), [planted], [busy], 0)
    assert r.problems == [] and "not judged: the machine was busy" in r.unjudged and "fixed" in r.unjudged
    quiet = acc.Variant(fixed=True, exit_code=0, repeat=1)
    quiet.time_per_sample_us = 101
    r = acc.judge(_scenario(), [planted], [quiet], 0)  # the same times on a quiet machine: a miss
    assert r.problems == ["the fix is not faster: 0.99x"] and r.unjudged == ""


def test_a_planted_run_that_found_only_a_busy_machine_is_not_judged_but_a_wrong_finding_is_a_miss():
    busy = acc.Variant(fixed=False, exit_code=0)
    acc.read_findings(busy, {"findings": [{"code": "GD205", "severity": "error"}]})
    busy.time_per_sample_us = 100
    r = acc.judge(_scenario(), [busy], [_variant(True, [], per_sample_us=50)], 0)
    assert r.problems == [] and "not judged: the machine was busy" in r.diagnosis_unjudged and not r.diagnosed_right
    assert "not judged: busy" in acc.table([r])
    wrong = acc.Variant(fixed=False, exit_code=0)  # the same busy machine, and a rule that fired wrongly
    acc.read_findings(wrong, {"findings": [{"code": "GD205", "severity": "error"},
                                           {"code": "GD204", "severity": "warning", "gain": {"share_pct": 9.0}}]})
    wrong.time_per_sample_us = 100
    r = acc.judge(_scenario(), [wrong], [_variant(True, [], per_sample_us=50)], 0)
    assert any("got top finding GD204" in p for p in r.problems) and r.diagnosis_unjudged == ""


def test_a_run_with_partial_step_figures_is_not_diagnosed():
    """Step tracking stopped (the report warns the figures are partial, issue 35): the right top finding
    does not make it a diagnosis."""
    warning = "the step figures are partial: step tracking stopped at step 16: ValueError: x"
    planted = acc.Variant(fixed=False, exit_code=0)
    acc.read_findings(planted, {"findings": [{"code": "GD201", "severity": "error", "gain": {"share_pct": 30.0}}],
                                "warnings": [warning]})
    planted.time_per_sample_us = 200
    r = acc.judge(_scenario(), [planted], [_variant(True, [], per_sample_us=100)], 0)
    assert r.top == "GD201" and r.partial == ["planted"] and not r.diagnosed_right
    assert r.problems == [f"planted not diagnosed: {warning}"] and "MISS" in acc.table([r])
    assert acc.summary([r])["diagnosed_right"] == 0


def test_judge_names_each_missed_target():
    r = acc.judge(_scenario(), [_variant(False, ["GD204", "GD201"], "error", 100)], [_variant(True, ["GD204"], "warning", 120)], 0)
    assert r.rank == 2 and not r.diagnosed_right
    assert r.fixed_alarms == ["GD204"]
    assert any("on top, got top finding GD204" in p for p in r.problems)
    assert any("false alarm on the fixed variant" in p for p in r.problems)
    assert any("not faster" in p for p in r.problems)


def test_judge_does_not_require_a_speedup_the_machine_cannot_show():
    r = acc.judge(_scenario(("GD601",), gpus_for_speedup=2), [_variant(False, ["GD601"], "info", 100)], [_variant(True, [], per_sample_us=100)], 1)
    assert not r.speedup_measurable and r.problems == []


def test_baseline_alarms_and_gpu_scenarios_in_the_summary():
    base = acc.judge(_scenario(()), [_variant(False, ["GD503"], "warning")], None, 0)
    assert base.baseline_alarms == ["GD503"] and base.problems
    gpu = acc.Result("g", ["GD401"], "needs GPU")
    ok = acc.judge(_scenario(), [_variant(False, ["GD201"], "error", 300)], [_variant(True, [], per_sample_us=100)], 0)
    s = acc.summary([base, gpu, ok])
    assert (s["diagnosed_right"], s["runnable"], s["needs_gpu"], s["false_alarms_baseline"]) == (1, 1, 1, 1)
    assert s["median_speedup"] == 3.0 and not s["targets_met"]
    text = acc.table([base, gpu, ok])
    assert "needs GPU" in text and "MISS" in text and "3.00x" in text
    assert "diagnosed right: 1/1" in acc.summary_line(s)


def test_verified_column_and_summary():
    ok = acc.judge(_scenario(), [_variant(False, ["GD201"], "error", 300)], [_variant(True, [], per_sample_us=100)], 0)
    ok.verified = acc.Verified("GD201", "confirmed", 1.72, (1.66, 1.92))
    tried = acc.judge(_scenario(("GD203",)), [_variant(False, ["GD203"], "error", 300)],
                      [_variant(True, [], per_sample_us=100)], 0)
    tried.verified = acc.Verified("GD203", "not_tried", reason="a code change")
    text = acc.table([ok, tried])
    assert "verified (--verify)" in text and "confirmed 1.72x [1.66-1.92]" in text and "not_tried" in text
    s = acc.summary([ok, tried])
    assert s["verified"] == {"confirmed": 1, "refuted": 0, "inconclusive": 0, "not_tried": 1}
    assert acc.summary_line(s).endswith("--verify: 1 confirmed, 0 refuted, 0 inconclusive, 1 not_tried")
    # without --verify: no column, no clause
    assert "verified" not in acc.table([acc.judge(_scenario(), [_variant(False, ["GD201"])], None, 0)])


def test_a_verified_gain_beyond_its_bound_is_a_missed_target():
    r = acc.judge(_scenario(), [_variant(False, ["GD201"], "error", 300)], [_variant(True, [], per_sample_us=100)], 0)
    r.verified = acc.Verified("GD201", "confirmed", 11.15, (2.15, 57.7))
    r.expected_speedup, r.speedup_bound = 4.88, 7.94  # issue 37's held-out loader: "at most 87.4% at stake"
    assert r.beyond_bound and "beyond the bound" in acc.calibration_table([r])
    r.speedup_bound = 23.3  # the wait's share of the unprofiled steps' sums, 95.7%
    assert not r.beyond_bound and "beyond" not in acc.calibration_table([r])
    r.verified = acc.Verified("GD201", "not_tried", reason="a code change")
    r.speedup_bound = 1.5
    assert not r.beyond_bound


def test_parse_docstring_reads_codes_gpu_needs_and_speedup_needs(tmp_path):
    script = tmp_path / "x.py"
    script.write_text('"""X.\n\nProblem: p.\nExpected: GD301, GD302\nNeeds: GPU\nSpeedup: needs 2+ GPUs\nFix: f.\n"""\n')
    s = acc.parse_docstring(script)
    assert (s.expected, s.needs_gpu, s.speedup_needs_gpus) == (("GD301", "GD302"), True, 2)
    script.write_text('"""X.\n\nExpected: GD2O1\n"""\n')
    with pytest.raises(ValueError):
        acc.parse_docstring(script)


# ----------------------------------------------------------------- the benchmark itself (slow)


def _benchmark(out: Path, *only: str) -> dict:
    json_path = out / "accuracy.json"
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--json", str(json_path), "--keep", str(out / "runs"), "--quiet",
         "--steps", str(SHORT_STEPS), "--repeat", "1", *(a for name in only for a in ("--only", name))],
        capture_output=True, text=True, timeout=TIMEOUT_S, cwd=ROOT,
    )  # fmt: skip
    assert json_path.is_file(), f"the benchmark wrote no results (exit {proc.returncode}):\n{proc.stdout}\n{proc.stderr[-3000:]}"
    data = json.loads(json_path.read_text(encoding="utf-8"))
    data["_stdout"] = proc.stdout
    data["_exit"] = proc.returncode
    return data


@pytest.fixture(scope="module")
def bench(tmp_path_factory) -> dict:
    return _benchmark(tmp_path_factory.mktemp("accuracy"))


def _result(bench: dict, name: str) -> dict:
    for r in bench["scenarios"]:
        if r["name"] == name:
            return r
    raise AssertionError(f"{name} missing from the benchmark's results")


def _misses(r: dict) -> list[str]:
    """What a scenario's result misses of the targets (issue 6), in words; [] when it meets them all."""
    name, planted, fixed = r["name"], r["planted"], r["fixed"]
    if not planted or planted["error"]:
        return [f"{name}: the planted run failed: {planted and planted['error']}"]
    if not r["expected"]:  # the tuned baseline
        return [f"false alarm on the baseline: {r['baseline_alarms']}"] if r["baseline_alarms"] else []
    if not fixed or fixed["error"]:
        return [f"{name}: the fixed run failed: {fixed and fixed['error']}"]
    out = []
    if not r["diagnosis_unjudged"] and r["top"] not in r["expected"]:  # unjudged: GD205 and nothing else
        out.append(f"{name}: expected {r['expected']} on top, got {r['top']}")
    if r["fixed_alarms"]:
        out.append(f"{name}: findings >= warning on the fixed variant: {r['fixed_alarms']}")
    if r["speedup_measurable"] and not r["unjudged"] and not (r["speedup"] is not None and r["speedup"] > 1.0):
        out.append(f"{name}: the fix is not faster ({r['speedup']})")  # unjudged: GD205 measured other load
    out.extend(f"{name}: {p}" for p in r["problems"])  # every repeat judged, not only the first
    return out


@pytest.mark.accuracy
@pytest.mark.slow
@pytest.mark.timeout(2 * TIMEOUT_S + 60)
@pytest.mark.parametrize("name", SCENARIOS)
def test_scenario_meets_the_targets(bench, name, tmp_path):
    """One 40-step run of each variant; a scenario that misses a target is run once more on its own, and
    fails only when it misses again: one stall on a loaded 2-core machine (a 67 ms write in one step's wait
    once read as a GD201 alarm) is not a wrong rule, and a wrong rule misses every time."""
    r = _result(bench, name)
    if r["status"] == "needs GPU":
        pytest.skip(f"{name} needs a GPU; this machine has none")
    first = _misses(r)
    if not first:
        return
    again = _benchmark(tmp_path, name)
    second = _misses(_result(again, name))
    assert not second, (f"{'; '.join(second)} (and in the first run: {'; '.join(first)})\n{bench['_stdout']}\n"
                        f"{again['_stdout']}")


@pytest.mark.accuracy
@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S + 60)
def test_summary_and_exit_status_agree(bench):
    s = bench["summary"]
    assert s["runnable"] + s["needs_gpu"] == sum(1 for r in bench["scenarios"] if r["expected"])
    assert (bench["_exit"] == 0) == s["targets_met"], bench["_stdout"]
    assert "diagnosed right:" in bench["_stdout"]


def test_a_finding_its_own_model_declines_is_no_diagnosis():
    """data_parallel on CPU (GD601 at info, n/a here): a GD201 at info whose model expects 0.4% of the step
    ranked above it in one run of two and read "expected GD601 on top, got GD201". Such a finding is set apart."""
    v = acc.Variant(fixed=False)
    acc.read_findings(v, {"findings": [
        {"code": "GD201", "severity": "info", "gain": {"share_pct": 6.0, "expected_share_pct": 0.4}},
        {"code": "GD601", "severity": "info", "gain": {"share_pct": None}},
        {"code": "GD203", "severity": "info", "gain": {"share_pct": 4.0, "expected_share_pct": None}},  # no model
        {"code": "GD204", "severity": "warning", "gain": {"share_pct": 9.0, "expected_share_pct": 1.0}},
    ]})
    assert [f["code"] for f in v.findings] == ["GD601", "GD203", "GD204"] and v.declined == ["GD201"]


@pytest.mark.accuracy
@pytest.mark.slow
@pytest.mark.timeout(TIMEOUT_S + 300)
def test_every_sample_scripts_run_prints_one_value_per_quantity(bench):
    """Issue 42's "one value per quantity" over every sample script's runs (planted and fixed, the benchmark's
    own run directories): each renders in all five formats with one step time now, and one value for every other
    quantity printed in more than one place. The recorded H200 runs: tests/report/test_report_one_value_runs.py."""
    sys.path.insert(0, str(ROOT / "tests" / "report"))
    from one_value import conflicts, texts, values_by_quantity

    from gpudoctor.cli import load_and_analyze
    from gpudoctor.config import Config
    from gpudoctor.engine import diagnose

    checked, problems = 0, []
    for r in bench["scenarios"]:
        for variant in (r["planted"], r["fixed"]):
            if not variant or not variant.get("run_dir") or variant.get("error"):
                continue
            report = diagnose(load_and_analyze([variant["run_dir"]]), Config(), kind="profile")
            named = texts(report)
            where = {w for w, _, _ in values_by_quantity(named).get("step time (now)", [])}
            if not {"terminal", "md", "html", "json"} <= where:
                problems.append(f"{r['name']}: the step time now printed only in {sorted(where)}")
            problems += [f"{r['name']}: {c}" for c in conflicts(named)]
            checked += 1
    runnable = sum(1 for r in bench["scenarios"] if r["status"] != "needs GPU")
    assert checked >= runnable, (checked, runnable)  # at least the planted run of every runnable scenario
    assert not problems, "\n".join(problems)
