"""--verify without running anything: which findings are tried, and the verdict on measured steps."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from rule_builders import SITE, dataloader, manifest, run, settings

from gpudoctor import cli
from gpudoctor.config import Config, Thresholds
from gpudoctor.errors import UsageError
from gpudoctor.model import (
    AppliedInjection,
    Confidence,
    Finding,
    Fix,
    HostLoad,
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
OPTS = VerifyOptions(steps=30, warmup_steps=5, yes=True)  # runs built in memory: nothing on disk to trust


def _steps(n: int, wall_ms: float, jitter_pct: float, seed: int) -> list[StepRecord]:
    rng = np.random.default_rng(seed)
    walls = wall_ms * (1 + rng.uniform(-jitter_pct / 100, jitter_pct / 100, n))
    out, t = [], 0
    for i, w in enumerate(walls):
        out.append(StepRecord(index=i, start_ns=t, wall_ns=int(w * MS)))
        t += int(w * MS)
    return out


def _run(rel: str, wall_ms: float, jitter_pct: float = 3.0, seed: int = 0, applied: int = 1,
         batch: int = 32, change: Injection | None = CHANGE, load: HostLoad | None = None) -> _Run:
    s = settings(dataloaders=(dataloader(batch_size=batch),))
    if change is not None:
        s = dataclasses.replace(s, injected=(AppliedInjection(change, applied, "" if applied else "no DataLoader was built"),))
    return _Run(rel, True, _steps(OPTS.steps, wall_ms, jitter_pct, seed), s, 3.0, status="stopped", load=load)


def _arms(base_ms: float, trial_ms: float, jitter_pct: float = 3.0, trials: int = 3, run_spread_pct: float = 0.0,
          **kw) -> tuple[_Arm, _Arm]:
    """Baseline and fix runs; ``run_spread_pct``: each run's own level drawn ± that much (a run slowed or
    sped up as a whole, the way another job on the machine does it)."""
    rng = np.random.default_rng(99)

    def level() -> float:
        return 1 + rng.uniform(-run_spread_pct / 100, run_spread_pct / 100)

    base_kw = {k: v for k, v in kw.items() if k == "load_base"}
    kw = {k: v for k, v in kw.items() if k != "load_base"}
    base = _Arm("baseline", (), runs=[_run(f"verify/baseline/{i}", base_ms * level(), jitter_pct, seed=i, change=None,
                                           load=base_kw.get("load_base")) for i in range(trials)])
    arm = _Arm("GD201", (CHANGE,), runs=[_run(f"verify/GD201/{i}", trial_ms * level(), jitter_pct, seed=10 + i, **kw)
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


def test_runs_that_differ_widely_are_inconclusive() -> None:
    # steps within each run are steady (3%); the runs themselves differ by ±15%: the run is the unit
    base, arm = _arms(21.0, 20.0, jitter_pct=3.0, run_spread_pct=15.0)
    v = judge(arm, base, Thresholds(), OPTS)
    assert v.status == VerifyStatus.INCONCLUSIVE and "cannot tell" in v.reason
    # pooled as independent steps, the same 150 steps would look precise
    from gpudoctor.analysis.stats import speedup_stats

    pooled = speedup_stats([s.wall_ns for r in base.runs for s in r.steps[5:]],
                           [s.wall_ns for r in arm.runs for s in r.steps[5:]])
    assert pooled.ci_high - pooled.ci_low < (v.ci[1] - v.ci[0]) / 2


def test_one_run_a_side_shows_no_spread() -> None:
    base, arm = _arms(30.0, 20.0, trials=1)
    one = dataclasses.replace(OPTS, trials=1)
    v = judge(arm, base, Thresholds(), one)
    assert v.status == VerifyStatus.INCONCLUSIVE and "one run a side" in v.reason and "--verify-trials 2" in v.reason
    assert v.speedup == pytest.approx(1.5, rel=0.03) and v.ci is None


def test_one_run_a_side_when_more_were_asked_never_advises_what_was_given() -> None:
    """`--verify-trials 2` with a budget that held one round advised "give --verify-trials 2 or more": it says
    why the second round did not run, and what budget would hold it."""
    base, arm = _arms(30.0, 20.0, trials=1)
    two = dataclasses.replace(OPTS, trials=2, budget_s=120.0)
    note = ("the --verify-budget of 120 s held 1 round of the 2 asked (round 2 needed about 57 s, 50 s were left): "
            "give --verify-budget 130 or more")
    v = judge(arm, base, Thresholds(), two, short=note)
    assert v.status == VerifyStatus.INCONCLUSIVE and "one run a side" in v.reason
    assert "--verify-trials" not in v.reason and note in v.reason
    v = judge(arm, base, Thresholds(), two)  # fewer rounds than asked for another reason (interrupted, say)
    assert "--verify-trials" not in v.reason and "1 run a side of the 2 rounds asked" in v.reason


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
    assert v.speedup == pytest.approx(1.5, rel=0.03) and "time per sample" in v.reason
    assert v.baseline_step_ns == pytest.approx(30 * MS / 32, rel=0.02)
    trial = [r for r in v.per_run if r.arm == "trial"]
    assert all(r.step_ns == pytest.approx(40 * MS / 64, rel=0.02) for r in trial)


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
    assert v.speedup == pytest.approx(104 / 50, rel=0.05) and v.p_value is not None
    assert "epoch starts included" in v.reason
    assert v.steps_baseline == 3 * 25  # epoch starts kept
    # the steady steps leave the epoch starts out, and see nothing
    steady = judge(dataclasses.replace(arm, statistic="throughput"), base, Thresholds(), OPTS)
    assert steady.status != VerifyStatus.CONFIRMED


def test_a_slow_patch_in_one_run_is_never_a_wrong_verdict() -> None:
    # one fix run whose last 10 steps were slowed tenfold by another process on the machine: that run's
    # time per step is 4x the others'; three runs a side cannot tell it from the fix
    base = _Arm("baseline", (), runs=[_epochs(f"verify/baseline/{i}", 500.0, i) for i in range(3)])
    runs = [_epochs(f"verify/GD202/{i}", 50.0, 10 + i) for i in range(3)]
    runs[2].steps = [dataclasses.replace(s, wall_ns=s.wall_ns * 10) if s.index >= 20 else s for s in runs[2].steps]
    arm = _Arm("GD202", (CHANGE,), runs=runs, statistic="epoch")
    v = judge(arm, base, Thresholds(), OPTS)
    assert v.status == VerifyStatus.INCONCLUSIVE and "cannot tell" in v.reason
    slow = [r for r in v.per_run if r.run == "verify/GD202/2"]
    assert slow[0].step_ns > 4 * min(r.step_ns for r in v.per_run if r.arm == "trial")


def test_by_epoch_without_an_epoch_start_is_inconclusive() -> None:
    base = _Arm("baseline", (), runs=[_epochs("verify/baseline/1", 500.0, 1, per_epoch=100)])
    arm = _Arm("GD202", (CHANGE,), runs=[_epochs("verify/GD202/1", 50.0, 2, per_epoch=100)], statistic="epoch")
    v = judge(arm, base, Thresholds(), OPTS)
    assert v.status == VerifyStatus.INCONCLUSIVE and "no run started one" in v.reason


def test_the_speed_up_is_of_the_runs_times_per_step() -> None:
    """Each run's figure is its judged steps' total ÷ count; the verdict is the runs' statistic."""
    from gpudoctor.analysis.stats import run_speedup_stats

    base, arm = _arms(30.0, 27.0, jitter_pct=8.0, run_spread_pct=2.0)
    v = judge(arm, base, Thresholds(), OPTS)
    # to the whole µs, as the profiled run's step time (model.steady.times_figures computes both)
    per = ([round(sum(s.wall_ns for s in r.steps[5:]) / 25 / 1000) * 1000 for r in base.runs],
           [round(sum(s.wall_ns for s in r.steps[5:]) / 25 / 1000) * 1000 for r in arm.runs])
    st = run_speedup_stats(*per)
    assert v.speedup == pytest.approx(st.speedup, abs=1e-4) and v.p_value == st.p_value
    assert v.ci == (round(st.ci_low, 4), round(st.ci_high, 4))
    assert [r.step_ns for r in v.per_run if r.arm == "baseline"] == [int(x) for x in per[0]]
    assert [r.arm for r in v.per_run] == ["baseline", "trial"] * 3 or len(v.per_run) == 6
    assert v.test.startswith("Welch") and v.median_speedup is not None
    assert "per run: baseline" in v.reason and "median step" in v.reason


# --------------------------------------------------------------------------- the cases of issue 25


def _levels(rel: str, per_run_ms: list[float], change: Injection | None) -> list[_Run]:
    return [_run(f"{rel}/{i}", ms, jitter_pct=2.0, seed=i, change=change) for i, ms in enumerate(per_run_ms)]


def test_the_flipping_collate_stall_is_inconclusive() -> None:
    """Issue 25: per-run medians baseline 23.1, 55.9, 22.3 ms, fix 28, 28, 20.6 ms. Pooled as 75 steps a
    side this was once "refuted 1.65× slower", once "confirmed 1.14×"; the runs cannot tell."""
    base = _Arm("baseline", (), runs=_levels("verify/baseline", [23.1, 55.9, 22.3], None))
    arm = _Arm("GD201", (CHANGE,), runs=_levels("verify/GD201", [28.0, 28.0, 20.6], CHANGE))
    v = judge(arm, base, Thresholds(), OPTS)
    assert v.status == VerifyStatus.INCONCLUSIVE and "cannot tell" in v.reason
    assert v.ci is not None and v.ci[0] < 1.0 < 1.05 < v.ci[1]
    assert "per run: baseline 23" in v.reason and ", 55.9, 22" in v.reason  # per-run figures beside the pooled


def _tail(rel: str, seed: int, tail_ms: float, change: Injection | None, every: int = 10) -> _Run:
    """10 ms steps; 3 in every ``every`` wait ``tail_ms`` more (a batch read from storage)."""
    r = _run(rel, 10.0, jitter_pct=2.0, seed=seed, change=change)
    r.steps = [dataclasses.replace(s, wall_ns=s.wall_ns + int(tail_ms * MS)) if s.index % every in (2, 5, 8) else s
               for s in r.steps]
    return r


def test_a_fix_that_shortens_the_tail_but_not_the_median_is_confirmed() -> None:
    base = _Arm("baseline", (), runs=[_tail(f"verify/baseline/{i}", i, 50.0, None) for i in range(3)])
    arm = _Arm("GD201", (CHANGE,), runs=[_tail(f"verify/GD201/{i}", 10 + i, 0.0, CHANGE) for i in range(3)])
    v = judge(arm, base, Thresholds(), OPTS)
    assert v.status == VerifyStatus.CONFIRMED, v.reason
    assert v.speedup > 2.0  # 25 ms against 10 ms a step
    assert v.median_speedup == pytest.approx(1.0, abs=0.05)  # the median never saw it


def test_a_fix_that_keeps_total_time_is_not_called_slower_for_its_median() -> None:
    """Issue 25: one worker left total time unchanged while the median step rose 2.5× (0.40×)."""
    base = _Arm("baseline", (), runs=[_tail(f"verify/baseline/{i}", i, 50.0, None) for i in range(3)])
    # 8 of the 25 judged steps wait 50 ms: 26 ms a step, the fix's every step 26 ms
    even = [_run(f"verify/GD201/{i}", 26.0, jitter_pct=2.0, seed=10 + i) for i in range(3)]
    v = judge(_Arm("GD201", (CHANGE,), runs=even), base, Thresholds(), OPTS)
    assert v.median_speedup < 0.5  # what the median said
    assert v.speedup == pytest.approx(1.0, abs=0.03) and "slower" not in v.reason
    assert v.status in (VerifyStatus.REFUTED, VerifyStatus.INCONCLUSIVE)
    if v.status == VerifyStatus.REFUTED:
        assert "no gain worth the fix" in v.reason


def _load(others_pct: float, wait_pct: float = 2.0) -> HostLoad:
    return HostLoad(samples=5, cores=2, training_cpu_pct=95.0, runq_wait_pct=wait_pct, system_cpu_pct=95.0 + others_pct,
                    others_cpu_pct=others_pct, steal_pct=0.0, procs_running=2.0)


def test_a_load_out_of_family_between_the_sides_is_inconclusive() -> None:
    # the fix runs ran beside a CPU hog, the baseline runs did not
    base, arm = _arms(30.0, 20.0, load=_load(100.0), load_base=_load(5.0))
    v = judge(arm, base, Thresholds(), OPTS)
    assert v.status == VerifyStatus.INCONCLUSIVE
    assert "not a fair comparison" in v.reason and "busier during the fix runs" in v.reason
    assert "would be confirmed" in v.reason and v.load_reason
    assert v.load_trial.others_cpu_pct == 100.0 and v.load_baseline.others_cpu_pct == 5.0
    # the same load on both sides: judged on the figures, and the report says how busy the machine was
    base, arm = _arms(30.0, 20.0, load=_load(100.0, 40.0), load_base=_load(90.0, 40.0))
    v = judge(arm, base, Thresholds(), OPTS)
    assert v.status == VerifyStatus.CONFIRMED and not v.load_reason
    assert "other processes used 0.95 of 2 cores" in v.reason and "waited for a core 40% of the time" in v.reason


def test_trials_far_slower_than_the_profiled_run_are_inconclusive() -> None:
    base, arm = _arms(30.0, 20.0)
    v = judge(arm, base, Thresholds(), OPTS, profiled_ns=3 * MS)  # the profiled run's steps took 3 ms
    assert v.status == VerifyStatus.INCONCLUSIVE and "10.0× slower in the trials than in the profiled run" in v.reason
    assert v.profiled_step_ns == 3 * MS
    assert judge(arm, base, Thresholds(), OPTS, profiled_ns=25 * MS).status == VerifyStatus.CONFIRMED


def test_looks_share_the_error_rate() -> None:
    base, arm = _arms(30.0, 20.0)
    one = judge(arm, base, Thresholds(), OPTS)
    two = judge(arm, base, Thresholds(), OPTS, looks=1, max_looks=2)
    assert one.look_confidence_pct == 95.0 and two.look_confidence_pct == 97.5
    assert two.confidence_pct == 95.0 and "look 1 of 2 at 97.5%" in two.reason
    assert two.ci[0] < one.ci[0] and two.ci[1] > one.ci[1]  # each look's interval is wider


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
