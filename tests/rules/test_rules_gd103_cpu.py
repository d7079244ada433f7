"""GD103 on CPU runs (dispatch-bound): per-op overhead from ``TraceMetrics.dispatch``."""

from __future__ import annotations

import dataclasses

from rule_builders import (
    MS,
    cpu_manifest,
    cpu_trace,
    dataloader,
    gpu_samples,
    judge,
    manifest,
    run,
    settings,
    trace,
)

from gpudoctor.model import DispatchStats, NameStat, Samples, Severity, WindowKind, WrapSetting
from gpudoctor.model.findings import Confidence
from gpudoctor.rules.results import Verdict

US = 1000


def dispatch(**kw) -> DispatchStats:
    """A dispatch-bound typical step like the planted sample's: 7.2 ms, 85% per-op overhead."""
    base = dict(
        window=WindowKind.STEPS, steps=5, thread="10/10", aligned=True, ops_per_step=3596.0,
        top_level_ops_per_step=940.0, op_self_median_ns=460, op_ns=4_300 * US, short_op_ns=3_340 * US,
        short_op_time_pct=77.7, glue_ns=2_820 * US, long_gap_ns=0, dataloader_ns=110 * US,
        typical_step_ns=7_230 * US, dispatch_ns=6_160 * US, dispatch_pct=85.2, step_median_ns=7_500 * US,
        top_short_ops=(NameStat("aten::mm", 48, 301 * US), NameStat("aten::add_", 169, 242 * US)),
    )
    base.update(kw)
    return DispatchStats(**base)


def cpu_run(d: DispatchStats | None, *, bs: int | None = 4, optimizer_steps: int | None = 5,
            measured_pct: float | None = None, **settings_kw):
    """A CPU run whose ledger charges ``measured_pct`` (default: the typical step's share) of the
    measured steps to per-op overhead, as ``analysis.ledger`` would from the same steps."""
    share = measured_pct if measured_pct is not None else (d.dispatch_pct if d is not None else 0.0)
    m = cpu_trace(dispatch=d, optimizer_steps=optimizer_steps, backward_ops=None,
                  breakdown_mean_pct={"launch_overhead": share, "cpu_compute": 100.0 - share})
    dls = (dataloader(batch_size=bs),) if bs is not None else ()
    return run(manifest=cpu_manifest(), metrics=(m,),
               settings=settings(device_type="cpu", dataloaders=dls, **settings_kw))


def test_fires_when_per_op_overhead_dominates_the_step():
    res = judge("GD103", cpu_run(dispatch()))
    assert res.verdict == Verdict.FIRED
    (f,) = res.findings
    assert f.severity == Severity.ERROR and f.confidence == Confidence.MEASURED
    assert f.gain.share_pct == 85.2
    assert "dispatch-bound (CPU)" in f.message and "85.2% of a typical step (7.23 ms)" in f.message
    assert "3,596 ops per step, 899 per sample (batch_size=4)" in f.message
    assert f.location is not None and f.location.line == 31  # the DataLoader call site
    # 85% overhead → a quarter needs 0.852·0.75 / (0.148·0.25) ≈ 17× → 32×, batch 128
    assert "batch_size=4 now; 128 would" in f.fix.instruction and "learning rate" in f.fix.instruction
    assert "batch_size=4" in f.fix.before and "batch_size=128" in f.fix.after
    assert "torch.compile" in f.fix.after
    names = {x.name: x.value for x in f.evidence.metrics}
    assert names["ops_per_sample"] == 899.0 and names["dispatch_overhead_pct"] == 85.2
    assert any("aten::mm ×48" in n for n in f.evidence.notes)
    assert not any("waited for a CPU" in n for n in f.evidence.notes)  # 7.5 ms vs 7.23 ms: undisturbed
    assert f.evidence.time_ranges and "ProfilerStep#" in f.evidence.time_ranges[0].label
    assert any(s.name == "DataLoader.batch_size" and s.value == 4 for s in f.evidence.settings)


def test_disturbed_steps_are_named_the_typical_step_decides_and_the_measured_share_is_claimed():
    # stalls of a loaded machine stretch the measured steps: the overhead is 85% of the typical step
    # (the firing test) but 40% of the steps as measured, the share of step time the finding claims
    (f,) = judge("GD103", cpu_run(dispatch(step_median_ns=48 * MS), measured_pct=40.0)).findings
    assert f.gain.share_pct == 40.0 and [c.component for c in f.gain.claims] == ["launch_overhead", "optimizer"]
    assert "85.2% of a typical step" in f.message and "40.0% of the measured step time" in f.message
    assert any("6.6× the typical step" in n and "waited for a CPU" in n for n in f.evidence.notes)


def test_a_larger_batch_also_shares_the_optimizer_step_on_a_cpu():
    m = cpu_trace(dispatch=dispatch(), optimizer_steps=5, backward_ops=None,
                  breakdown_mean_pct={"launch_overhead": 30.0, "optimizer": 25.0, "cpu_compute": 45.0})
    data = run(manifest=cpu_manifest(), metrics=(m,), settings=settings(device_type="cpu", dataloaders=(dataloader(batch_size=4),)))
    (f,) = judge("GD103", data).findings
    assert f.gain.share_pct == 55.0 and "with the optimizer's step, 55.0% of the measured step time" in f.message


def test_fine_when_few_ops_per_sample():
    # the evaluation sample: 60% overhead, but 2,829 ops per step at batch 128 are 22 per sample
    d = dispatch(ops_per_step=2829.0, short_op_time_pct=41.0, dispatch_pct=60.0)
    res = judge("GD103", cpu_run(d, bs=128))
    assert res.verdict == Verdict.FINE and not res.findings
    assert "60.0% of a typical step" in res.reason
    assert "only 22.1 ops (2,829 per step at batch_size=128; threshold 100)" in res.reason


def test_fine_when_the_step_goes_elsewhere():
    # short ops, but most of the step is Python work between them (tokenization in the loop)
    d = dispatch(short_op_time_pct=80.0, dispatch_pct=3.0, op_ns=20 * MS, short_op_ns=16 * MS,
                 glue_ns=2 * MS, long_gap_ns=117 * MS, dataloader_ns=1 * MS, typical_step_ns=140 * MS)
    res = judge("GD103", cpu_run(d))
    assert res.verdict == Verdict.FINE
    assert "is 3.0% of a typical profiled step (140.00 ms in the trace; threshold 50%)" in res.reason
    assert "ops of 10.0 µs or more 2.9%, Python gaps over 1.00 ms 83.6%, DataLoader ranges 0.7%" in res.reason
    # the trace's part of its typical step is not named as the summary's "waiting for data" of every step
    assert "the DataLoader 0.7%" not in res.reason


def test_one_profiled_step_clears_nothing_but_can_still_fire():
    """A run stopped inside its only window: a step read once is an accident, not the loop's habit."""
    quiet = dict(short_op_time_pct=80.0, dispatch_pct=3.0, op_ns=20 * MS, short_op_ns=16 * MS,
                 glue_ns=2 * MS, long_gap_ns=117 * MS, dataloader_ns=1 * MS, typical_step_ns=140 * MS)
    res = judge("GD103", cpu_run(dispatch(steps=1, **quiet)))
    assert res.verdict == Verdict.CANNOT_JUDGE
    assert res.reason.startswith("not measurable: the trace holds 1 profiled step") and "3.0% of a typical" in res.reason
    assert judge("GD103", cpu_run(dispatch(steps=1))).verdict == Verdict.FIRED


def test_without_a_batch_size_short_ops_decide_and_the_finding_is_inferred():
    (f,) = judge("GD103", cpu_run(dispatch(), bs=None)).findings
    assert f.confidence == Confidence.INFERRED
    assert "per sample" not in f.message and "raise the batch size" in f.fix.instruction
    assert f.location is None
    res = judge("GD103", cpu_run(dispatch(short_op_time_pct=41.0), bs=None))
    assert res.verdict == Verdict.FINE
    assert "41.0% of op time is in ops under 10.0 µs (threshold 50%; the batch size is unknown)" in res.reason


def test_thresholds_are_read_from_the_config():
    d = dispatch(ops_per_step=2829.0, dispatch_pct=60.0)
    assert judge("GD103", cpu_run(d, bs=128), dispatch_ops_per_sample_count=20.0).verdict == Verdict.FIRED
    assert judge("GD103", cpu_run(dispatch()), dispatch_share_pct=90.0).verdict == Verdict.FINE
    assert judge("GD103", cpu_run(dispatch(), bs=None), dispatch_short_op_time_pct=80.0).verdict == Verdict.FINE


def test_warning_below_the_error_share():
    (f,) = judge("GD103", cpu_run(dispatch(dispatch_pct=15.0)), dispatch_share_pct=10.0).findings
    assert f.severity == Severity.WARNING


def test_cannot_judge_without_ops_in_the_steps():
    res = judge("GD103", cpu_run(None))
    assert res.verdict == Verdict.CANNOT_JUDGE and "no CPU ops" in res.reason
    res = judge("GD103", run(manifest=cpu_manifest(), metrics=(), settings=settings(device_type="cpu")))
    assert res.verdict == Verdict.CANNOT_JUDGE and res.reason == "no trace in this run"


def test_inference_and_compiled_models_get_their_own_fix():
    (f,) = judge("GD103", cpu_run(dispatch(), optimizer_steps=0)).findings
    assert "evaluate with fewer, larger ops" in f.fix.instruction and "learning rate" not in f.fix.instruction
    compiled = (WrapSetting("torch.compile", None, "Net", {"mode": "default"}),)
    (f,) = judge("GD103", cpu_run(dispatch(), wrappers=compiled)).findings
    assert "already compiled" in f.fix.instruction and "torch.compile" not in f.fix.after
    assert any(s.name == "torch.compile" for s in f.evidence.settings)


def test_the_suggested_batch_follows_the_overhead():
    (f,) = judge("GD103", cpu_run(dispatch(dispatch_pct=76.0), bs=8)).findings
    assert "batch_size=128" in f.fix.after  # 0.76·0.75 / (0.24·0.25) = 9.5 → 16× (a power of two)
    (f,) = judge("GD103", cpu_run(dispatch(dispatch_pct=99.9), bs=8)).findings
    assert "batch_size=512" in f.fix.after  # capped at 64×


def test_gpu_runs_keep_the_launch_bound_branch():
    m = dataclasses.replace(trace(), dispatch=dispatch())  # host figures do not decide on a GPU
    res = judge("GD103", run(metrics=(m,)))
    assert res.verdict == Verdict.FINE and "launch and dispatch overhead idles the GPU" in res.reason


def test_a_cpu_run_on_a_machine_with_a_gpu_is_judged_on_the_cpu():
    m = cpu_trace(dispatch=dispatch(), optimizer_steps=5)
    data = run(manifest=manifest(), metrics=(m,), samples=Samples(gpu=gpu_samples(0.0, 10**9)),
               settings=settings(device_type="cpu", dataloaders=(dataloader(batch_size=4),)))
    assert judge("GD103", data).verdict == Verdict.FIRED
    gpu_run = dataclasses.replace(data, settings=settings(device_type="cuda"))  # a CUDA run, no kernels traced
    assert judge("GD103", gpu_run).verdict == Verdict.CANNOT_JUDGE
