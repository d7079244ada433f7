"""compare_runs on hand-built pairs: step time and noise, windows, figures, findings, settings, warnings."""

from __future__ import annotations

import dataclasses

import pytest
from compare_builders import (
    MS,
    SITE,
    finding,
    gpu_trace,
    loader,
    not_measurable,
    replace,
    report,
    run,
    settings,
    step_records,
)

from gpudoctor.analysis.compare import compare_runs
from gpudoctor.model import (
    AutocastUse,
    CallSite,
    Comparison,
    FindingStatus,
    FlagSetting,
    OptimizerSetting,
    Severity,
    StepTimeVerdict,
    WrapSetting,
)

FIXED_AT = "2026-01-02T00:00:00+00:00"


def cmp(a, b, ra=None, rb=None, **kw) -> Comparison:
    return compare_runs(a, b, ra, rb, created_at=FIXED_AT, **kw)


# --------------------------------------------------------------------------- step time and noise


def test_faster_run_is_called_faster_with_its_speedup() -> None:
    c = cmp(run(wall_ms=100, seed=1), run(source="runs/b", wall_ms=50, seed=2))
    st = c.step_time
    assert st.verdict == StepTimeVerdict.FASTER
    assert st.basis == "plain_steps"
    assert st.a.count == st.b.count == 39  # the first step is left out
    assert st.a.median_ns == pytest.approx(100 * MS, rel=0.03)
    assert st.b.median_ns == pytest.approx(50 * MS, rel=0.03)
    assert st.speedup == pytest.approx(st.a.median_ns / st.b.median_ns, rel=1e-3)
    assert st.ci_low < st.speedup < st.ci_high
    assert 1.8 < st.ci_low and st.ci_high < 2.2
    assert st.p_value < 1e-6
    assert st.change_pct == pytest.approx(-50, abs=3)
    assert c.headline.startswith("B is 2.0")
    assert "faster" in c.headline


def test_slower_run_is_called_slower() -> None:
    c = cmp(run(wall_ms=100), run(source="runs/b", wall_ms=130, seed=3))
    assert c.step_time.verdict == StepTimeVerdict.SLOWER
    assert c.step_time.change_pct == pytest.approx(30, abs=4)
    assert "slower" in c.step_time.verdict_text
    assert "1.3" in c.step_time.verdict_text


def test_same_distribution_is_within_noise() -> None:
    c = cmp(run(wall_ms=100, jitter_pct=10, seed=11), run(source="runs/b", wall_ms=100, jitter_pct=10, seed=12))
    st = c.step_time
    assert st.verdict == StepTimeVerdict.WITHIN_NOISE
    assert st.ci_low < 1.0 < st.ci_high
    assert "Within noise" in st.verdict_text


def test_a_detectable_change_under_the_run_to_run_margin_is_not_called_faster() -> None:
    # 1% faster with 0.2% jitter: the test sees it, but two runs commonly differ by that much
    c = cmp(run(wall_ms=100, jitter_pct=0.2, seed=1), run(source="runs/b", wall_ms=99, jitter_pct=0.2, seed=2))
    st = c.step_time
    assert st.p_value < 0.001
    assert st.verdict == StepTimeVerdict.WITHIN_NOISE
    assert "No meaningful change" in st.verdict_text
    # with a smaller margin it is a real speed-up
    c2 = cmp(run(wall_ms=100, jitter_pct=0.2, seed=1), run(source="runs/b", wall_ms=99, jitter_pct=0.2, seed=2),
             min_change_pct=0.5)
    assert c2.step_time.verdict == StepTimeVerdict.FASTER


def test_too_few_steps_to_tell() -> None:
    c = cmp(run(n=4, wall_ms=100), run(source="runs/b", n=40, wall_ms=50))
    st = c.step_time
    assert st.verdict == StepTimeVerdict.TOO_FEW_STEPS
    assert st.a.count == 3
    assert "Too few steps to tell" in st.verdict_text
    assert st.speedup == pytest.approx(2.0, rel=0.05)  # still shown


@pytest.mark.parametrize("n_a", [2, 1])
def test_a_side_of_one_steady_step_or_none_is_too_few_not_a_crash(n_a: int) -> None:
    """A side of one steady step (two steps, the first left out) gave exit 4: scipy's bootstrap needs two
    or more observations. The documented answer: too few steps to tell."""
    c = cmp(run(n=n_a, wall_ms=100), run(source="runs/b", n=40, wall_ms=50))
    st = c.step_time
    assert st.verdict in (StepTimeVerdict.TOO_FEW_STEPS, StepTimeVerdict.NOT_MEASURED)
    assert st.ci_low is None and st.ci_high is None


def test_profiled_steps_are_left_out_when_enough_plain_steps_remain() -> None:
    # steps 5..14 under the profiler are 3x slower in A only: they must not decide the comparison
    windows = {i: "active" for i in range(5, 15)}
    a_steps = tuple(
        replace(s, wall_ns=s.wall_ns * 3) if s.window else s
        for s in step_records(40, 100, windows=windows, seed=1)
    )
    c = cmp(run(steps=a_steps), run(source="runs/b", wall_ms=100, seed=2, windows=windows))
    st = c.step_time
    assert st.basis == "plain_steps"
    # 39 steady steps less the 10 profiled ones and step 15, which pays for the window's end: the unprofiled ones
    assert st.a.count == 28
    assert st.verdict == StepTimeVerdict.WITHIN_NOISE
    assert "unprofiled steady steps" in st.a.window


def test_the_headline_names_the_steps_its_figures_are_of() -> None:
    """compare said 1.14× where the runs' own summaries (the median of every steady step) gave 1.20×, and
    did not say its figures were of the steps outside the profiler windows: the headline says so."""
    windows = {i: "active" for i in range(5, 15)}
    a_steps = tuple(
        replace(s, wall_ns=s.wall_ns * 3) if s.window else s
        for s in step_records(40, 100, windows=windows, seed=1)
    )
    c = cmp(run(steps=a_steps), run(source="runs/b", wall_ms=50, seed=2, windows=windows))
    assert c.step_time.verdict == StepTimeVerdict.FASTER
    assert "(of the 28 and 28 unprofiled steady steps" in c.headline
    few = {i: ("active" if i < 10 else "cprofile") for i in range(2, 40)}
    c = cmp(run(windows=few), run(source="runs/b", wall_ms=50, windows=few))
    assert "(of the 39 and 39 steady steps, profiled ones included" in c.headline


def test_instrumented_steps_are_used_with_a_note_when_too_few_plain_ones() -> None:
    windows = {i: ("active" if i < 10 else "cprofile") for i in range(2, 40)}
    c = cmp(run(windows=windows), run(source="runs/b", wall_ms=50, windows=windows))
    assert c.step_time.basis == "steady_steps"
    assert c.step_time.a.count == 39
    assert any("too few steps outside the profiler windows" in n for n in c.notes)


def test_first_step_of_each_epoch_is_left_out() -> None:
    recs = tuple(replace(s, epoch=s.index // 10, wall_ns=(900 * MS if s.index % 10 == 0 else s.wall_ns))
                 for s in step_records(40, 100, first_ms=None))
    c = cmp(run(steps=recs), run(source="runs/b", steps=recs))
    assert c.step_time.a.count == 36
    assert c.step_time.a.max_ns < 200 * MS


def test_bare_traces_are_compared_on_their_profiler_steps() -> None:
    ta = gpu_trace(step_times_ms=[100, 102, 98, 101, 99, 100, 103, 97])
    tb = gpu_trace(step_times_ms=[50, 51, 49, 50, 52, 48, 50, 51])
    c = cmp(run(no_manifest=True, metrics=(ta,)), run(source="b.json", no_manifest=True, metrics=(tb,)))
    st = c.step_time
    assert st.basis == "profiler_steps"
    assert st.a.count == 8
    assert st.verdict == StepTimeVerdict.FASTER
    assert "ProfilerStep windows (#10..#17)" in st.a.window
    assert c.a.kind == "trace"
    assert "bare trace" in c.settings_note


def test_run_against_bare_trace_uses_profiler_steps_on_both_sides_and_says_so() -> None:
    ta = gpu_trace(step_times_ms=[100] * 6)
    tb = gpu_trace(step_times_ms=[50] * 6)
    c = cmp(run(metrics=(ta,)), run(source="b.json", no_manifest=True, metrics=(tb,)))
    assert c.step_time.basis == "profiler_steps"
    assert any("only A has per-step records" in n for n in c.notes)


def test_no_step_times_is_not_measured_and_has_no_change() -> None:
    t = replace(gpu_trace(), steps=())
    c = cmp(run(no_manifest=True, metrics=(t,)), run(source="b", no_manifest=True, metrics=(t,)))
    assert c.step_time.verdict == StepTimeVerdict.NOT_MEASURED
    assert c.step_time.change_pct is None
    assert "no step times on side A and B" in c.step_time.verdict_text


def test_batch_size_change_compares_time_per_sample() -> None:
    a = run(wall_ms=100, settings_kw={"dataloaders": (loader(batch_size=32),)})
    b = run(source="runs/b", wall_ms=150, seed=2, settings_kw={"dataloaders": (loader(batch_size=64),)})
    c = cmp(a, b)
    st = c.step_time
    assert st.per_sample
    # 100 ms / 32 samples vs 150 ms / 64 samples: 1.33x faster per sample, though the step is slower
    assert st.speedup == pytest.approx((100 / 32) / (150 / 64), rel=0.05)
    assert st.verdict == StepTimeVerdict.FASTER
    assert "per sample" in st.basis_text
    assert any("batch size changed (32 → 64)" in w for w in c.warnings)
    tp = next(m for m in c.metrics if m.key == "throughput")
    assert tp.b / tp.a == pytest.approx(st.speedup, rel=0.01)
    assert tp.improved is True


def test_multi_rank_runs_are_compared_on_the_lowest_common_rank() -> None:
    a_steps = step_records(20, 100, rank=0, seed=1) + step_records(20, 300, rank=1, seed=2)
    b_steps = step_records(20, 50, rank=0, seed=3) + step_records(20, 300, rank=1, seed=4)
    c = cmp(run(steps=a_steps), run(source="runs/b", steps=b_steps))
    assert c.step_time.a.median_ns == pytest.approx(100 * MS, rel=0.03)
    assert c.step_time.b.median_ns == pytest.approx(50 * MS, rel=0.03)
    assert any("rank 0 on both sides" in n for n in c.notes)


# --------------------------------------------------------------------------- figures and breakdown


def test_data_wait_share_is_of_the_same_steps_as_the_step_time() -> None:
    c = cmp(run(wall_ms=100, wait_ms=40), run(source="runs/b", wall_ms=60, wait_ms=1))
    m = next(m for m in c.metrics if m.key == "data_wait_share")
    assert m.a == pytest.approx(40, abs=1.5)
    assert m.b == pytest.approx(100 / 60, abs=0.2)
    assert m.delta == pytest.approx(m.b - m.a, abs=1e-3)
    assert m.delta_unit == "pp"
    assert m.improved is True
    assert m.window_a == c.step_time.a.window


def test_gpu_idle_over_profiler_steps_on_both_sides() -> None:
    c = cmp(run(metrics=(gpu_trace(idle_steps_pct=40),)), run(source="runs/b", metrics=(gpu_trace(idle_steps_pct=10),)))
    m = next(m for m in c.metrics if m.key == "gpu_idle")
    assert (m.a, m.b, m.delta) == (40, 10, -30)
    assert "ProfilerStep" in m.label
    assert m.window_a == m.window_b == "5 ProfilerStep windows (#10..#14)"
    assert m.note == ""


def test_gpu_idle_falls_back_to_the_span_on_both_sides_when_one_has_no_steps() -> None:
    a = gpu_trace(idle_steps_pct=40, idle_span_pct=35)
    b = gpu_trace(idle_steps_pct=None, idle_span_pct=12)
    c = cmp(run(metrics=(a,)), run(source="runs/b", metrics=(b,)))
    m = next(m for m in c.metrics if m.key == "gpu_idle")
    assert (m.a, m.b) == (35, 12)  # span on both sides, never steps against span
    assert "side B has no ProfilerStep markers" in m.note


def test_gpu_idle_says_when_the_step_windows_differ() -> None:
    a = gpu_trace(idle_steps_pct=40)
    b = gpu_trace(idle_steps_pct=20, first_step=20, n_steps=3)
    c = cmp(run(metrics=(a,)), run(source="runs/b", metrics=(b,)))
    m = next(m for m in c.metrics if m.key == "gpu_idle")
    assert (m.a, m.b) == (40, 20)
    assert m.window_a == "5 ProfilerStep windows (#10..#14)"
    assert m.window_b == "3 ProfilerStep windows (#20..#22)"
    assert "profiled different steps" in m.note
    assert c.breakdown.window_b == "3 ProfilerStep windows (#20..#22)"


def test_no_gpu_in_either_run_leaves_gpu_idle_out_with_a_note() -> None:
    c = cmp(run(), run(source="runs/b"))
    assert not any(m.key == "gpu_idle" for m in c.metrics)
    assert any("GPU idle not compared" in n for n in c.notes)


def test_breakdown_side_by_side_with_deltas() -> None:
    a = gpu_trace(parts_ms={"gpu_compute": 60, "data_loading": 30, "other_cpu": 5, "idle": 5})
    b = gpu_trace(parts_ms={"gpu_compute": 60, "data_loading": 2, "other_cpu": 5, "idle": 3})
    c = cmp(run(metrics=(a,)), run(source="runs/b", metrics=(b,)))
    bd = c.breakdown
    assert bd is not None
    rows = {r.component: r for r in bd.rows}
    assert "h2d" not in rows  # zero on both sides
    dl = rows["data_loading"]
    assert dl.a_ns == 30 * MS and dl.b_ns == 2 * MS and dl.delta_ns == -28 * MS
    assert dl.a_pct == pytest.approx(30.0) and dl.b_pct == pytest.approx(2 / 70 * 100, abs=1e-3)
    assert dl.delta_pp == pytest.approx(dl.b_pct - dl.a_pct, abs=1e-3)
    assert (bd.step_mean_a_ns, bd.step_mean_b_ns) == (100 * MS, 70 * MS)
    assert bd.window_a == "5 ProfilerStep windows (#10..#14)"


def test_no_breakdown_without_traces() -> None:
    c = cmp(run(), run(source="runs/b"))
    assert c.breakdown is None
    assert "no step breakdown on side A and B" in c.breakdown_note


# --------------------------------------------------------------------------- findings


def test_findings_fixed_remaining_and_new() -> None:
    ra = report((
        finding("GD201", "dataloader-stall", 38.0, severity=Severity.ERROR),
        finding("GD403", "cudnn-benchmark-off", 6.0),
    ))
    rb = report((
        finding("GD403", "cudnn-benchmark-off", 4.0, severity=Severity.INFO),
        finding("GD102", "host-sync", 7.5),
    ))
    c = cmp(run(), run(source="runs/b"), ra, rb)
    by = {f.code: f for f in c.findings}
    assert by["GD201"].status == FindingStatus.FIXED
    assert by["GD201"].share_a_pct == 38.0 and by["GD201"].share_b_pct is None
    assert by["GD403"].status == FindingStatus.REMAINING
    assert by["GD403"].delta_pp == pytest.approx(-2.0)
    assert (by["GD403"].severity_a, by["GD403"].severity_b) == ("warning", "info")
    assert by["GD102"].status == FindingStatus.NEW
    assert [f.status for f in c.findings] == [FindingStatus.FIXED, FindingStatus.REMAINING, FindingStatus.NEW]
    assert c.findings_summary == "1 fixed (GD201), 1 remaining (GD403), 1 new (GD102)"
    assert "Findings: 1 fixed (GD201)" in c.headline


def test_a_finding_gone_because_b_could_not_be_judged_is_not_called_fixed() -> None:
    ra = report((finding("GD201", "dataloader-stall", 38.0), finding("GD401", "no-amp", 20.0)))
    rb = report(
        (),
        rules_run=("GD401",),  # GD201 did not run on B
        checklist=(not_measurable("GD401", "no GPU in this run"),),
    )
    c = cmp(run(), run(source="runs/b"), ra, rb)
    by = {f.code: f for f in c.findings}
    assert by["GD201"].status == FindingStatus.NOT_JUDGED
    assert "did not run" in by["GD201"].note
    assert by["GD401"].status == FindingStatus.NOT_JUDGED
    assert "no GPU in this run" in by["GD401"].note
    assert "0 fixed" in c.findings_summary and "2 not judged in B" in c.findings_summary


def test_new_finding_that_a_could_not_judge_says_so() -> None:
    ra = report((), rules_run=("GD101",))
    rb = report((finding("GD201", "dataloader-stall", 12.0),))
    c = cmp(run(), run(source="runs/b"), ra, rb)
    (f,) = c.findings
    assert f.status == FindingStatus.NEW
    assert "A could not be judged" in f.note


def test_findings_of_the_same_ranks_are_matched_per_rank_and_internal_errors_left_out() -> None:
    ranks = (gpu_trace(rank=1), gpu_trace(rank=3))
    ra = report((finding("GD603", "straggler", 20.0, rank=3), finding("GD000", "internal-error", None)),
                errors=("rule GD404 unfused-optimizer crashed: KeyError: x",), rules_run=("GD603",))
    rb = report((finding("GD603", "straggler", 15.0, rank=1),), rules_run=("GD603",))
    c = cmp(run(metrics=ranks), run(source="runs/b", metrics=ranks), ra, rb)
    statuses = {(f.code, f.rank): f.status for f in c.findings}
    assert statuses == {("GD603", 3): FindingStatus.FIXED, ("GD603", 1): FindingStatus.NEW}
    assert any("A: rule GD404" in n for n in c.notes)


def test_findings_of_different_ranks_are_matched_by_code() -> None:
    # e.g. rank 3 of one job against rank 1 of another: the same rule is the same problem
    ra = report((finding("GD102", "host-sync", 16.0, rank=3),), rules_run=("GD102",))
    rb = report((finding("GD102", "host-sync", 43.0, rank=1),), rules_run=("GD102",))
    c = cmp(run(metrics=(gpu_trace(rank=3),)), run(source="runs/b", metrics=(gpu_trace(rank=1),)), ra, rb)
    (f,) = c.findings
    assert (f.status, f.rank, f.delta_pp) == (FindingStatus.REMAINING, None, 27.0)
    assert any("matched by rule code across ranks" in n for n in c.notes)


def test_without_reports_findings_are_not_compared() -> None:
    c = cmp(run(), run(source="runs/b"))
    assert not c.findings_compared
    assert c.findings == ()
    assert "Findings" not in c.headline


# --------------------------------------------------------------------------- settings


def test_settings_changes_with_call_sites() -> None:
    site_b = CallSite("/work/train.py", 35, "main")  # the line moved when the fix was written
    sa = settings(
        dataloaders=(loader(num_workers=0, pin_memory=False),),
        optimizers=(OptimizerSetting(CallSite("/work/train.py", 50), "torch.optim.AdamW", None, None, True),),
        flags=(FlagSetting("torch.backends.cudnn.benchmark", False),),
    )
    sb = settings(
        dataloaders=(loader(call_site=site_b, num_workers=4, pin_memory=True, prefetch_factor=4,
                            persistent_workers=True),),
        optimizers=(OptimizerSetting(CallSite("/work/train.py", 54), "torch.optim.AdamW", None, True, True),),
        flags=(FlagSetting("torch.backends.cudnn.benchmark", True, CallSite("/work/train.py", 12)),),
        autocast=(AutocastUse(CallSite("/work/train.py", 70), "cuda", "torch.bfloat16"),),
        wrappers=(WrapSetting("torch.compile", CallSite("/work/train.py", 40), "Net", {"mode": "max-autotune"}),),
    )
    c = cmp(run(), run(source="runs/b"))  # the same settings on both sides
    assert c.settings == ()
    assert "no setting" in c.settings_note
    a = replace(run(), settings=sa)
    b = replace(run(source="runs/b"), settings=sb)
    c = cmp(a, b)
    by = {s.name: s for s in c.settings}
    nw = by["DataLoader(Images).num_workers"]
    assert (nw.a, nw.b) == ("0", "4")
    assert nw.site_a == SITE and nw.site_b == site_b
    assert (by["DataLoader(Images).pin_memory"].a, by["DataLoader(Images).pin_memory"].b) == ("False", "True")
    assert by["DataLoader(Images).prefetch_factor"].b == "4"
    assert by["DataLoader(Images).persistent_workers"].b == "True"
    fused = by["optimizer(AdamW).fused"]
    assert (fused.a, fused.b, fused.site_b.line) == ("None", "True", 54)
    bench = by["torch.backends.cudnn.benchmark"]
    assert (bench.category, bench.a, bench.b, bench.site_b.line) == ("flags", "False", "True", 12)
    amp = by["autocast"]
    assert (amp.category, amp.a, amp.b) == ("AMP", "absent", "cuda torch.bfloat16")
    comp = by["torch.compile"]
    assert comp.a == "absent" and "max-autotune" in comp.b and comp.site_b.line == 40


def test_dataloaders_added_and_removed() -> None:
    sa = settings(dataloaders=(loader(dataset="Train"), loader(dataset="Eval", call_site=CallSite("/work/train.py", 90))))
    sb = settings(dataloaders=(loader(dataset="Train"),))
    c = cmp(replace(run(), settings=sa), replace(run(source="runs/b"), settings=sb))
    (s,) = c.settings
    assert s.name == "DataLoader(Eval)"
    assert s.b == "absent" and "num_workers=0" in s.a


def test_env_and_threads_changes() -> None:
    sa = settings(env={"OMP_NUM_THREADS": "1"}, num_threads=1)
    sb = settings(env={}, num_threads=8)
    c = cmp(replace(run(), settings=sa), replace(run(source="runs/b"), settings=sb))
    by = {s.name: s for s in c.settings}
    assert (by["OMP_NUM_THREADS"].a, by["OMP_NUM_THREADS"].b) == ("1", "unset")
    assert (by["torch.get_num_threads()"].a, by["torch.get_num_threads()"].b) == ("1", "8")


# --------------------------------------------------------------------------- warnings


def test_same_script_and_arguments_give_no_warning() -> None:
    c = cmp(run(), run(source="runs/b"))
    assert c.warnings == ()


def test_different_scripts_arguments_devices_and_machines_are_warned() -> None:
    from gpudoctor.model import Device

    b = run(source="runs/b", manifest_kw={
        "script": "/work/other.py", "argv": ("/work/other.py", "--epochs", "2"), "hostname": "other-box",
        "devices": (Device(0, "NVIDIA H100 80GB HBM3", 80 * 10**9, "9.0"),), "versions": {"torch": "2.14.0"},
    })
    c = cmp(run(), b)
    text = " | ".join(c.warnings)
    assert "different scripts" in text and "/work/other.py" in text
    assert "different script arguments" in text and "--epochs 2" in text
    assert "different machines" in text
    assert "different devices" in text and "H100" in text
    assert "different PyTorch versions" in text


def test_same_path_twice_is_warned() -> None:
    c = cmp(run(source="runs/a"), run(source="runs/a"))
    assert any("same path" in w for w in c.warnings)


def test_unfinished_run_is_warned() -> None:
    from gpudoctor.model import RunStatus

    c = cmp(run(), run(source="runs/b", manifest_kw={"status": RunStatus.FAILED, "status_detail": "RuntimeError"}))
    assert any("run B did not finish (failed: RuntimeError)" in w for w in c.warnings)


# --------------------------------------------------------------------------- model


def test_comparison_round_trips_through_its_dict() -> None:
    ra = report((finding("GD201", "dataloader-stall", 38.0),))
    rb = report(())
    c = cmp(run(metrics=(gpu_trace(),)), run(source="runs/b", wall_ms=50, metrics=(gpu_trace(idle_steps_pct=5),)), ra, rb)
    assert Comparison.from_dict(c.to_dict()) == c


def test_deterministic() -> None:
    a, b = run(jitter_pct=20), run(source="runs/b", jitter_pct=20, seed=9, wall_ms=90)
    assert cmp(a, b) == cmp(a, b)


def test_bad_parameters_are_refused() -> None:
    with pytest.raises(ValueError):
        cmp(run(), run(), min_steps=1)
    with pytest.raises(ValueError):
        cmp(run(), run(), confidence_pct=100)


def test_a_run_that_settles_is_compared_from_its_settled_steps() -> None:
    """A's loop ran its first 15 steps at 400 ms and settled at 100 ms (model/settle.py): its steady steps, and
    so the comparison, start at step 15, and a note says so; B, steady at 50 ms, is compared whole."""
    slow = step_records(15, 400.0, seed=3)
    settled = tuple(dataclasses.replace(s, index=s.index + 15) for s in step_records(25, 100.0, seed=4, first_ms=None))
    c = cmp(run(steps=slow + settled), run(source="runs/b", wall_ms=50, seed=2))
    assert c.step_time.a.count == 25 and c.step_time.b.count == 39
    assert 95 * MS < c.step_time.a.median_ns < 105 * MS
    assert c.step_time.verdict == StepTimeVerdict.FASTER and 1.8 < c.step_time.speedup < 2.2
    assert any(n.startswith("A's step time changed: steps 1–14 ran 39") and "settled at step 15" in n for n in c.notes)
    assert not any(n.startswith("B's step time changed") for n in c.notes)
