"""``gpudoctor compare``: the headline figures side by side and the step breakdown (``analysis.compare``).

Data-wait share (of the steps the step times are compared on), GPU idle (the same window on
both sides, never one of each), host-sync share, throughput, NVML utilization, and the
ledger's parts of the primary traces side by side.
"""

from __future__ import annotations

import statistics

from gpudoctor.analysis.compare.steps import StepBasis
from gpudoctor.model.compare import (
    BreakdownChange,
    ComponentChange,
    MetricChange,
    StepTimeChange,
)
from gpudoctor.model.findings import RunData
from gpudoctor.model.metrics import Component, TraceMetrics, WindowKind
from gpudoctor.model.selectors import busiest_device, primary_trace
from gpudoctor.model.steady import data_wait_share_pct

PCT_TOLERANCE_PP = 0.5  # a share that moved less than this is "no change" (percentage points)


def _metric(
    key: str,
    label: str,
    unit: str,
    a: float | None,
    b: float | None,
    window_a: str,
    window_b: str,
    *,
    lower_is_better: bool,
    tolerance: float,
    note: str = "",
) -> MetricChange:
    a = None if a is None else round(a, 3)
    b = None if b is None else round(b, 3)
    delta = improved = None
    if a is not None and b is not None:
        delta = round(b - a, 3)  # of the values as shown
        if abs(delta) >= tolerance:
            improved = (delta < 0) if lower_is_better else (delta > 0)
    return MetricChange(
        key=key,
        label=label,
        unit=unit,
        a=a,
        b=b,
        delta=delta,
        delta_unit="pp" if unit == "%" else unit,
        window_a=window_a,
        window_b=window_b,
        improved=improved,
        note=note,
    )


def _data_wait(basis: StepBasis, run_a: RunData, run_b: RunData) -> MetricChange | None:
    label = "waiting for data"
    if basis.kind in ("plain_steps", "steady_steps"):
        return _metric(
            "data_wait_share", label, "%", data_wait_share_pct(basis.steps_a), data_wait_share_pct(basis.steps_b),
            basis.window_a, basis.window_b, lower_is_better=True, tolerance=PCT_TOLERANCE_PP,
        )
    ma, mb = primary_trace(run_a.metrics), primary_trace(run_b.metrics)
    ca = ma.cpu if ma is not None else None
    cb = mb.cpu if mb is not None else None
    if ca is None and cb is None:
        return None
    note = "" if ca is not None and cb is not None else (
        f"no DataLoader figures on side {'A' if ca is None else 'B'} (no per-step records and no CPU side in its trace)"
    )
    return _metric(
        "data_wait_share", label + " (DataLoader share of the trace window)", "%",
        ca.dataloader_pct if ca is not None else None,
        cb.dataloader_pct if cb is not None else None,
        ca.window.description if ca is not None else "",
        cb.window.description if cb is not None else "",
        lower_is_better=True, tolerance=PCT_TOLERANCE_PP, note=note,
    )


def _gpu_idle(run_a: RunData, run_b: RunData) -> MetricChange | None:
    ma, mb = primary_trace(run_a.metrics), primary_trace(run_b.metrics)
    ua, ub = busiest_device(ma), busiest_device(mb)
    if ua is None and ub is None:
        return None  # no GPU activity on either side (CPU runs): nothing to compare, said in the notes
    if ua is None or ub is None:
        side = "A" if ua is None else "B"
        return _metric("gpu_idle", "GPU idle", "%", None, None, "", "", lower_is_better=True, tolerance=PCT_TOLERANCE_PP,
                       note=f"no GPU activity in side {side}'s trace: GPU idle cannot be compared")
    if ua.idle_pct_steps is not None and ub.idle_pct_steps is not None and ua.steps_window and ub.steps_window:
        assert ma is not None and mb is not None
        wa, wb = _steps_text(ma), _steps_text(mb)
        note = ""
        if [s.step for s in ma.steps] != [s.step for s in mb.steps]:
            note = "the runs profiled different steps: each percentage is of its own run's ProfilerStep windows"
        return _metric("gpu_idle", "GPU idle (ProfilerStep windows)", "%", ua.idle_pct_steps, ub.idle_pct_steps,
                       wa, wb, lower_is_better=True, tolerance=PCT_TOLERANCE_PP, note=note)
    without = [s for s, u in (("A", ua), ("B", ub)) if u.idle_pct_steps is None]
    note = (
        f"side {' and '.join(without)} has no ProfilerStep markers: GPU idle is compared over the first-to-last "
        "GPU activity span on both sides"
        if len(without) == 1
        else ""
    )
    return _metric("gpu_idle", "GPU idle (first to last GPU activity)", "%", ua.idle_pct_span, ub.idle_pct_span,
                   ua.span.description or WindowKind.SPAN.value, ub.span.description or WindowKind.SPAN.value,
                   lower_is_better=True, tolerance=PCT_TOLERANCE_PP, note=note)


def _host_sync(run_a: RunData, run_b: RunData) -> MetricChange | None:
    ma, mb = primary_trace(run_a.metrics), primary_trace(run_b.metrics)
    if ma is None or mb is None or not (ma.has_gpu_activity or mb.has_gpu_activity):
        return None
    sa = ma.syncs.share_of_steps_pct if ma.syncs is not None else None
    sb = mb.syncs.share_of_steps_pct if mb.syncs is not None else None
    if sa is None and sb is None:
        return None

    note = ""
    if (ma.step_source == "ProfilerStep") != (mb.step_source == "ProfilerStep"):
        note = "one trace has ProfilerStep markers and the other not: the windows differ"
    return _metric("host_sync_share", "host blocked in syncs", "%", sa, sb, _steps_text(ma), _steps_text(mb),
                   lower_is_better=True, tolerance=PCT_TOLERANCE_PP, note=note)


def _throughput(step: StepTimeChange) -> MetricChange | None:
    if step.a is None or step.b is None or not step.batch_size_a or not step.batch_size_b:
        return None
    if step.a.median_ns <= 0 or step.b.median_ns <= 0:
        return None
    a = step.batch_size_a * 1e9 / step.a.median_ns
    b = step.batch_size_b * 1e9 / step.b.median_ns
    return _metric(
        "throughput", "throughput (batch size / median step)", "samples/s", a, b,
        f"batch size {step.batch_size_a}, {step.a.window}", f"batch size {step.batch_size_b}, {step.b.window}",
        lower_is_better=False, tolerance=max(a, b) * step.min_change_pct / 100.0,
    )


def _nvml(run_a: RunData, run_b: RunData) -> MetricChange | None:
    def med(run: RunData) -> float | None:
        vals = [g.util_pct for g in (run.samples.gpu if run.samples else ()) if g.util_pct is not None]
        return statistics.median(vals) if vals else None

    a, b = med(run_a), med(run_b)
    if a is None and b is None:
        return None
    note = "" if a is not None and b is not None else f"no NVML samples on side {'A' if a is None else 'B'}"
    return _metric("gpu_util_nvml", "GPU utilization, NVML (median)", "%", a, b,
                   "NVML samples over the run" if a is not None else "",
                   "NVML samples over the run" if b is not None else "",
                   lower_is_better=False, tolerance=PCT_TOLERANCE_PP, note=note)


def headline_metrics(basis: StepBasis, step: StepTimeChange, run_a: RunData, run_b: RunData) -> list[MetricChange]:
    """The figures beside the step time, those both runs (or one) have: data wait, GPU idle, host
    syncs, throughput, NVML utilization."""
    return [
        m
        for m in (
            _data_wait(basis, run_a, run_b),
            _gpu_idle(run_a, run_b),
            _host_sync(run_a, run_b),
            _throughput(step),
            _nvml(run_a, run_b),
        )
        if m is not None
    ]


# --------------------------------------------------------------------------- breakdown


def _steps_text(m: TraceMetrics) -> str:
    """The window a trace's step percentages are of, in words."""
    if m.step_source != "ProfilerStep" or not m.steps:
        return m.ledger.window if m.ledger is not None else "the whole trace (no ProfilerStep markers)"
    nums = [s.step for s in m.steps]
    if len(nums) == 1:
        return f"1 ProfilerStep window (#{nums[0]})"
    return f"{len(nums)} ProfilerStep windows (#{min(nums)}..#{max(nums)})"


def breakdown_change(run_a: RunData, run_b: RunData) -> tuple[BreakdownChange | None, str]:
    ma, mb = primary_trace(run_a.metrics), primary_trace(run_b.metrics)
    missing = [s for s, m in (("A", ma), ("B", mb)) if m is None or not m.breakdown_mean_pct]
    if missing:
        return None, f"no step breakdown on side {' and '.join(missing)} (no trace)"
    assert ma is not None and mb is not None
    notes: list[str] = []
    same_kind = (ma.step_source == "ProfilerStep") == (mb.step_source == "ProfilerStep")
    if not same_kind:
        notes.append(
            "one trace has ProfilerStep markers and the other not: shares are comparable, time per step is not shown"
        )
    if ma.has_gpu_activity != mb.has_gpu_activity:
        notes.append(f"only {'A' if ma.has_gpu_activity else 'B'}'s trace has GPU activity")

    def per_step(m: TraceMetrics, key: str) -> int | None:
        if not same_kind or m.step_source != "ProfilerStep" or not m.breakdown:
            return None
        return int(sum(b.parts_ns.get(key, 0) for b in m.breakdown) / len(m.breakdown))

    keys = [c.value for c in Component if c.value in ma.breakdown_mean_pct or c.value in mb.breakdown_mean_pct]
    keys += sorted(k for k in {*ma.breakdown_mean_pct, *mb.breakdown_mean_pct} if k not in keys)
    rows = []
    for k in keys:
        pa, pb = ma.breakdown_mean_pct.get(k), mb.breakdown_mean_pct.get(k)
        if not pa and not pb:
            continue  # nothing on either side (the GPU components of two CPU runs)
        na, nb = per_step(ma, k), per_step(mb, k)
        rows.append(ComponentChange(
            component=k,
            a_pct=pa,
            b_pct=pb,
            delta_pp=round(pb - pa, 3) if pa is not None and pb is not None else None,
            a_ns=na,
            b_ns=nb,
            delta_ns=nb - na if na is not None and nb is not None else None,
        ))

    def mean_step(m: TraceMetrics) -> int | None:
        if not same_kind or m.step_source != "ProfilerStep" or not m.breakdown:
            return None
        return int(sum(b.dur_ns for b in m.breakdown) / len(m.breakdown))

    return BreakdownChange(
        rows=tuple(rows),
        window_a=_steps_text(ma),
        window_b=_steps_text(mb),
        steps_a=len(ma.breakdown),
        steps_b=len(mb.breakdown),
        step_mean_a_ns=mean_step(ma),
        step_mean_b_ns=mean_step(mb),
        notes=tuple(notes),
    ), ""
