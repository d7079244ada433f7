"""--verify without running anything: which findings are tried, and the verdict on measured steps."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from rule_builders import SITE, dataloader, manifest, run, settings

from gpudoctor import cli
from gpudoctor.analysis.compare import compare_runs
from gpudoctor.config import Config, Thresholds
from gpudoctor.errors import UsageError
from gpudoctor.model import (
    AppliedInjection,
    Confidence,
    Finding,
    Fix,
    Injection,
    Location,
    Report,
    RunData,
    Severity,
    StepRecord,
    VerifyStatus,
)
from gpudoctor.rules import INTERNAL_ERROR_CODE, INTERNAL_ERROR_NAME
from gpudoctor.verify import (
    DEFAULT_BUDGET_S,
    DEFAULT_STEPS,
    DEFAULT_TRIALS,
    VerifyOptions,
    _Arm,
    _Run,
    judge,
    plan,
    verify_report,
)

MS = 1_000_000
CHANGE = Injection("dataloader", "num_workers", 1, SITE, text="DataLoader num_workers=1 at train.py:31")
OPTS = VerifyOptions(steps=30, warmup_steps=5)


def _steps(n: int, wall_ms: float, jitter_pct: float, seed: int) -> list[StepRecord]:
    rng = np.random.default_rng(seed)
    walls = wall_ms * (1 + rng.uniform(-jitter_pct / 100, jitter_pct / 100, n))
    out, t = [], 0
    for i, w in enumerate(walls):
        out.append(StepRecord(index=i, start_ns=t, wall_ns=int(w * MS)))
        t += int(w * MS)
    return out


def _run(rel: str, wall_ms: float, jitter_pct: float = 3.0, seed: int = 0, applied: int = 1,
         batch: int = 32, change: Injection | None = CHANGE) -> _Run:
    s = settings(dataloaders=(dataloader(batch_size=batch),))
    if change is not None:
        s = dataclasses.replace(s, injected=(AppliedInjection(change, applied, "" if applied else "no DataLoader was built"),))
    return _Run(rel, True, _steps(OPTS.steps, wall_ms, jitter_pct, seed), s, 3.0, status="stopped")


def _arms(base_ms: float, trial_ms: float, jitter_pct: float = 3.0, trials: int = 3, **kw) -> tuple[_Arm, _Arm]:
    base = _Arm("baseline", (), runs=[_run(f"verify/baseline/{i}", base_ms, jitter_pct, seed=i, change=None)
                                       for i in range(trials)])
    arm = _Arm("GD201", (CHANGE,), runs=[_run(f"verify/GD201/{i}", trial_ms, jitter_pct, seed=10 + i, **kw)
                                         for i in range(trials)])
    return base, arm


def test_a_clear_speed_up_is_confirmed() -> None:
    base, arm = _arms(30.0, 20.0)
    v = judge(arm, base, Thresholds(), OPTS)
    assert v.status == VerifyStatus.CONFIRMED
    assert v.speedup == pytest.approx(1.5, rel=0.03)
    assert v.ci is not None and v.ci[0] > 1.4 and v.ci[0] <= v.speedup <= v.ci[1]
    assert v.trials == 3 and v.baseline_runs == 3 and v.steps == 30
    assert v.steps_baseline == v.steps_trial == 3 * (30 - 5)  # warm-up left out of each run
    assert v.changes == (CHANGE,) and v.runs == ("verify/GD201/0", "verify/GD201/1", "verify/GD201/2")
    assert "1.50× faster with the fix" in v.reason and "95% CI" in v.reason


def test_a_slower_fix_is_refuted() -> None:
    base, arm = _arms(20.0, 25.0)
    v = judge(arm, base, Thresholds(), OPTS)
    assert v.status == VerifyStatus.REFUTED and "slower with the fix" in v.reason
    assert v.ci is not None and v.ci[1] < 1.0


def test_a_gain_under_the_minimum_effect_is_refuted() -> None:
    base, arm = _arms(20.4, 20.0, jitter_pct=0.5)  # 1.02×, measured precisely
    v = judge(arm, base, Thresholds(), OPTS)
    assert v.ci is not None and v.ci[0] > 1.0  # faster beyond noise, but not by enough
    assert v.status == VerifyStatus.REFUTED and "under the 1.05×" in v.reason


def test_noise_that_reaches_both_sides_of_the_minimum_is_inconclusive() -> None:
    base, arm = _arms(21.0, 20.0, jitter_pct=40.0, trials=1)
    v = judge(arm, base, Thresholds(), OPTS)
    assert v.status == VerifyStatus.INCONCLUSIVE and "cannot tell" in v.reason


def test_the_minimum_effect_is_a_threshold() -> None:
    base, arm = _arms(30.0, 20.0)
    v = judge(arm, base, dataclasses.replace(Thresholds(), verify_min_speedup_ratio=2.0), OPTS)
    assert v.status == VerifyStatus.REFUTED and v.min_speedup == 2.0


def test_a_crashing_fix_run_is_inconclusive_with_its_error() -> None:
    base, arm = _arms(30.0, 20.0)
    arm.runs[1] = _Run("verify/GD201/1", False, [], None, 1.0,
                       error="verify/GD201/1: failed: RuntimeError: boom at train.py:9", status="failed")
    v = judge(arm, base, Thresholds(), OPTS)
    assert v.status == VerifyStatus.INCONCLUSIVE and "RuntimeError: boom" in v.reason
    assert v.errors == ("verify/GD201/1: failed: RuntimeError: boom at train.py:9",)


def test_a_change_that_never_took_effect_is_inconclusive() -> None:
    base, arm = _arms(30.0, 30.0, applied=0)
    v = judge(arm, base, Thresholds(), OPTS)
    assert v.status == VerifyStatus.INCONCLUSIVE
    assert "never took effect" in v.reason and "no DataLoader was built" in v.reason


def test_too_few_steps_are_inconclusive() -> None:
    base, arm = _arms(30.0, 20.0, trials=1)
    short = VerifyOptions(steps=30, warmup_steps=27)
    v = judge(arm, base, Thresholds(), short)
    assert v.status == VerifyStatus.INCONCLUSIVE and "too few steady steps" in v.reason


def test_times_are_per_sample_when_the_batch_size_differs() -> None:
    base, arm = _arms(30.0, 40.0, batch=64)  # twice the batch in 4/3 of the time
    v = judge(arm, base, Thresholds(), OPTS)
    assert v.per_sample and v.status == VerifyStatus.CONFIRMED
    assert v.speedup == pytest.approx(1.5, rel=0.03) and "median time per sample" in v.reason


def _epochs(rel: str, restart_ms: float, seed: int, per_epoch: int = 8) -> _Run:
    """30 steps of 50 ms in epochs of ``per_epoch`` steps; each epoch's first step lasts ``restart_ms``."""
    steps = [dataclasses.replace(s, epoch=s.index // per_epoch,
                                 wall_ns=int(restart_ms * MS) if s.index % per_epoch == 0 else s.wall_ns)
             for s in _steps(30, 50.0, 3.0, seed)]
    r = _run(rel, 50.0, seed=seed)
    return dataclasses.replace(r, steps=steps)


def test_a_gain_at_epoch_starts_is_judged_by_epoch() -> None:
    # worker restarts: 500 ms at each epoch's first step; the fix (persistent workers) pays it once
    base = _Arm("baseline", (), runs=[_epochs(f"verify/baseline/{i}", 500.0, i) for i in range(3)])
    arm = _Arm("GD202", (CHANGE,), runs=[_epochs(f"verify/GD202/{i}", 50.0, 10 + i) for i in range(3)],
               statistic="epoch")
    v = judge(arm, base, Thresholds(), OPTS)
    assert v.statistic == "epoch" and v.status == VerifyStatus.CONFIRMED, v.reason
    # 3 epoch starts in the 25 steps after the warm-up: (3 x 500 + 22 x 50) / 25 = 104 ms against 50 ms
    assert v.speedup == pytest.approx(104 / 50, rel=0.05) and v.p_value is None
    assert "by epoch" in v.reason and "no rank test" in v.reason
    assert v.steps_baseline == 3 * 25  # epoch starts kept
    # the same steps judged on medians see nothing: the epoch starts are left out
    median = judge(dataclasses.replace(arm, statistic="median"), base, Thresholds(), OPTS)
    assert median.status != VerifyStatus.CONFIRMED


def test_by_epoch_a_slow_patch_of_unrelated_steps_does_not_decide() -> None:
    # one fix run whose last 10 steps were slowed tenfold by another process on the machine
    base = _Arm("baseline", (), runs=[_epochs(f"verify/baseline/{i}", 500.0, i) for i in range(3)])
    runs = [_epochs(f"verify/GD202/{i}", 50.0, 10 + i) for i in range(3)]
    runs[2].steps = [dataclasses.replace(s, wall_ns=s.wall_ns * 10) if s.index >= 20 else s for s in runs[2].steps]
    arm = _Arm("GD202", (CHANGE,), runs=runs, statistic="epoch")
    assert judge(arm, base, Thresholds(), OPTS).status == VerifyStatus.CONFIRMED


def test_by_epoch_without_an_epoch_start_is_inconclusive() -> None:
    base = _Arm("baseline", (), runs=[_epochs("verify/baseline/1", 500.0, 1, per_epoch=100)])
    arm = _Arm("GD202", (CHANGE,), runs=[_epochs("verify/GD202/1", 50.0, 2, per_epoch=100)], statistic="epoch")
    v = judge(arm, base, Thresholds(), OPTS)
    assert v.status == VerifyStatus.INCONCLUSIVE and "no run started one" in v.reason


def test_verify_and_compare_agree_on_the_same_steps() -> None:
    """One statistics module (analysis.stats): the same steps give the same speed-up, interval and p."""
    base, arm = _arms(30.0, 27.0, jitter_pct=8.0, trials=1)
    opts = VerifyOptions(steps=30, warmup_steps=0)
    v = judge(arm, base, Thresholds(), opts)
    a = RunData(source="a", steps=tuple(base.runs[0].steps))
    b = RunData(source="b", steps=tuple(arm.runs[0].steps))
    empty = Report(schema_version=1, gpudoctor_version="0", kind="analyze", source="x", created_at="")
    st = compare_runs(a, b, empty, empty).step_time
    assert st.basis == "plain_steps"
    assert (st.speedup, st.ci_low, st.ci_high, st.p_value) == (v.speedup, *v.ci, v.p_value)


# --------------------------------------------------------------------------- which findings are tried


def _finding(code: str, name: str, location: Location | None = None, metrics=()) -> Finding:
    from gpudoctor.model import Evidence

    return Finding(code, name, Severity.WARNING, Confidence.MEASURED, "m", Fix("f"),
                   evidence=Evidence(metrics=tuple(metrics)), location=location)


def _report(data: RunData, *findings: Finding) -> Report:
    return Report(schema_version=1, gpudoctor_version="0", kind="profile", source=data.source, created_at="",
                  findings=findings, run=data)


def test_plan_groups_identical_changes_and_says_why_others_are_not_tried() -> None:
    from gpudoctor.model import Metric

    loc = Location("train.py", 31, None, "main")
    data = run(manifest=manifest(), settings=settings(device_type="cuda"))
    rep = _report(
        data,
        _finding("GD201", "dataloader-stall", loc, (Metric("suggested_num_workers", 4, "count"),)),
        _finding("GD301", "pageable-h2d", loc),
        _finding("GD302", "blocking-copy", loc),
        _finding("GD401", "no-amp"),
        _finding(INTERNAL_ERROR_CODE, INTERNAL_ERROR_NAME),
    )
    arms, not_tried = plan(rep)
    assert [a.label for a in arms] == ["GD201", "GD301+GD302"]
    assert arms[1].findings == [1, 2]
    assert {c.kind for c in arms[1].changes} == {"dataloader", "non_blocking"}
    assert {(c.key, c.value) for c in arms[0].changes} >= {("num_workers", 4), ("persistent_workers", True),
                                                             ("pin_memory", True)}
    assert "changes numerics" in not_tried[3]
    assert "crashed" in not_tried[4]


def test_distributed_runs_are_not_tried() -> None:
    data = run(manifest=manifest(launcher="torchrun", world_size=2), settings=settings())
    rep = _report(data, _finding("GD403", "cudnn-benchmark-off"))
    arms, not_tried = plan(rep)
    assert arms == [] and "distributed" in not_tried[0]
    out = verify_report(rep, Config(), OPTS)
    assert out.report.findings[0].verification.status == VerifyStatus.NOT_TRIED
    assert out.runs == 0


def test_a_trace_without_a_run_directory_is_not_tried() -> None:
    rep = _report(RunData(source="t.pt.trace.json.gz"), _finding("GD403", "cudnn-benchmark-off"))
    assert "no run directory" in plan(rep)[1][0]


def test_options_are_checked() -> None:
    with pytest.raises(UsageError, match="give at least 10"):
        VerifyOptions(steps=9).check()
    VerifyOptions(steps=10).check()
    with pytest.raises(UsageError, match="--verify-trials"):
        VerifyOptions(trials=0).check()
    with pytest.raises(UsageError, match="--verify-budget"):
        VerifyOptions(budget_s=0).check()


def test_the_verify_confidence_is_the_statistics_one() -> None:
    from gpudoctor import verify
    from gpudoctor.analysis import stats

    assert verify.CONFIDENCE_PCT == stats.CONFIDENCE_PCT


def test_the_cli_defaults_are_verify_defaults() -> None:
    assert (cli.DEFAULT_STEPS, cli.DEFAULT_TRIALS, cli.DEFAULT_BUDGET_S) == (DEFAULT_STEPS, DEFAULT_TRIALS, DEFAULT_BUDGET_S)
